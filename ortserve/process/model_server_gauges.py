"""The model-server gauges an inference gateway's endpoint picker reads, per worker, computed
from one GetBudget answer (the ledger's own numbers; docs/operations/inference-gateway.md).

The Gateway API Inference Extension's picker (its core-metrics-extractor) reads from each
model server: requests waiting, requests running, KV-cache utilisation (0 to 1), an info
gauge whose labels carry the block size and the number of blocks, and an info gauge whose
labels list the LoRA adapters running and waiting. vLLM's names are the picker's default;
ortserve publishes its own names and the overlay's engine configuration maps them
(deploy/k8s/overlays/inference-gateway), because the meanings differ: utilisation here is
what the ledger reserved (the worst case of every admitted request) over capacity, not the
KV a vLLM block allocator has handed out, and "waiting" is the scheduler's queue for the
worker's model, not a queue inside the worker. A vLLM name on a different meaning would
mislead every dashboard built for vLLM.

The same function serves the scheduler (every worker, labelled worker_id) and a gateway
that stands in front of one worker (only that worker's series: the picker scrapes each
endpoint it routes to and takes the one series it finds).
"""

from __future__ import annotations

from prometheus_client.core import GaugeMetricFamily

from ortserve.v1 import scheduler_pb2

WAITING = "ortserve_model_server_requests_waiting"
RUNNING = "ortserve_model_server_requests_running"
KV_UTILIZATION = "ortserve_model_server_kv_utilization_ratio"
CACHE_INFO = "ortserve_model_server_cache_config_info"
LORA_INFO = "ortserve_model_server_lora_requests_info"
ADAPTER_BYTES = "ortserve_model_server_adapter_bytes"

# The labels the picker's engine configuration names (vLLM's, so its defaults apply).
BLOCK_SIZE_LABEL, NUM_BLOCKS_LABEL = "block_size", "num_gpu_blocks"
_LABELS = ["worker_id", "model"]


def capacity_blocks(worker: scheduler_pb2.WorkerBudget) -> int:
    """Whole blocks of block_tokens tokens the worker's KV capacity holds."""
    block_bytes = worker.bytes_per_token * max(worker.block_tokens, 1)
    return worker.capacity_bytes // block_bytes if block_bytes else 0


def families(budget: scheduler_pb2.Budget, worker_id: str | None = None,
             now_s: float = 0.0) -> list[GaugeMetricFamily]:
    """The gauges for every worker in `budget`, or only `worker_id` (none when it is not
    registered: a picker then sees no numbers, not stale ones). `now_s` (Unix seconds) is the
    LoRA info gauge's value: the picker keeps the series with the largest value."""
    waiting = GaugeMetricFamily(
        WAITING, "Requests the scheduler's admission queue holds for this worker's model (a "
        "queued request has no worker yet: every worker of the model shows it)", labels=_LABELS)
    running = GaugeMetricFamily(
        RUNNING, "Requests admitted to this worker and not yet released: its live leases (an "
        "open session's lease counts, it holds KV)", labels=_LABELS)
    utilization = GaugeMetricFamily(
        KV_UTILIZATION, "The ledger's reserved bytes / capacity on this worker (0 to 1): the "
        "worst case of every admitted request, not the KV written so far", labels=_LABELS)
    cache = GaugeMetricFamily(
        CACHE_INFO, "Always 1; block_size is the worker's allocation granularity in tokens, "
        "num_gpu_blocks its KV capacity in such blocks (on any device)",
        labels=[*_LABELS, BLOCK_SIZE_LABEL, NUM_BLOCKS_LABEL])
    lora = GaugeMetricFamily(
        LORA_INFO, "Unix time of this scrape; running_lora_adapters: the adapters loaded on "
        "this worker (ready, charged to its capacity), waiting_lora_adapters: the adapters "
        "queued requests name, max_lora: adapters it serves without loading another",
        labels=[*_LABELS, "max_lora", "running_lora_adapters", "waiting_lora_adapters"])
    adapter_bytes = GaugeMetricFamily(
        ADAPTER_BYTES, "Bytes a LoRA adapter holds on the worker that serves it (taken out of "
        "its KV capacity): one series per adapter and worker", labels=[*_LABELS, "adapter"])
    models = {m.model: m for m in budget.models}
    for w in budget.workers:
        if worker_id is not None and w.worker_id != worker_id:
            continue
        labels = [w.worker_id, w.model]
        model = models.get(w.model, scheduler_pb2.ModelBudget())
        waiting.add_metric(labels, model.queue_length)
        running.add_metric(labels, w.lease_count)
        utilization.add_metric(labels, w.reserved_bytes / w.capacity_bytes
                               if w.capacity_bytes else 0.0)
        cache.add_metric([*labels, str(max(w.block_tokens, 1)), str(capacity_blocks(w))], 1.0)
        loaded = sorted(a.name for a in w.adapters)
        # NOTE: no adapter slots here: an adapter is charged bytes, so the count a worker
        # serves without loading is the count loaded (the picker then sees no free slot).
        lora.add_metric([*labels, str(len(loaded)), ",".join(loaded),
                         ",".join(model.waiting_adapters)], now_s)
        for a in w.adapters:
            adapter_bytes.add_metric([*labels, a.name], a.held_bytes)
    return [waiting, running, utilization, cache, lora, adapter_bytes]


def describe() -> list[GaugeMetricFamily]:
    return families(scheduler_pb2.Budget())
