"""The model-server gauges an endpoint picker reads, from a real ledger and queue: each one
the number GetBudget answers at the same instant, per worker, or for one worker only."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ortserve.process import model_server_gauges as g
from ortserve.process.metrics import new_registry
from scheduler_service.ledger.ledger import AdmissionRequest, Ledger, WorkerGeometry
from scheduler_service.ledger.queue import AdmissionQueue, Ticket
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.model_server_metrics import ledger_budget

BPT, BLOCK = 1_000, 16


def geometry(worker_id: str, capacity_tokens: int, adapters=()) -> WorkerGeometry:
    return WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model="m",
                          context_length=4_096, bytes_per_token=BPT, block_tokens=BLOCK,
                          capacity_bytes=capacity_tokens * BPT, adapters=tuple(adapters))


def req(name: str, tokens: int = 96, adapter: str = "") -> AdmissionRequest:
    return AdmissionRequest(name, prompt_tokens=tokens // 2, max_new_tokens=tokens // 2,
                            min_new_tokens=tokens // 2, model="m", adapter=adapter)


def scrape(registry) -> dict[str, list]:
    text = generate_latest(registry).decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)
            if f.name.startswith("ortserve_model_server_")}


def by_worker(samples) -> dict[str, float]:
    return {s.labels["worker_id"]: s.value for s in samples}


def test_gauges_equal_the_ledger_and_the_queue_as_load_moves_them():
    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    ledger.register(geometry("a", 320, adapters=[("fr", 5_000)]))  # capacity net of fr
    ledger.register(geometry("b", 192))
    queue = AdmissionQueue(ledger)
    registry = new_registry()
    SchedulerMetrics(registry, ledger, queue)

    def looks_right() -> dict[str, list]:
        seen, budget = scrape(registry), ledger_budget(ledger, queue)
        for w in budget.workers:
            assert by_worker(seen[g.KV_UTILIZATION])[w.worker_id] == w.reserved_bytes / w.capacity_bytes
            assert by_worker(seen[g.RUNNING])[w.worker_id] == w.lease_count
            assert by_worker(seen[g.WAITING])[w.worker_id] == budget.models[0].queue_length
        return seen

    seen = looks_right()
    assert by_worker(seen[g.RUNNING]) == {"a": 0, "b": 0}
    cache = {s.labels["worker_id"]: (s.labels["block_size"], s.labels["num_gpu_blocks"])
             for s in seen[g.CACHE_INFO]}
    assert cache == {"a": ("16", "20"), "b": ("16", "12")}
    held = [queue.submit(req(f"h{i}")) for i in range(5)]  # 96 tokens each: 3 fit a, 2 fit b
    assert not any(isinstance(h, Ticket) for h in held)
    waiting = [queue.submit(req("w1", adapter="fr")), queue.submit(req("w2"))]
    assert all(isinstance(t, Ticket) for t in waiting)
    seen = looks_right()
    assert by_worker(seen[g.RUNNING]) == {"a": 3, "b": 2}
    assert by_worker(seen[g.WAITING]) == {"a": 2, "b": 2}
    assert by_worker(seen[g.KV_UTILIZATION]) == {"a": 288 / 320, "b": 1.0}
    (lora_a,) = [s for s in seen[g.LORA_INFO] if s.labels["worker_id"] == "a"]
    assert (lora_a.labels["running_lora_adapters"], lora_a.labels["waiting_lora_adapters"],
            lora_a.labels["max_lora"]) == ("fr", "fr", "1")
    assert lora_a.value > 1.7e9  # a Unix time: the picker keeps the newest series
    assert [(s.labels["worker_id"], s.labels["adapter"], s.value)
            for s in seen[g.ADAPTER_BYTES]] == [("a", "fr", 5_000)]
    for h in held:
        ledger.release(h.lease.lease_id)
    queue.pump()
    seen = looks_right()
    assert by_worker(seen[g.WAITING]) == {"a": 0, "b": 0}
    assert sum(by_worker(seen[g.RUNNING]).values()) == 2


def test_one_worker_only_and_none_when_it_is_not_registered():
    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    ledger.register(geometry("a", 320))
    ledger.register(geometry("b", 192))
    budget = ledger_budget(ledger, None)
    only_b = g.families(budget, "b")
    assert {tuple(s.labels["worker_id"] for s in f.samples) for f in only_b[:5]} == {("b",)}
    assert all(not f.samples for f in g.families(budget, "gone"))
