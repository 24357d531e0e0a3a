"""The ledger's invariants with tenants, under random admissions, releases, session turns,
queue pumps and reloads of the tenants table."""

from __future__ import annotations

import itertools
from types import MappingProxyType

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from scheduler_service.ledger.ledger import AdmissionRequest, Decision, Ledger, WorkerGeometry
from scheduler_service.ledger.queue import AdmissionQueue, Mode, Ticket
from scheduler_service.ledger.tenants import Quota, Tenant, TenantTable

TENANTS = ("a", "b", "c", "")  # "": charged to no tenant
BPT = 7

quotas = st.one_of(st.none(), st.floats(0.05, 1.0).map(lambda s: Quota(share=s)),
                   st.integers(0, 4_000).map(lambda b: Quota(absolute_bytes=b)))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TenantLedgerMachine(RuleBasedStateMachine):
    @initialize(a=quotas, b=quotas, c=quotas)
    def start(self, a, b, c) -> None:
        self.clock = Clock()
        ids = itertools.count()
        self.ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9, clock=self.clock,
                             new_lease_id=lambda: f"lease-{next(ids):05d}")
        for worker_id, tokens in (("w1", 300), ("w2", 200)):
            self.ledger.register(WorkerGeometry(worker_id=worker_id, address=worker_id, model="m",
                                                context_length=1_000, bytes_per_token=BPT,
                                                capacity_bytes=tokens * BPT, block_tokens=4))
        self.queue = AdmissionQueue(self.ledger, max_length=6, max_wait_s=50.0, clock=self.clock,
                                    aging_s=5.0)
        self.leases: dict[str, str] = {}  # lease_id -> tenant, as the test believes
        self.sessions: dict[str, str] = {}  # session lease_id -> tenant
        self.tickets: list[Ticket] = []
        self.before = self._held()
        self._reload(a, b, c)

    # -- helpers -------------------------------------------------------------------

    def _reload(self, a, b, c) -> None:
        table = TenantTable(MappingProxyType({
            name: Tenant(name, quota, weight=w)
            for (name, quota, w) in (("a", a, 1.0), ("b", b, 2.0), ("c", c, 0.5))}))
        self.ledger.set_tenants(table)
        self.before = self._held()  # a lowered quota: the tenant may now hold more than it

    def _held(self) -> dict[str, int]:
        held = dict.fromkeys(TENANTS, 0)
        for (tenant, _model), n in self.ledger.tenant_reserved().items():
            held[tenant] += n
        return held

    def _quota(self, tenant: str) -> int | None:
        capacity = sum(w.geometry.capacity_bytes for w in self.ledger.snapshot())
        return self.ledger.tenants.quota_bytes(tenant, "m", capacity)

    def _took(self, admission) -> None:
        if admission.lease is not None and admission.lease.lease_id not in self.sessions:
            self.leases[admission.lease.lease_id] = admission.lease.tenant

    # -- rules ----------------------------------------------------------------------

    @rule(tenant=st.sampled_from(TENANTS), prompt=st.integers(1, 200),
          max_new=st.one_of(st.none(), st.integers(1, 300)), min_new=st.integers(0, 60),
          strict=st.booleans(), priority=st.integers(-3, 3), queued=st.booleans())
    def admit(self, tenant, prompt, max_new, min_new, strict, priority, queued) -> None:
        if max_new is not None and min_new > max_new:
            min_new = max_new
        request = AdmissionRequest(f"r{len(self.leases)}", prompt_tokens=prompt,
                                   max_new_tokens=max_new, min_new_tokens=min_new, strict=strict,
                                   model="m", tenant=tenant, priority=priority)
        if not queued:
            self._took(self.ledger.admit(request))
            return
        answer = self.queue.submit(request, Mode.STRICT if strict else Mode.ALLOW)
        if isinstance(answer, Ticket):
            self.tickets.append(answer)
        else:
            self._took(answer)

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def release(self, data) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.leases)))
        assert self.ledger.release(lease_id) >= 0
        del self.leases[lease_id]

    @rule(tenant=st.sampled_from(TENANTS))
    def open_session(self, tenant) -> None:
        lease = self.ledger.open_session_lease(f"s{len(self.sessions)}", "m", tenant=tenant)
        self.sessions[lease.lease_id] = tenant

    @precondition(lambda self: self.sessions)
    @rule(data=st.data(), prompt=st.integers(1, 200), max_new=st.integers(1, 200))
    def session_turn(self, data, prompt, max_new) -> None:
        lease_id = data.draw(st.sampled_from(sorted(self.sessions)))
        self.ledger.resize(lease_id, AdmissionRequest("t", prompt_tokens=prompt,
                                                      max_new_tokens=max_new, model="m"))

    @rule(seconds=st.floats(0, 10))
    def pump(self, seconds) -> None:
        self.clock.now += seconds
        for ticket in self.queue.pump():
            self.tickets.remove(ticket)
            if ticket.outcome is not None:
                self._took(ticket.outcome)

    @rule(a=quotas, b=quotas, c=quotas)
    def reload(self, a, b, c) -> None:
        self._reload(a, b, c)

    # -- invariants ------------------------------------------------------------------

    @invariant()
    def each_tenant_grows_only_within_its_quota(self) -> None:
        held = self._held()
        for tenant in TENANTS:
            quota = self._quota(tenant)
            if quota is not None and held[tenant] > self.before[tenant]:
                assert held[tenant] <= quota, (tenant, held[tenant], quota)
        # (held never above quota while before was under it follows: it did not grow past it)
        self.before = held

    @invariant()
    def the_pool_holds_at_most_its_capacity_and_exactly_its_leases(self) -> None:
        for w in self.ledger.snapshot():
            assert 0 <= w.reserved_bytes <= w.geometry.capacity_bytes
            assert w.reserved_bytes == sum(lease.reserved_bytes for lease in w.leases)
        live = {lease.lease_id: lease for w in self.ledger.snapshot() for lease in w.leases}
        assert set(live) == set(self.leases) | set(self.sessions)
        for lease_id, tenant in {**self.leases, **self.sessions}.items():
            assert live[lease_id].tenant == tenant
        by_tenant = dict.fromkeys(TENANTS, 0)
        for lease in live.values():
            by_tenant[lease.tenant] += lease.reserved_bytes
        assert by_tenant == self._held()

    @invariant()
    def the_queue_holds_no_bytes_and_decided_tickets_left_it(self) -> None:
        assert len(self.queue) == len(self.tickets)
        assert all(t.outcome is None or t.outcome.decision is not Decision.REJECTED
                   or t.outcome.lease is None for t in self.tickets)


TenantLedgerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
test_tenant_ledger_invariants = TenantLedgerMachine.TestCase
