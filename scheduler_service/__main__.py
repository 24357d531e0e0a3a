"""ortserve-scheduler: argv and environment -> SchedulerConfig -> a running scheduler.

Every flag has an environment variable of the same name (ORTSERVE_SCHEDULER_<FLAG>);
a flag overrides its variable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

from ortserve.process import banner, ports, tracing
from ortserve.process.env_defaults import Checked, boolean, every_flag_from_env, from_env
from ortserve.process.logs import add_level_argument, configure_logging
from ortserve.process.version import package_version
from ortserve.rpc import keepalive
from ortserve.rpc.auth import load_keys
from ortserve.rpc.tls import TlsFiles
from ortserve.rpc.tls import add_arguments as add_tls_arguments
from scheduler_service import default_tokens, tenant_of
from scheduler_service.adapter_catalog import AdapterCatalog
from scheduler_service.config import SchedulerConfig
from scheduler_service.ledger import tenants
from scheduler_service.server import build_server

_ENV = "ORTSERVE_SCHEDULER_"


def _env(p: argparse.ArgumentParser, name: str, default, **checks):
    return from_env(p, _ENV + name.upper(), default, **checks)


def _not_negative(value: float) -> str | None:
    return None if value >= 0 else f"{value:g} is below 0"  # NaN included


def _keepalive_problem(interval_s: float) -> str | None:
    try:
        keepalive.channel_options(interval_s)
    except ValueError as error:
        return str(error)
    return None


def parse_config(argv: list[str] | None = None) -> SchedulerConfig:
    d = SchedulerConfig()
    p = argparse.ArgumentParser(prog="ortserve-scheduler", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    p.add_argument("--host", default=_env(p, "host", d.host), help="address to bind (env ORTSERVE_SCHEDULER_HOST)")
    p.add_argument("--port", type=int, default=_env(p, "port", d.port), help="port; 0 picks a free one")
    p.add_argument("--internal-port", type=int, default=_env(p, "internal_port", d.internal_port),
                   help="the worker-facing SchedulerInternal service's port (workers' --scheduler "
                        "points here); 0 picks a free one (env ORTSERVE_SCHEDULER_INTERNAL_PORT)")
    p.add_argument("--api-keys-file", default=_env(p, "api_keys_file", ""),
                   help="client API keys, one 'role:key' per line (roles: generate, admin); "
                        "also read from env ORTSERVE_SCHEDULER_API_KEYS; none: open to all")
    add_tls_arguments(p, _ENV, {
        "cert": "this scheduler's certificate (PEM; both ports, and its client certificate "
                "towards workers)",
        "key": "its private key (PEM)",
        "ca": "the CA workers' certificates must chain to (the internal port requires one: "
              "mutual TLS)"})
    p.add_argument("--heartbeat-interval-s", type=float, default=_env(p, "heartbeat_interval_s", d.heartbeat_interval_s))
    p.add_argument("--lease-ttl-s", type=float, default=_env(p, "lease_ttl_s", d.lease_ttl_s),
                   help="a worker silent this long is dropped and its leases return")
    p.add_argument("--claim-ttl-s", type=float, default=_env(p, "claim_ttl_s", d.claim_ttl_s),
                   help="an admitted lease no worker claimed this long is dropped")
    p.add_argument("--retry-after-s", type=float, default=_env(p, "retry_after_s", d.retry_after_s))
    length = Checked(int, _not_negative)
    p.add_argument("--max-queue-length", type=length,
                   default=_env(p, "max_queue_length", d.max_queue_length, kind=length),
                   help="requests that may wait for KV budget at once; beyond: QUEUE_FULL "
                        "(env ORTSERVE_SCHEDULER_MAX_QUEUE_LENGTH)")
    wait_s = Checked(float, _not_negative)
    p.add_argument("--max-queue-wait-s", type=wait_s,
                   default=_env(p, "max_queue_wait_s", d.max_queue_wait_s, kind=wait_s),
                   help="the longest a request waits for KV budget (its deadline may be "
                        "shorter); then QUEUE_TIMEOUT; 0: never wait "
                        "(env ORTSERVE_SCHEDULER_MAX_QUEUE_WAIT_S)")
    goal_ms = Checked(int, _not_negative)
    p.add_argument("--max-itl-ms", type=goal_ms,
                   default=_env(p, "max_itl_ms", d.max_itl_ms, kind=goal_ms),
                   help="the default gap goal between a stream's tokens, ms, for requests that "
                        "set no max_itl_ms: a request starts only where the worker's measured "
                        "decode step with it keeps every stream's goal, else it waits or is "
                        "refused (docs/features/time-budget.md); 0 (the default): no goal, "
                        "admission by KV bytes alone (env ORTSERVE_SCHEDULER_MAX_ITL_MS)")
    p.add_argument("--max-ttft-ms", type=goal_ms,
                   default=_env(p, "max_ttft_ms", d.max_ttft_ms, kind=goal_ms),
                   help="the default time-to-first-token goal, ms, for requests that set no "
                        "max_ttft_ms: a request whose estimated wait passes it is refused at "
                        "once (TIME_BUSY) rather than left waiting; 0 (the default): none "
                        "(env ORTSERVE_SCHEDULER_MAX_TTFT_MS)")
    aging_s = Checked(float, _not_negative)
    p.add_argument("--queue-aging-s", type=aging_s,
                   default=_env(p, "queue_aging_s", d.queue_aging_s, kind=aging_s),
                   help="a request waiting this long goes ahead of every priority and tenant "
                        "share, so a low priority never waits past it while it fits "
                        "(env ORTSERVE_SCHEDULER_QUEUE_AGING_S)")
    p.add_argument("--tenants-file", default=_env(p, "tenants_file", d.tenants_file),
                   help="tenants, their KV quotas and weights (TOML, docs/features/tenants.md); read at "
                        "start and again on SIGHUP (a refused reload keeps the tenants in "
                        "force); none: no tenants (env ORTSERVE_SCHEDULER_TENANTS_FILE)")
    p.add_argument("--adapter-catalog", default=_env(p, "adapter_catalog", ""),
                   help="LoRA adapters loaded on demand: a TOML file ([adapters.NAME] path, "
                        "model) or a folder of NAME.onnx_adapter files, paths as the workers "
                        "see them; a request naming one that no worker serves loads it on the "
                        "worker with the most free bytes first (docs/features/lora.md); none: "
                        "only adapters loaded already (env ORTSERVE_SCHEDULER_ADAPTER_CATALOG)")
    p.add_argument("--default-max-new-tokens", action="append", metavar="[MODEL=]N",
                   help="the ceiling of a request that sets no max_new_tokens (within the "
                        "remaining context window): N for every model, MODEL=N for one "
                        f"(repeatable); 0: none, the whole remaining window (default "
                        f"{default_tokens.DEFAULT_TOKENS}; env "
                        "ORTSERVE_SCHEDULER_DEFAULT_MAX_NEW_TOKENS, a comma list)")
    p.add_argument("--session-ttl-s", type=float, default=_env(p, "session_ttl_s", d.session_ttl_s),
                   help="an idle session is closed and its bytes released after this long")
    p.add_argument("--relay-calls", choices=("shared", "per-request"),
                   default=_env(p, "relay_calls", d.relay_calls, choices=("shared", "per-request")),
                   help="shared: the relayed requests to a worker share one Worker.Relay call "
                        "(one message per engine step for all of them); per-request: a "
                        "Worker.Generate call each (env ORTSERVE_SCHEDULER_RELAY_CALLS)")
    interval_s = Checked(float, _keepalive_problem)
    p.add_argument("--worker-keepalive-s", type=interval_s,
                   default=_env(p, "worker_keepalive_s", d.worker_keepalive_s, kind=interval_s),
                   help="ping each worker's connection this often while requests run on it; "
                        "one that does not answer within as long (a host gone, a process "
                        "stopped) fails its streams UNAVAILABLE instead of leaving them to "
                        f"their deadlines; 0: off, else {keepalive.MIN_INTERVAL_S:g} to {keepalive.MAX_INTERVAL_S:g} "
                        "(env ORTSERVE_SCHEDULER_WORKER_KEEPALIVE_S)")
    add_level_argument(p, _ENV + "LOG_LEVEL", d.log_level)
    p.add_argument("--metrics-port", type=int, default=_env(p, "metrics_port", None, kind=int),
                   help="serve Prometheus metrics on this port (0: any free port); off if unset")
    p.add_argument("--drain-timeout-s", type=float,
                   default=_env(p, "drain_timeout_s", d.drain_timeout_s),
                   help="on SIGTERM, how long relayed streams may run before they are cut")
    tracing.add_argument(p, _ENV)
    p.add_argument("--log-json", action=argparse.BooleanOptionalAction,
                   default=_env(p, "log_json", None, kind=boolean))
    # --default-max-new-tokens reads its own variable below (merged with the flags item by item).
    every_flag_from_env(p, _ENV, skip=("default_max_new_tokens",))
    a = p.parse_args(argv)
    try:
        # Flags override the variable item by item: MODEL=N items merge, a plain N replaces.
        defaults = default_tokens.parse([os.environ.get(_ENV + "DEFAULT_MAX_NEW_TOKENS", ""),
                                         *(a.default_max_new_tokens or [])])
    except ValueError as error:
        p.error(f"--default-max-new-tokens (or {_ENV}DEFAULT_MAX_NEW_TOKENS): {error}")
    tls = TlsFiles(cert=a.tls_cert, key=a.tls_key, ca=a.tls_ca)
    try:
        tls.check("ortserve-scheduler", need_ca=True)
        keys = load_keys(a.api_keys_file, os.environ.get(_ENV + "API_KEYS"))
        catalog = AdapterCatalog.load(a.adapter_catalog)
    except (OSError, ValueError) as error:
        p.error(str(error))
    try:
        table = tenants.load(a.tenants_file) if a.tenants_file else tenants.TenantTable()
    except OSError as error:  # a bare "[Errno 2] ..." named neither the flag nor its variable
        p.error(f"--tenants-file (env {_ENV}TENANTS_FILE): cannot read {a.tenants_file!r}: "
                f"{error.strerror}; give a readable TOML tenants file (docs/features/tenants.md), "
                "or neither for no tenants")
    except ValueError as error:
        p.error(f"--tenants-file: {error}")
    return SchedulerConfig(host=a.host, port=a.port, internal_port=a.internal_port,
                           api_keys=keys, tls=tls, heartbeat_interval_s=a.heartbeat_interval_s,
                           lease_ttl_s=a.lease_ttl_s, claim_ttl_s=a.claim_ttl_s,
                           retry_after_s=a.retry_after_s, drain_timeout_s=a.drain_timeout_s,
                           metrics_port=a.metrics_port, log_level=a.log_level, log_json=a.log_json,
                           max_queue_length=a.max_queue_length, max_queue_wait_s=a.max_queue_wait_s,
                           session_ttl_s=a.session_ttl_s, default_max_new_tokens=defaults, relay_calls=a.relay_calls,
                           worker_keepalive_s=a.worker_keepalive_s,
                           queue_aging_s=a.queue_aging_s, tenants_file=a.tenants_file,
                           max_itl_ms=a.max_itl_ms, max_ttft_ms=a.max_ttft_ms,
                           tenants=table, adapter_catalog=catalog,
                           otlp_traces_endpoint=a.otlp_traces_endpoint)


async def _serve(config: SchedulerConfig) -> None:
    running = await build_server(config)
    # The chosen ports on stdout, one line (JSON with JSON logs), for scripts that
    # started us with --port 0: ortserve.process.banner.parse reads it.
    banner.announce(banner.Banner(f"{config.host}:{running.port}",
                                  f"{config.host}:{running.internal_port}"), "scheduler")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if config.tenants_file:
        def reload_tenants() -> None:
            if tenant_of.reload(running.ledger, config.tenants_file):
                running.kick()  # new quotas or weights: the queue may move
        loop.add_signal_handler(signal.SIGHUP, reload_tenants)
    await stop.wait()
    await running.stop(config.drain_timeout_s)


def main(argv: list[str] | None = None) -> None:
    config = parse_config(argv)
    configure_logging(config.log_level, config.log_json, capture_native=True)
    tracing.setup_or_exit("ortserve-scheduler", config.otlp_traces_endpoint)
    try:
        # Before anything starts: a taken port is one line and exit 2, never a second
        # ledger sharing the port (see ortserve/process/ports.py).
        ports.check_all_free(config.host, [("--port", config.port),
                                           ("--internal-port", config.internal_port),
                                           ("--metrics-port", config.metrics_port)])
        asyncio.run(_serve(config))
    except ports.PortUnavailable as error:
        ports.refuse("ortserve-scheduler", error)


if __name__ == "__main__":
    main()
