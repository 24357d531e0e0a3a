"""The scheduler's settings: one frozen dataclass, filled only by __main__."""

from __future__ import annotations

from dataclasses import dataclass, field

from ortserve.rpc import keepalive
from ortserve.rpc.auth import ApiKeys
from ortserve.rpc.tls import TlsFiles
from scheduler_service.adapter_catalog import AdapterCatalog
from scheduler_service.default_tokens import DefaultMaxNewTokens
from scheduler_service.ledger.tenants import TenantTable


@dataclass(frozen=True)
class SchedulerConfig:
    host: str = "127.0.0.1"
    port: int = 50051  # 0: any free port
    # The worker-facing SchedulerInternal service's own port (mutual TLS when tls is set).
    internal_port: int = 50061  # 0: any free port
    heartbeat_interval_s: float = 2.0  # what workers are told
    lease_ttl_s: float = 10.0  # a worker silent this long is gone, with its leases
    claim_ttl_s: float = 60.0  # an admitted lease no worker claimed this long is dropped
    retry_after_s: float = 1.0  # RetryInfo for BUDGET_BUSY and NO_WORKER
    expiry_interval_s: float = 1.0
    drain_timeout_s: float = 30.0  # SIGTERM: relayed streams may finish within this
    # How relayed requests reach a worker: "shared", one Worker.Relay call per worker
    # carrying them all (one message per step); "per-request", a Worker.Generate call each.
    relay_calls: str = "shared"
    # gRPC keepalive pings on the channels to workers (ortserve/rpc/keepalive.py): a worker
    # that stops answering fails its streams after about twice this; 0: off.
    worker_keepalive_s: float = keepalive.DEFAULT_INTERVAL_S
    max_queue_length: int = 256  # requests waiting for budget at once; more: QUEUE_FULL
    max_queue_wait_s: float = 30.0  # the longest one request waits for budget; then QUEUE_TIMEOUT
    # The default latency goals of a request that sets none (ms; 0: none, admission by
    # bytes alone, the default): docs/features/time-budget.md.
    max_itl_ms: int = 0
    max_ttft_ms: int = 0
    # A request waiting this long goes ahead of every priority and tenant share.
    queue_aging_s: float = 10.0
    # The tenants file (docs/features/tenants.md), read at start and on SIGHUP; "": no tenants.
    tenants_file: str = ""
    tenants: TenantTable = field(default_factory=TenantTable)  # as read at start
    # LoRA adapters a request may name before any worker has loaded them
    # (adapter_catalog.py; --adapter-catalog, read at start); empty: none.
    adapter_catalog: AdapterCatalog = field(default_factory=lambda: AdapterCatalog({}))
    metrics_port: int | None = None  # Prometheus /metrics port; None: off, 0: any free port
    # The ceiling of a request that sets no max_new_tokens, per model (default_tokens.py).
    default_max_new_tokens: DefaultMaxNewTokens = field(default_factory=DefaultMaxNewTokens)
    session_ttl_s: float = 600.0  # an idle session is closed (and its bytes released) after this
    log_level: str = "info"
    log_json: bool | None = None  # None: JSON when stderr is not a terminal
    otlp_traces_endpoint: str = ""  # OTLP/gRPC collector for traces; "": the OTEL_* variables
    # Client API keys; empty: open (the local demo, logged loudly beyond loopback).
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    # cert/key: both ports and the client cert towards workers; ca: trusted for
    # workers' client certs (internal port) and their server certs (relay channel).
    tls: TlsFiles = field(default_factory=TlsFiles)
