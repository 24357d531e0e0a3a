"""The worker's settings: one frozen dataclass, filled only by __main__."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ortserve.rpc import keepalive
from ortserve.rpc.tls import TlsFiles


@dataclass(frozen=True)
class WorkerConfig:
    model_dir: Path
    scheduler_address: str = "127.0.0.1:50061"  # the scheduler's --internal-port
    host: str = "127.0.0.1"
    port: int = 50052  # 0: any free port
    advertise_address: str = ""  # what the scheduler dials; "" -> host:port (or this host's IP)
    worker_id: str = ""  # "" -> <hostname>-<port>
    device: str = "auto"  # auto | cpu | cuda
    device_id: int = 0
    intra_op_threads: int = 0  # 0 -> every usable core
    intra_op_spinning: bool = True  # ORT's pool threads spin-wait between parallel sections
    # CUDA: decode steps replay a CUDA graph per batch-size bucket (--cuda-graphs; docs/kv-arena.md).
    cuda_graphs: bool = True
    kv_capacity_bytes: int | None = None  # None -> kv_capacity_fraction of available memory (--kv-capacity)
    kv_capacity_fraction: float = 0.2
    # The KV arena's rows: the most sequences running at once; admitted ones beyond wait
    # in the engine's queue for a row (--max-batch-rows).
    max_batch_rows: int = 32
    # The context served, at most the model's; 0: the model's (--max-context-tokens).
    max_context_tokens: int = 0
    # LoRA adapters loaded at start, (served name, .onnx_adapter path) each (--lora NAME=PATH);
    # their bytes come out of the KV capacity.
    lora: tuple[tuple[str, str], ...] = ()
    metrics_port: int | None = None  # Prometheus /metrics port; None: off, 0: any free port
    drain_timeout_s: float = 30.0  # SIGTERM: live streams may finish within this
    # gRPC keepalive pings to its callers while their calls run (--caller-keepalive-s): a
    # caller gone silent has its streams cancelled and their KV freed in about twice this.
    caller_keepalive_s: float = keepalive.DEFAULT_INTERVAL_S
    session_swap_bytes: int = 256 * 2**20  # host memory for swapped-out sessions (--session-swap-bytes)
    # The disk tier of parked sessions (--session-dir; "" off), its bytes
    # (--session-disk-bytes) and how long a session stays idle in memory before it is
    # written there (--session-disk-after-s).
    session_dir: str = ""
    session_disk_bytes: int = 4 * 2**30
    session_disk_after_s: float = 300.0
    # The prefix cache's bound inside the KV capacity (--prefix-cache-bytes); None: half
    # of it; 0: off (docs/features/prefix-cache.md).
    prefix_cache_bytes: int | None = None
    # Bench only: no model runs, every stream gets this many tokens a second (EngineConfig's
    # bench_rate_set_tokens_per_s); 0: off. Taken only with ORTSERVE_BENCH=1.
    bench_rate_set_tokens_per_s: float = 0.0
    # Speculative decoding (--speculative): "ngram" (prompt lookup, verified in one run;
    # docs/features/speculative-decoding.md) or "off". Off by default: on free text at 8-16 streams
    # the bench measured it below 0.97x of off (docs/features/speculative-decoding.md).
    speculative: str = "off"
    log_level: str = "info"
    log_json: bool | None = None
    otlp_traces_endpoint: str = ""  # OTLP/gRPC collector for traces; "": the OTEL_* variables
    # cert/key: its port and its client certificate towards the scheduler; ca: what
    # the scheduler's certificate and callers' client certificates must chain to.
    tls: TlsFiles = field(default_factory=TlsFiles)
