"""The worker's Prometheus metrics (names prefixed ortserve_worker_, units in names).

Gauges read the engine at scrape time; the histograms and counters are fed
once per finished sequence from its Completed event.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ortserve.process.metrics import RequestLatency, callback_gauge
from worker_service.core.sequence import Completed
from worker_service.engine.engine import Engine
from worker_service.relay_call import SENT


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, engine: Engine) -> None:
        callback_gauge(registry, "ortserve_worker_kv_capacity_bytes",
                       "KV-cache bytes this worker lets sequences hold (its --kv-capacity)",
                       lambda: engine.capacity_bytes)
        callback_gauge(registry, "ortserve_worker_kv_held_bytes",
                       "KV-cache bytes charged to live sequences now (queued ones included)",
                       engine.held_bytes)
        # vLLM's kv_cache_usage_perc: the share of the KV capacity sequences hold now.
        Gauge("ortserve_worker_kv_usage_ratio", "held / capacity of this worker's KV (0 to 1)",
              ["model"], registry=registry).labels(engine.spec.name).set_function(
            lambda: engine.held_bytes() / engine.capacity_bytes if engine.capacity_bytes else 0.0)
        callback_gauge(registry, "ortserve_worker_running_sequences",
                       "Sequences on this worker now (queued on the engine included)",
                       engine.active_sequences)
        callback_gauge(registry, "ortserve_worker_batch_rows",
                       "Rows in the running batch now (sequences one decode run advances)",
                       lambda: engine.batch_rows)
        callback_gauge(registry, "ortserve_worker_largest_batch",
                       "The largest batch one run has decoded since start",
                       lambda: engine.runner.largest_batch)
        callback_gauge(registry, "ortserve_worker_ort_run_cpu_seconds",
                       "CPU seconds the engine thread spent inside ONNX Runtime session runs "
                       "(what the rest of the process costs is its CPU minus this)",
                       lambda: engine.runner.ort_cpu_s)
        self.generated_tokens = Counter(
            "ortserve_worker_generated_tokens", "Tokens generated (EOS included)",
            registry=registry)
        self.sequences = Counter(
            "ortserve_worker_sequences_finished", "Sequences that finished, by finish reason",
            ["finish_reason"], registry=registry)
        self.draft_proposed_tokens = Counter(
            "ortserve_worker_speculative_proposed_tokens",
            "Tokens speculative decoding proposed and the model verified", registry=registry)
        self.draft_accepted_tokens = Counter(
            "ortserve_worker_speculative_accepted_tokens",
            "Proposed tokens the outputs kept (each one a model run saved)", registry=registry)
        self.latency = RequestLatency(registry, "ortserve_worker", "worker")
        registry.register(_PrefixCacheMetrics(engine))
        registry.register(_DecodeStepMetrics(engine))
        registry.register(_PrefillBudgetMetrics(engine))
        registry.register(_RelaySent())
        if engine.sessions is not None and engine.sessions.disk is not None:
            registry.register(_SessionDisk(engine.sessions.disk))

    def completed(self, done: Completed) -> None:
        self.generated_tokens.inc(done.generated_tokens)
        self.sequences.labels(done.finish_reason.value).inc()
        if done.draft_proposed_tokens:
            self.draft_proposed_tokens.inc(done.draft_proposed_tokens)
            self.draft_accepted_tokens.inc(done.draft_accepted_tokens)
        self.latency.observe(done.generated_tokens, done.ttft_ms, done.decode_ms, done.total_ms)


class _SessionDisk(Collector):
    """The disk tier of parked sessions (--session-dir): its bytes and its refused files."""

    def __init__(self, disk) -> None:
        self._disk = disk

    def collect(self):
        yield GaugeMetricFamily("ortserve_worker_session_disk_bytes",
                                "Bytes of parked sessions' files in --session-dir",
                                value=self._disk.used_bytes)
        yield GaugeMetricFamily("ortserve_worker_session_disk_limit_bytes",
                                "The disk tier's budget (--session-disk-bytes)",
                                value=self._disk.limit_bytes)
        refused = CounterMetricFamily(
            "ortserve_worker_session_files_rejected",
            "Session files refused and set aside as .rejected, by reason (truncated, corrupt, "
            "foreign, version, unreadable, over_budget)", labels=["reason"])
        for reason, n in sorted(self._disk.rejected.items()):
            refused.add_metric([reason], n)
        yield refused

    def describe(self):
        return [GaugeMetricFamily("ortserve_worker_session_disk_bytes", ""),
                GaugeMetricFamily("ortserve_worker_session_disk_limit_bytes", ""),
                CounterMetricFamily("ortserve_worker_session_files_rejected", "", labels=["reason"])]


class _RelaySent(Collector):
    """Messages and frames the worker's Relay calls sent (to the scheduler's relay and the
    gateways' two-step path): frames per message is how many requests share one."""

    def collect(self):
        yield CounterMetricFamily("ortserve_worker_relay_messages",
                                  "RelayFrames messages sent on Worker.Relay calls",
                                  value=SENT.messages)
        yield CounterMetricFamily("ortserve_worker_relay_frames",
                                  "Frames (a request's event, end or failure) in them",
                                  value=SENT.frames)

    def describe(self):
        return [CounterMetricFamily("ortserve_worker_relay_messages", ""),
                CounterMetricFamily("ortserve_worker_relay_frames", "")]


class _DecodeStepMetrics(Collector):
    """How decode steps ran (runtime/decode_step.py's StepStats, read at scrape time): replayed
    CUDA graphs or not and why, host vs session-run seconds, padded rows, the buckets' fixed
    buffers. A runner without buckets (static, the bench's set rate) reports zeros."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self):
        stats = getattr(self._engine.runner, "step_stats", None)
        steps = CounterMetricFamily(
            "ortserve_worker_decode_steps",
            "Batched decode runs, by whether they replayed a captured CUDA graph and why not",
            labels=["graph", "reason"])
        if stats is not None:
            steps.add_metric(["captured", ""], stats.captured_steps)
            for reason, count in sorted(stats.uncaptured_by_reason.items()):
                steps.add_metric(["uncaptured", reason], count)
        yield steps
        yield CounterMetricFamily(
            "ortserve_worker_decode_host_seconds",
            "Wall seconds of decode steps spent outside the session run (inputs, outputs, "
            "bookkeeping)", value=stats.host_s if stats else 0.0)
        yield CounterMetricFamily(
            "ortserve_worker_decode_device_seconds",
            "Wall seconds of decode steps inside the session run (the device's work and its "
            "launches)", value=stats.device_s if stats else 0.0)
        yield CounterMetricFamily(
            "ortserve_worker_decode_padded_rows",
            "Rows run as padding up to a batch-size bucket, summed over decode steps",
            value=stats.padded_rows if stats else 0)
        yield GaugeMetricFamily(
            "ortserve_worker_decode_bucket_buffer_bytes",
            "Bytes of the decode buckets' fixed input and output buffers on the KV's device",
            value=stats.graph_bytes if stats else 0)
        yield GaugeMetricFamily(
            "ortserve_worker_decode_graph_capture_bytes",
            "Device memory the captured CUDA decode graphs took (free memory before and after "
            "the capture), charged out of the KV capacity with the bucket buffers",
            value=stats.capture_bytes if stats else 0)

    def describe(self):
        return []


class _PrefixCacheMetrics(Collector):
    """The prefix cache's figures, read from its stats at scrape time (docs/features/prefix-cache.md)."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self):
        cache = self._engine.prefix_cache
        stats = cache.stats if cache is not None else None
        looked = stats.lookup_tokens if stats else 0
        hit = stats.hit_tokens if stats else 0
        yield GaugeMetricFamily(
            "ortserve_worker_prefix_cache_bytes",
            "KV bytes the prefix cache holds now (inside the KV capacity, evictable)",
            value=self._engine.cached_bytes())
        yield GaugeMetricFamily(
            "ortserve_worker_prefix_cache_limit_bytes",
            "The prefix cache's bound (--prefix-cache-bytes; 0: off)",
            value=cache.limit_bytes if cache is not None else 0)
        yield CounterMetricFamily(
            "ortserve_worker_prefix_cache_lookup_tokens",
            "Prompt tokens a prefix cache hit could have supplied (whole blocks before the last token)", value=looked)
        yield CounterMetricFamily(
            "ortserve_worker_prefix_cache_hit_tokens",
            "Prompt tokens served from the prefix cache (copied, not prefilled)", value=hit)
        yield GaugeMetricFamily(
            "ortserve_worker_prefix_cache_hit_ratio",
            "hit_tokens / lookup_tokens since start (0 before any lookup)",
            value=hit / looked if looked else 0.0)
        yield CounterMetricFamily(
            "ortserve_worker_prefix_cache_evicted_bytes",
            "Bytes evicted from the prefix cache (for admissions or its bound)",
            value=stats.evicted_bytes if stats else 0)
        # Stored responses' prompts and answers (GenerateRequest.keep_prefix_s): what waits
        # for a follow-up, and what pressure took before its time.
        yield GaugeMetricFamily(
            "ortserve_worker_prefix_cache_kept_bytes",
            "Of the prefix cache's bytes, those kept for a follow-up (keep_prefix_s) now",
            value=cache.kept_bytes() if cache is not None else 0)
        yield CounterMetricFamily(
            "ortserve_worker_prefix_cache_kept_evicted_bytes",
            "Of the evicted bytes, those evicted while still kept (pressure took them)",
            value=stats.kept_evicted_bytes if stats else 0)

    def describe(self):
        return []


class _PrefillBudgetMetrics(Collector):
    """Prompt chunks held to the decoding streams' gap goal (core/prefill_budget.py): the
    budget in force, the costs it is computed from, and the chunks run."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def collect(self):
        pace = self._engine.prefill_pace
        yield GaugeMetricFamily(
            "ortserve_worker_prefill_budget_tokens",
            "Prompt tokens the last step could run beside its decodes (the configured chunk "
            "with no gap goal among them; less, to keep the step within the strictest goal)",
            value=self._engine.scheduler.budget_tokens)
        yield GaugeMetricFamily(
            "ortserve_worker_prompt_token_seconds",
            "Measured cost of one prompt token in a step (mean; 0 before any)",
            value=pace.prompt_token_s or 0.0)
        yield GaugeMetricFamily(
            "ortserve_worker_prompt_chunk_seconds",
            "Measured cost of a prompt chunk's own run in a step, whatever its tokens (0 before "
            "any)", value=pace.chunk_s)
        yield CounterMetricFamily(
            "ortserve_worker_prompt_chunks",
            "Prompt chunks run (a prompt held to a small budget runs in more of them)",
            value=pace.chunks_run)

    def describe(self):
        return []
