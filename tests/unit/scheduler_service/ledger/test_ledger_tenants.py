"""Tenants in the ledger and the admission queue: quotas, priorities, aging and fair shares."""

from __future__ import annotations

from dataclasses import replace

from scheduler_service import convert
from scheduler_service.ledger import tenants
from scheduler_service.ledger.ledger import (
    AdmissionRequest,
    CapLimit,
    Cause,
    Decision,
    Ledger,
    WorkerGeometry,
)
from scheduler_service.ledger.queue import AdmissionQueue, Ticket

BPT = 10
CAPACITY_TOKENS = 1_000  # 10,000 bytes

TABLE = """
[tenants.small]
quota = "30%"
weight = 1

[tenants.large]
quota = "70%"
weight = 3

[tenants.free]
"""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def setup(table: str = TABLE, aging_s: float = 1_000.0):
    clock = Clock()
    ledger = Ledger(clock=clock, lease_ttl_s=1e9, claim_ttl_s=1e9)
    ledger.register(WorkerGeometry(worker_id="w1", address="w1:1", model="m", context_length=4_096,
                                   bytes_per_token=BPT, capacity_bytes=CAPACITY_TOKENS * BPT))
    ledger.set_tenants(tenants.parse(table, "t.toml"))
    queue = AdmissionQueue(ledger, max_length=64, max_wait_s=1e6, clock=clock, aging_s=aging_s)
    return ledger, queue, clock


def req(name, tenant, prompt=50, max_new=50, min_new=1, strict=False, priority=0):
    return AdmissionRequest(name, prompt_tokens=prompt, max_new_tokens=max_new,
                            min_new_tokens=min_new, strict=strict, model="m", tenant=tenant,
                            priority=priority)


def held(ledger, tenant):
    return ledger.tenant_reserved().get((tenant, "m"), 0)


def test_a_request_beyond_its_tenants_room_is_capped_to_it_and_the_cap_says_so():
    ledger, _, _ = setup()
    first = ledger.admit(req("a", "small", prompt=100, max_new=100))  # 2,000 of 3,000
    assert first.decision is Decision.ADMITTED
    capped = ledger.admit(req("b", "small", prompt=50, max_new=200))  # wants 2,500; room 1,000
    assert capped.decision is Decision.CAPPED and capped.max_new_tokens == 50
    cap = capped.budget_cap
    assert cap.limit is CapLimit.TENANT_QUOTA and cap.tenant == "small"
    assert (cap.tenant_quota_bytes, cap.tenant_reserved_bytes, cap.available_bytes) == (3_000, 2_000, 1_000)
    assert "tenant 'small' holds 2.0 KiB of its 2.9 KiB quota" in cap.reason
    assert held(ledger, "small") == 3_000  # exactly its quota, never more


def test_the_pool_still_caps_as_before_when_the_tenants_room_is_larger():
    ledger, _, _ = setup()
    ledger.admit(req("x", "free", prompt=400, max_new=400))  # 8,000 of 10,000: no quota
    capped = ledger.admit(req("a", "large", prompt=100, max_new=400))  # room 7,000, pool 2,000
    assert capped.decision is Decision.CAPPED
    assert capped.budget_cap.limit is CapLimit.WORKER and capped.budget_cap.tenant == ""


def test_strict_over_the_tenants_room_is_rejected_tenant_quota_with_its_numbers():
    ledger, _, _ = setup()
    ledger.admit(req("a", "small", prompt=100, max_new=100))
    refused = ledger.admit(req("b", "small", prompt=50, max_new=200, strict=True))
    r = refused.rejection
    assert refused.decision is Decision.REJECTED and r.cause is Cause.TENANT_QUOTA
    assert (r.tenant, r.tenant_quota_bytes, r.tenant_reserved_bytes) == ("small", 3_000, 2_000)
    assert r.cap_refused and r.needed_bytes == 2_500 and r.waits_for_tenant_room
    assert r.retry_after_s > 0 and "retry in" in r.remedy and "raise the tenant's quota" in r.remedy


def test_a_floor_beyond_the_whole_quota_is_rejected_without_a_retry_and_says_what_fits():
    ledger, _, _ = setup()
    refused = ledger.admit(req("a", "small", prompt=200, max_new=400, min_new=200))  # 4,000 > 3,000
    r = refused.rejection
    assert r.cause is Cause.TENANT_QUOTA and not r.waits_for_tenant_room
    assert r.retry_after_s == 0 and r.admissible_max_new_tokens == 100
    assert "more than its whole quota" in r.message and "max_new_tokens <= 100" in r.remedy


def test_a_busy_pool_is_still_budget_busy_whatever_the_tenant():
    ledger, _, _ = setup()
    ledger.admit(req("x", "free", prompt=500, max_new=500))  # the whole pool
    refused = ledger.admit(req("a", "small", prompt=50, max_new=50))
    assert refused.rejection.cause is Cause.BUDGET_BUSY


def test_a_tenant_at_its_quota_waits_while_another_tenants_newcomer_goes_ahead():
    ledger, queue, _ = setup()
    full = queue.submit(req("a", "small", prompt=150, max_new=150))  # its 3,000
    waiting = queue.submit(req("b", "small", prompt=50, max_new=50))
    assert isinstance(waiting, Ticket)
    newcomer = queue.submit(req("c", "large", prompt=50, max_new=50))
    assert isinstance(newcomer, Ticket)  # the queue is not empty: it joins, the pump places it
    assert queue.pump() == [newcomer] and newcomer.outcome.decision is Decision.ADMITTED
    assert waiting.outcome is None
    ledger.release(full.lease.lease_id)
    assert queue.pump() == [waiting] and waiting.outcome.decision is Decision.ADMITTED


def test_the_queue_serves_lower_priority_numbers_first_then_arrival():
    ledger, queue, _ = setup()
    hold = queue.submit(req("hold", "free", prompt=500, max_new=500))
    lows = [queue.submit(req(f"low{i}", "free", priority=5)) for i in range(5)]
    high = queue.submit(req("high", "free", priority=-1))
    assert queue.place(high).position == 1 and queue.place(lows[0]).position == 2
    ledger.release(hold.lease.lease_id)
    ledger.admit(req("refill", "free", prompt=450, max_new=450))  # room for one (1,000 bytes)
    assert queue.pump() == [high]
    assert all(t.outcome is None for t in lows)


def test_a_request_that_waited_the_aging_bound_goes_ahead_of_every_priority():
    ledger, queue, clock = setup(aging_s=5.0)
    hold = queue.submit(req("hold", "free", prompt=500, max_new=500))
    low = queue.submit(req("low", "free", priority=100))
    clock.now += 6.0  # low has aged
    high = queue.submit(req("high", "free", priority=-100))
    assert queue.place(low).position == 1
    ledger.release(hold.lease.lease_id)
    ledger.admit(req("refill", "free", prompt=450, max_new=450))  # room for one
    assert queue.pump() == [low] and high.outcome is None


def test_room_that_frees_goes_to_the_tenant_holding_least_per_unit_of_weight():
    table = TABLE.replace('quota = "30%"', 'quota = "100%"').replace('quota = "70%"', 'quota = "100%"')
    ledger, queue, _ = setup(table)
    s1 = queue.submit(req("s1", "small", prompt=100, max_new=100))  # small holds 2,000
    l1 = queue.submit(req("l1", "large", prompt=200, max_new=200))  # large holds 4,000
    l2 = queue.submit(req("l2", "large", prompt=100, max_new=100))  # large 6,000: pool 8,000
    hold = queue.submit(req("hold", "free", prompt=100, max_new=100))  # pool full
    assert all(a.decision is Decision.ADMITTED for a in (s1, l1, l2, hold))
    # Both wait; large came first and asks the same. small holds 2,000 / 1, large 6,000 / 3.
    large_waits = queue.submit(req("lw", "large", prompt=50, max_new=50))
    small_waits = queue.submit(req("sw", "small", prompt=50, max_new=50))
    assert isinstance(large_waits, Ticket) and isinstance(small_waits, Ticket)
    ledger.release(l1.lease.lease_id)  # large now 2,000 / 3 < small's 2,000 / 1
    ledger.admit(req("refill", "free", prompt=150, max_new=150))  # room for one of them
    assert queue.pump() == [large_waits]
    ledger.release(l2.lease.lease_id)  # large 3,000 / 3 = 1,000 < small 2,000: still large's turn
    later_large = queue.submit(req("lw2", "large", prompt=50, max_new=50))
    ledger.admit(req("refill2", "free", prompt=50, max_new=50))  # room for one
    assert queue.pump() == [later_large] and small_waits.outcome is None


def test_a_session_turn_counts_against_the_tenant_that_opened_it():
    ledger, _, _ = setup()
    lease = ledger.open_session_lease("s", "m", tenant="small")
    ledger.admit(req("a", "small", prompt=100, max_new=50))  # 1,500 of 3,000
    turn = ledger.resize(lease.lease_id, req("t1", "", prompt=100, max_new=200))
    assert turn.decision is Decision.CAPPED and turn.budget_cap.limit is CapLimit.TENANT_QUOTA
    assert turn.lease.reserved_bytes == 1_500 and held(ledger, "small") == 3_000
    again = ledger.resize(lease.lease_id, req("t2", "", prompt=100, max_new=50))  # its own bytes
    assert again.decision is Decision.ADMITTED and held(ledger, "small") == 3_000


def test_a_lowered_quota_admits_nothing_more_until_the_tenant_is_under_it_and_preempts_nothing():
    ledger, _, _ = setup()
    kept = ledger.admit(req("a", "small", prompt=100, max_new=100))  # 2,000
    ledger.set_tenants(tenants.parse(TABLE.replace('"30%"', '"10%"'), "t.toml"))
    assert ledger.lease(kept.lease.lease_id) is not None
    refused = ledger.admit(req("b", "small", prompt=5, max_new=5))
    assert refused.rejection.cause is Cause.TENANT_QUOTA
    assert refused.rejection.tenant_reserved_bytes == 2_000
    ledger.release(kept.lease.lease_id)
    assert ledger.admit(req("c", "small", prompt=50, max_new=50)).decision is Decision.ADMITTED


def test_tenant_usage_lists_every_tenant_with_quota_weight_and_what_it_holds():
    ledger, queue, _ = setup()
    queue.submit(req("a", "small", prompt=150, max_new=150))
    queue.submit(req("b", "small"))
    rows = {u.tenant: u for u in ledger.tenant_usage()}
    assert set(rows) == {"small", "large", "free"}
    assert (rows["small"].reserved_bytes, rows["small"].quota_bytes, rows["small"].leases) == (3_000, 3_000, 1)
    assert rows["large"].quota_bytes == 7_000 and rows["large"].weight == 3
    assert rows["free"].quota_bytes is None
    assert queue.tenant_stats()[("small", "m")].length == 1


def test_without_tenants_nothing_changes():
    ledger, queue, _ = setup(table="")
    first = ledger.admit(replace(req("a", "", prompt=400, max_new=600), tenant=""))
    assert first.decision is Decision.ADMITTED and ledger.tenant_usage()[0].tenant == ""


def test_a_tenant_flooding_the_queue_leaves_the_other_tenants_share_of_places():
    ledger, queue, _ = setup()
    queue.max_length = 12  # weights 1 (small), 3 (large), 1 (free), 1 (no tenant): 2, 6, 2, 2
    queue.submit(req("hold", "free", prompt=500, max_new=500))  # the pool is full
    flood = [queue.submit(req(f"l{i}", "large")) for i in range(8)]
    assert [isinstance(t, Ticket) for t in flood] == [True] * 6 + [False] * 2
    refused = flood[-1].rejection
    assert refused.cause is Cause.QUEUE_FULL and refused.tenant == "large"
    assert (refused.queue_length, refused.max_queue_length) == (6, 6)
    assert "kept for other tenants' shares" in refused.message
    for name, tenant in (("s1", "small"), ("s2", "small"), ("f", "free"), ("n1", ""), ("n2", "")):
        assert isinstance(queue.submit(req(name, tenant)), Ticket)  # its places were kept
    assert isinstance(queue.submit(req("f2", "free")), Ticket)
    assert queue.submit(req("s3", "small")).rejection.cause is Cause.QUEUE_FULL  # the queue is full


def test_the_metrics_show_each_tenants_bytes_quota_queue_and_decisions():
    from prometheus_client import CollectorRegistry, generate_latest

    from scheduler_service.metrics import SchedulerMetrics

    ledger, queue, _ = setup()
    registry = CollectorRegistry()
    metrics = SchedulerMetrics(registry, ledger, queue)
    metrics.admission(queue.submit(req("a", "small", prompt=150, max_new=150)))
    queue.submit(req("b", "small"))  # waits for small's room
    metrics.admission(ledger.admit(req("c", "small", prompt=50, max_new=50, strict=True)))
    text = generate_latest(registry).decode()
    assert 'ortserve_scheduler_tenant_kv_reserved_bytes{model="m",tenant="small"} 3000.0' in text
    assert 'ortserve_scheduler_tenant_kv_quota_bytes{model="m",tenant="large"} 7000.0' in text
    assert 'ortserve_scheduler_tenant_kv_quota_bytes{model="m",tenant="free"}' not in text
    assert 'ortserve_scheduler_tenant_queue_length{model="m",tenant="small"} 1.0' in text
    assert ('ortserve_scheduler_tenant_admissions_total{cause="",decision="admitted",'
            'tenant="small"} 1.0') in text
    assert ('ortserve_scheduler_tenant_admissions_total{cause="tenant_quota",decision="rejected",'
            'tenant="small"} 1.0') in text
    assert 'ortserve_scheduler_tenant_queue_wait_seconds_count{tenant="small"} 2.0' in text


def test_a_tenant_past_its_request_rate_is_rejected_tenant_rate_and_holds_nothing():
    ledger, queue, clock = setup(TABLE.replace("weight = 1\n", "weight = 1\nrequests_per_s = 1\n", 1))
    first = queue.submit(req("a", "small"))
    assert first.decision is Decision.ADMITTED
    refused = queue.submit(req("b", "small"))
    r = refused.rejection
    assert refused.decision is Decision.REJECTED and r.cause is Cause.TENANT_RATE
    assert (r.tenant, r.tenant_requests_per_s, r.tenant_burst, r.retry_after_s) == ("small", 1.0, 1, 1.0)
    assert "may start 1 requests a second (bursts of 1)" in r.message and "retry in 1.00 s" in r.remedy
    assert held(ledger, "small") == first.reserved_bytes and len(queue) == 0
    assert queue.submit(req("c", "large")).decision is Decision.ADMITTED  # not another's limit
    clock.now += 1.0
    assert queue.submit(req("d", "small")).decision is Decision.ADMITTED


def test_a_lease_restored_after_a_scheduler_restart_counts_against_its_tenant_again():
    """The lease travels to the worker with its tenant (types.Lease.tenant) and comes back
    with the worker's registration: a new ledger charges the same tenant's quota."""
    ledger, _, clock = setup()
    admission = ledger.admit(req("a", "small", prompt=100, max_new=100))
    [lease] = [lease for w in ledger.snapshot() for lease in w.leases]
    wire = convert.lease_to_pb(lease, clock())
    assert wire.tenant == "small"
    two_step = convert.lease_to_pb(replace(lease, two_step=True), clock())
    assert convert.lease_from_pb(two_step, clock()).two_step  # Admit's mark travels too
    restarted, _, _ = setup()
    restarted.register(WorkerGeometry(worker_id="w1", address="w1:1", model="m",
                                      context_length=4_096, bytes_per_token=BPT,
                                      capacity_bytes=CAPACITY_TOKENS * BPT),
                       [convert.lease_from_pb(wire, clock())])
    assert held(restarted, "small") == admission.reserved_bytes == 2_000
    capped = restarted.admit(req("b", "small", prompt=50, max_new=200))
    assert capped.decision is Decision.CAPPED and capped.budget_cap.tenant_reserved_bytes == 2_000
