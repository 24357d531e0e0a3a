"""ortserve-gateway: argv and environment -> GatewayConfig -> uvicorn serving the app.

Every flag has an environment variable ORTSERVE_GATEWAY_<FLAG>; a flag overrides
its variable. --scheduler falls back to ORTSERVE_SCHEDULER_ADDRESS, the variable
the workers read, so one setting points a whole deployment at its scheduler.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import uvicorn

from ortserve import banner, ports, tracing
from ortserve.env_defaults import boolean, from_env
from ortserve.logs import configure_logging
from ortserve.request_rules import MAX_STREAM_INTERVAL_MS
from ortserve.version import package_version

from .app import build_app
from .config import GatewayConfig

_ENV = "ORTSERVE_GATEWAY_"


def _env(p: argparse.ArgumentParser, name: str, default, **checks):
    return from_env(p, _ENV + name.upper(), default, **checks)


def parse_config(argv: list[str] | None = None) -> GatewayConfig:
    d = GatewayConfig()
    p = argparse.ArgumentParser(prog="ortserve-gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    p.add_argument("--host", default=_env(p, "host", d.host), help="address to bind")
    p.add_argument("--port", type=int, default=_env(p, "port", d.port), help="HTTP port; 0 picks a free one")
    p.add_argument("--scheduler", default=_env(p, "scheduler", os.environ.get(
        "ORTSERVE_SCHEDULER_ADDRESS", d.scheduler_address)), help="the scheduler's host:port")
    p.add_argument("--cacert", default=_env(p, "cacert", d.scheduler_cacert),
                   help="TLS to the scheduler: the CA (PEM) its certificate chains to; "
                        "empty: plaintext")
    p.add_argument("--request-timeout-s", type=float,
                   default=_env(p, "request_timeout_s", d.request_timeout_s),
                   help="deadline of one generation's gRPC call")
    p.add_argument("--models-cache-s", type=float, default=_env(p, "models_cache_s", d.models_cache_s))
    p.add_argument("--direct-to-workers", action=argparse.BooleanOptionalAction,
                   default=_env(p, "direct_to_workers", d.direct_to_workers, kind=boolean),
                   help="the two-step path: Admit on the scheduler, then stream from the worker "
                        "directly (the scheduler relays no token; the gateway must reach the "
                        "workers' addresses)")
    p.add_argument("--stream-interval-ms", type=int,
                   default=_env(p, "stream_interval_ms", d.stream_interval_ms),
                   help="the shortest time between two streamed chunks, for every request (the "
                        "tokens meanwhile leave as one SSE event: fewer messages; the first "
                        "token never waits); 0: every token as it comes; at most 10,000")
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
    p.add_argument("--log-level", default=_env(p, "log_level", d.log_level))
    tracing.add_argument(p, _ENV)
    p.add_argument("--log-json", action=argparse.BooleanOptionalAction,
                   default=_env(p, "log_json", None, kind=boolean))
    a = p.parse_args(argv)
    if not 0 <= a.port <= 65_535:
        p.error(f"--port {a.port} is not a TCP port from 0 to 65,535 (0: any free port)")
    if not 0 <= a.stream_interval_ms <= MAX_STREAM_INTERVAL_MS:
        p.error(f"--stream-interval-ms {a.stream_interval_ms} is outside 0 to "
                f"{MAX_STREAM_INTERVAL_MS:,} ms (0: every token as it comes)")
    if a.request_timeout_s <= 0:
        p.error(f"--request-timeout-s {a.request_timeout_s:g} must be above 0")
    worker_tls = {"ca": a.worker_tls_ca, "cert": a.worker_tls_cert, "key": a.worker_tls_key}
    if any(worker_tls.values()):
        missing = [f"--worker-tls-{n}" for n, path in worker_tls.items() if not path]
        unreadable = [f"--worker-tls-{n} {path!r}" for n, path in worker_tls.items()
                      if path and not os.path.isfile(path)]
        if missing or unreadable:
            p.error(f"mutual TLS to the workers needs --worker-tls-ca, -cert and -key, readable "
                    f"files (env {_ENV}WORKER_TLS_*): {', '.join(missing + unreadable)}")
    if a.cacert and not os.path.isfile(a.cacert):
        p.error(f"--cacert {a.cacert!r} is not a readable file (the CA the scheduler's "
                f"certificate chains to; env {_ENV}CACERT)")
    return GatewayConfig(host=a.host, port=a.port, scheduler_address=a.scheduler,
                         scheduler_cacert=a.cacert,
                         request_timeout_s=a.request_timeout_s, models_cache_s=a.models_cache_s,
                         direct_to_workers=a.direct_to_workers,
                         stream_interval_ms=a.stream_interval_ms, worker_tls_ca=a.worker_tls_ca,
                         worker_tls_cert=a.worker_tls_cert, worker_tls_key=a.worker_tls_key,
                         log_level=a.log_level, log_json=a.log_json,
                         otlp_traces_endpoint=a.otlp_traces_endpoint,
                         reasoning_parser=a.reasoning_parser)


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
    # NOTE: without a graceful-shutdown bound uvicorn waits for every open SSE stream
    # on SIGTERM, however long it runs; streams get 30 s, then they are cut.
    server = uvicorn.Server(uvicorn.Config(build_app(config), log_config=None, access_log=False,
                                           log_level=config.log_level,
                                           timeout_graceful_shutdown=30))
    asyncio.run(server.serve(sockets=[sock]))


if __name__ == "__main__":
    main()
