"""The gateway's settings: one frozen dataclass, filled only by __main__."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: any free port
    scheduler_address: str = "127.0.0.1:50051"
    # The CA (PEM) the scheduler's certificate chains to: TLS to the scheduler.
    # Empty: plaintext (the local demo). Callers' API keys travel as metadata.
    scheduler_cacert: str = ""
    # Bounds one whole generation on the gRPC side; a client that waits
    # longer than this gets a 504, never a stream that silently hangs.
    request_timeout_s: float = 600.0
    # /v1/models reads GetBudget; cached this long so a burst of listings costs
    # one round trip to the scheduler (requests pass `model` through, unchecked here).
    models_cache_s: float = 2.0
    # The two-step path (Admit, then the worker streams to the gateway): the scheduler
    # relays no token. The gateway must reach the workers' registered addresses; with
    # TLS their ports are mutual TLS: worker_tls_* name the cluster's CA and a
    # certificate it signed (empty: plaintext to the workers). None (the default): the
    # two-step path where a worker answers, else the scheduler relays that request
    # (gateway/direct.py, Workers.reachable); True: only the two-step path; False: relayed.
    direct_to_workers: bool | None = None
    # GenerateRequest.stream_interval_ms for every request that sets none: the tokens of
    # one interval leave as one SSE event (the first never waits). 0: every token as it
    # comes. 20 measured (docs/benchmarks.md, round 6): at 128 streams of 200 tokens/s
    # the served path's CPU per token 92 -> 56 us and delivered tokens/s 1.8x, each
    # token waiting at most 20 ms more; streams slower than 50 tokens/s are not held.
    stream_interval_ms: int = 20
    # HTTPS for callers (uvicorn's TLS): the certificate chain and key it shows; empty:
    # plain HTTP. With tls_client_ca, mutual TLS: a caller must show a certificate that
    # chains to it.
    tls_cert: str = ""
    tls_key: str = ""
    tls_client_ca: str = ""
    # An HTTP header (set by the authenticating proxy in front) whose value goes to the
    # scheduler as the call's tenant (ortserve-tenant metadata); "": none sent.
    tenant_header: str = ""
    # Chat outputs of a model whose template writes reasoning (<think>...</think>): "auto"
    # splits them into reasoning_content and content (gateway/reply/reasoning_split.py); "none"
    # leaves the tags in content.
    reasoning_parser: str = "auto"
    worker_tls_ca: str = ""
    worker_tls_cert: str = ""
    worker_tls_key: str = ""
    # Stored responses (POST /v1/responses with store: true): at most this many, each for
    # at most this long; a session that only a forgotten response could continue is closed.
    responses_max: int = 1_000
    responses_ttl_s: float = 3_600.0
    # Processes accepting on the one port (--processes): the gateway keeps no state
    # between requests, so copies share only the listening socket.
    processes: int = 1
    # A gateway in front of one worker (a pod of an inference gateway's InferencePool:
    # deploy/k8s/overlays/inference-gateway): /metrics adds that worker's model-server gauges,
    # read from GetBudget at each scrape (ortserve_model_server_*); "": none.
    model_server_worker_id: str = ""
    # vLLM's per-request metrics: every chat and completion body (and each choice's last
    # streamed chunk) carries `metrics`; False: only for requests that send
    # X-Ortserve-Request-Metrics: true (gateway/request_metrics.py).
    per_request_metrics: bool = False
    log_level: str = "info"
    log_json: bool | None = None  # None: JSON when stderr is not a terminal
    otlp_traces_endpoint: str = ""  # OTLP/gRPC collector for traces; "": the OTEL_* variables
