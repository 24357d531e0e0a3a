"""ortserve-gateway: argv and environment -> GatewayConfig -> uvicorn serving the app.

Every flag has an environment variable ORTSERVE_GATEWAY_<FLAG>; a flag overrides
its variable. --scheduler falls back to ORTSERVE_SCHEDULER_ADDRESS, the variable
the workers read, so one setting points a whole deployment at its scheduler.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import signal
import ssl

import uvicorn

from gateway.app import build_app
from gateway.config import GatewayConfig
from ortserve.process import banner, ports, tracing
from ortserve.process.env_defaults import Checked, boolean, every_flag_from_env, from_env, in_range
from ortserve.process.logs import add_level_argument, configure_logging
from ortserve.process.version import package_version
from ortserve.rules.request_rules import MAX_STREAM_INTERVAL_MS

_ENV = "ORTSERVE_GATEWAY_"


def _env(p: argparse.ArgumentParser, name: str, default, **checks):
    return from_env(p, _ENV + name.upper(), default, **checks)


def parse_config(argv: list[str] | None = None) -> GatewayConfig:
    d = GatewayConfig()
    p = argparse.ArgumentParser(prog="ortserve-gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    p.add_argument("--host", default=_env(p, "host", d.host), help="address to bind")
    port = in_range(int, 0, 65_535, what="a TCP port; 0: any free port")
    p.add_argument("--port", type=port, default=_env(p, "port", d.port, kind=port),
                   help="HTTP port; 0 picks a free one")
    p.add_argument("--scheduler", default=_env(p, "scheduler", os.environ.get(
        "ORTSERVE_SCHEDULER_ADDRESS", d.scheduler_address)), help="the scheduler's host:port")
    p.add_argument("--tls-cert", default=_env(p, "tls_cert", ""),
                   help="HTTPS: the gateway's certificate chain (PEM) shown to callers (env "
                        "ORTSERVE_GATEWAY_TLS_CERT); none: plain HTTP")
    p.add_argument("--tls-key", default=_env(p, "tls_key", ""),
                   help="HTTPS: its private key (PEM; env ORTSERVE_GATEWAY_TLS_KEY)")
    p.add_argument("--tls-client-ca", default=_env(p, "tls_client_ca", ""),
                   help="mutual TLS: callers must show a certificate chaining to this CA (PEM; "
                        "env ORTSERVE_GATEWAY_TLS_CLIENT_CA); with --tls-cert and --tls-key")
    p.add_argument("--cacert", default=_env(p, "cacert", d.scheduler_cacert),
                   help="TLS to the scheduler: the CA (PEM) its certificate chains to; "
                        "empty: plaintext")
    timeout_s = Checked(float, lambda s: None if s > 0 else f"{s:g} s must be above 0")
    p.add_argument("--request-timeout-s", type=timeout_s,
                   default=_env(p, "request_timeout_s", d.request_timeout_s, kind=timeout_s),
                   help="deadline of one generation's gRPC call")
    p.add_argument("--models-cache-s", type=float, default=_env(p, "models_cache_s", d.models_cache_s))
    p.add_argument("--direct-to-workers", action=argparse.BooleanOptionalAction,
                   default=_env(p, "direct_to_workers", d.direct_to_workers, kind=boolean),
                   help="the two-step path: Admit on the scheduler, then stream from the worker "
                        "directly (the scheduler relays no token; the gateway must reach the "
                        "workers' addresses); --no-direct-to-workers: the scheduler relays "
                        "every stream. Default: the two-step path where the worker answers "
                        "within 2 s, else relayed (said in a warning); relayed when TLS to the "
                        "scheduler is on without --worker-tls-*")
    interval_ms = in_range(int, 0, MAX_STREAM_INTERVAL_MS, " ms", "0: every token as it comes")
    p.add_argument("--stream-interval-ms", type=interval_ms,
                   default=_env(p, "stream_interval_ms", d.stream_interval_ms, kind=interval_ms),
                   help="the shortest time between two streamed chunks, for every request that "
                        "sets no stream_interval_ms (the tokens meanwhile leave as one SSE event: "
                        "fewer messages; the first token never waits; a token waits at most "
                        "this long); 0: every token as it comes; at most 10,000; default "
                        f"{d.stream_interval_ms}")
    p.add_argument("--reasoning-parser", choices=("auto", "none"),
                   default=_env(p, "reasoning_parser", d.reasoning_parser,
                                choices=("auto", "none")),
                   help="chat answers of a model whose chat template writes reasoning "
                        "(<think>...</think>): auto splits them into reasoning_content and "
                        "content; none leaves the tags in content (env "
                        "ORTSERVE_GATEWAY_REASONING_PARSER)")
    for name, what in (("ca", "the CA (PEM) the workers' certificates chain to"),
                       ("cert", "the gateway's certificate (PEM), signed by the cluster's CA"),
                       ("key", "its private key (PEM)")):
        p.add_argument(f"--worker-tls-{name}", default=_env(p, f"worker_tls_{name}", ""),
                       help=f"with --direct-to-workers, mutual TLS to the workers: {what}")
    count = in_range(int, 0, 1_000_000, what="0: nothing is kept for previous_response_id")
    p.add_argument("--responses-max", type=count,
                   default=_env(p, "responses_max", d.responses_max, kind=count),
                   help="stored responses (/v1/responses, store: true) kept at most; the oldest "
                        "is forgotten first and its session closed")
    ttl_s = Checked(float, lambda s: None if s >= 0 else f"{s:g} s must be 0 or more")
    p.add_argument("--responses-ttl-s", type=ttl_s,
                   default=_env(p, "responses_ttl_s", d.responses_ttl_s, kind=ttl_s),
                   help="how long a stored response can be continued (previous_response_id)")
    p.add_argument("--tenant-header", default=_env(p, "tenant_header", d.tenant_header),
                   help="pass this HTTP header's value to the scheduler as the request's tenant "
                        "(ortserve-tenant metadata; the scheduler's tenants file must trust it: "
                        "docs/features/tenants.md); set only behind a proxy that sets the header itself; "
                        f"unset: none (env {_ENV}TENANT_HEADER)")
    processes = in_range(int, 1, 64, what="gateway processes")
    p.add_argument("--processes", type=processes,
                   default=_env(p, "processes", d.processes, kind=processes),
                   help="gateway processes accepting on the one port (1-64): what outlives a "
                        "request (stored responses) is the scheduler's, so N processes serve ~N "
                        "cores' worth of streams; each has its own channels and metrics")
    p.add_argument("--model-server-worker-id",
                   default=_env(p, "model_server_worker_id", d.model_server_worker_id),
                   help="this gateway stands in front of that worker (its pod, behind an "
                        "inference gateway's endpoint picker): /metrics adds the worker's "
                        "ortserve_model_server_* gauges, read from GetBudget at each scrape "
                        "(docs/operations/inference-gateway.md); unset: none "
                        f"(env {_ENV}MODEL_SERVER_WORKER_ID)")
    p.add_argument("--per-request-metrics", action=argparse.BooleanOptionalAction,
                   default=_env(p, "per_request_metrics", d.per_request_metrics, kind=boolean),
                   help="every chat and completion answer carries `metrics` (vLLM's "
                        "--enable-per-request-metrics fields: time_to_first_token_ms, "
                        "generation_time_ms, queue_time_ms, mean_itl_ms, tokens_per_second); "
                        "off: only for a request with the header X-Ortserve-Request-Metrics: "
                        f"true (env {_ENV}PER_REQUEST_METRICS)")
    add_level_argument(p, _ENV + "LOG_LEVEL", d.log_level)
    tracing.add_argument(p, _ENV)
    p.add_argument("--log-json", action=argparse.BooleanOptionalAction,
                   default=_env(p, "log_json", None, kind=boolean))
    every_flag_from_env(p, _ENV)
    a = p.parse_args(argv)
    worker_tls = {"ca": a.worker_tls_ca, "cert": a.worker_tls_cert, "key": a.worker_tls_key}
    if any(worker_tls.values()):
        missing = [f"--worker-tls-{n}" for n, path in worker_tls.items() if not path]
        unreadable = [f"--worker-tls-{n} {path!r}" for n, path in worker_tls.items()
                      if path and not os.path.isfile(path)]
        if missing or unreadable:
            p.error(f"mutual TLS to the workers needs --worker-tls-ca, -cert and -key, readable "
                    f"files (env {_ENV}WORKER_TLS_*): {', '.join(missing + unreadable)}")
    https = {"--tls-cert": a.tls_cert, "--tls-key": a.tls_key, "--tls-client-ca": a.tls_client_ca}
    if any(https.values()):
        missing = [flag for flag in ("--tls-cert", "--tls-key") if not https[flag]]
        unreadable = [f"{flag} {path!r}" for flag, path in https.items()
                      if path and not os.path.isfile(path)]
        if missing or unreadable:
            p.error(f"HTTPS needs --tls-cert and --tls-key (--tls-client-ca for mutual TLS), "
                    f"readable files (env {_ENV}TLS_*): {', '.join(missing + unreadable)}")
    if a.cacert and not os.path.isfile(a.cacert):
        p.error(f"--cacert {a.cacert!r} is not a readable file (the CA the scheduler's "
                f"certificate chains to; env {_ENV}CACERT)")
    direct = a.direct_to_workers
    if direct is None and a.cacert and not a.worker_tls_ca:
        # A TLS cluster's workers take mutual TLS only: without a certificate for them the
        # gateway could not read from them, so its streams stay relayed.
        direct = False
    return GatewayConfig(host=a.host, port=a.port, scheduler_address=a.scheduler,
                         scheduler_cacert=a.cacert,
                         request_timeout_s=a.request_timeout_s, models_cache_s=a.models_cache_s,
                         direct_to_workers=direct, processes=a.processes,
                         stream_interval_ms=a.stream_interval_ms, worker_tls_ca=a.worker_tls_ca,
                         worker_tls_cert=a.worker_tls_cert, worker_tls_key=a.worker_tls_key,
                         tls_cert=a.tls_cert, tls_key=a.tls_key, tls_client_ca=a.tls_client_ca,
                         responses_max=a.responses_max, responses_ttl_s=a.responses_ttl_s,
                         log_level=a.log_level, log_json=a.log_json, tenant_header=a.tenant_header,
                         otlp_traces_endpoint=a.otlp_traces_endpoint,
                         reasoning_parser=a.reasoning_parser,
                         model_server_worker_id=a.model_server_worker_id,
                         per_request_metrics=a.per_request_metrics)


def https_options(config: GatewayConfig) -> dict:
    """uvicorn's TLS settings: HTTPS with a certificate, mutual TLS with a client CA."""
    if not config.tls_cert:
        return {}
    options = {"ssl_certfile": config.tls_cert, "ssl_keyfile": config.tls_key}
    if config.tls_client_ca:
        options |= {"ssl_ca_certs": config.tls_client_ca, "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return options


def main(argv: list[str] | None = None) -> None:
    config = parse_config(argv)
    configure_logging(config.log_level, config.log_json, capture_native=True)
    tracing.setup_or_exit("ortserve-gateway", config.otlp_traces_endpoint)
    # Bind first, so --port 0 can announce the port it got before serving, and so a
    # taken port is one line and exit 2 (uvicorn's own bind would be a traceback).
    try:
        sock = ports.listening_socket(config.host, config.port, "--port")
    except ports.PortUnavailable as error:
        ports.refuse("ortserve-gateway", error)
    port = sock.getsockname()[1]
    # The chosen port on stdout, one line, as the scheduler and workers do.
    banner.announce(banner.Banner(f"{config.host}:{port}"), "gateway")
    if config.processes == 1:
        _serve(config, sock)
        return
    # N copies accepting on the same listening socket (the kernel spreads connections over
    # every process waiting in accept); this one only passes signals on and waits. What
    # outlives a request (stored responses) is the scheduler's: they share nothing else.
    children = []
    for _ in range(config.processes):
        pid = os.fork()
        if pid == 0:
            _die_with_parent()
            _serve(config, sock)
            os._exit(0)
        children.append(pid)

    def pass_on(signum, _frame) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, pass_on)
    for child in children:
        os.waitpid(child, 0)


def _die_with_parent() -> None:
    """A SIGKILLed parent takes its copies with it (Linux prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


def _serve(config: GatewayConfig, sock) -> None:
    # NOTE: without a graceful-shutdown bound uvicorn waits for every open SSE stream
    # on SIGTERM, however long it runs; streams get 30 s, then they are cut.
    server = uvicorn.Server(uvicorn.Config(build_app(config), log_config=None, access_log=False,
                                           log_level=config.log_level,
                                           timeout_graceful_shutdown=30, **https_options(config)))
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
