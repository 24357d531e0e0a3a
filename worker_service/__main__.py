"""ortserve-worker: argv and environment -> WorkerConfig -> a running worker.

Every flag has an environment variable (ORTSERVE_WORKER_<FLAG>, and
ORTSERVE_SCHEDULER_ADDRESS for --scheduler); a flag overrides its variable.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path

import structlog

from ortserve.process import banner, ports, tracing
from ortserve.process.env_defaults import Checked, boolean, every_flag_from_env, from_env, in_range
from ortserve.process.logs import add_level_argument, configure_logging, json_enabled
from ortserve.process.version import package_version
from ortserve.rpc import keepalive
from ortserve.rpc.tls import TlsFiles
from ortserve.rpc.tls import add_arguments as add_tls_arguments
from ortserve.status.units import parse_bytes
from worker_service.config import WorkerConfig
from worker_service.core.errors import EngineError, InvalidWorkerField
from worker_service.runtime import lora
from worker_service.runtime.rate_set_runner import BENCH_ENV
from worker_service.server import build_server

# One word, "capacity", for what --kv-capacity sets, the ledger charges against and
# the protos call capacity_bytes; the "budget" spellings still work for existing
# deployments, and say they are deprecated.
_DEPRECATED = "{old} is deprecated: use {new} (same meaning)"


def _first_given(notices: list[str], *candidates: tuple[object, str | None]) -> str | None:
    """The first given value of (value, deprecation notice or None) pairs, in precedence
    order; each deprecated name that was given adds its notice."""
    notices += [notice for value, notice in candidates if value is not None and notice]
    return next((str(value) for value, _ in candidates if value is not None), None)


def _lora_flag(text: str) -> tuple[str, str]:
    """--lora NAME=PATH (and each item of ORTSERVE_WORKER_LORA) -> (name, path)."""
    try:
        return lora.parse_lora_flag(text)
    except InvalidWorkerField as error:
        raise argparse.ArgumentTypeError(error.message.removeprefix("--lora: ")) from None


def _keepalive_problem(interval_s: float) -> str | None:
    try:
        keepalive.channel_options(interval_s)
    except ValueError as error:
        return str(error)
    return None


def parse_config(argv: list[str] | None = None, notices: list[str] | None = None) -> WorkerConfig:
    """argv and the environment -> WorkerConfig; deprecated names used are appended to
    `notices` (main logs them once logging is configured)."""
    notices = [] if notices is None else notices
    d = WorkerConfig(model_dir=Path("."))
    p = argparse.ArgumentParser(prog="ortserve-worker", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    p.add_argument("--model-dir", default=from_env(p, "ORTSERVE_WORKER_MODEL_DIR"),
                   help="a model folder written by the onnxruntime-genai model builder")
    p.add_argument("--scheduler", default=from_env(p, "ORTSERVE_SCHEDULER_ADDRESS", d.scheduler_address),
                   help="the scheduler's internal host:port (its --internal-port)")
    add_tls_arguments(p, "ORTSERVE_WORKER_", {
        "cert": "this worker's certificate (PEM; its port, and its client certificate towards "
                "the scheduler)",
        "key": "its private key (PEM)",
        "ca": "the CA the scheduler's certificate (and every caller's client certificate: "
              "mutual TLS) must chain to"})
    p.add_argument("--host", default=from_env(p, "ORTSERVE_WORKER_HOST", d.host))
    p.add_argument("--port", type=int, default=from_env(p, "ORTSERVE_WORKER_PORT", d.port),
                   help="0 picks a free port")
    p.add_argument("--advertise-address", default=from_env(p, "ORTSERVE_WORKER_ADVERTISE_ADDRESS", ""),
                   help="host:port the scheduler should dial (default: --host:--port, or this host's IP)")
    p.add_argument("--worker-id", default=from_env(p, "ORTSERVE_WORKER_ID", ""))
    p.add_argument("--device", choices=["auto", "cpu", "cuda"],
                   default=from_env(p, "ORTSERVE_WORKER_DEVICE", d.device, choices=("auto", "cpu", "cuda")),
                   help="cuda is an error where CUDA is unavailable (never a silent CPU fallback)")
    p.add_argument("--device-id", type=int, default=from_env(p, "ORTSERVE_WORKER_DEVICE_ID", d.device_id))
    p.add_argument("--threads", type=int, default=from_env(p, "ORTSERVE_WORKER_THREADS", d.intra_op_threads),
                   help="ORT intra-op threads; 0 = every usable core")
    p.add_argument("--spin-wait", choices=["on", "off"],
                   default=from_env(p, "ORTSERVE_WORKER_SPIN_WAIT", "on" if d.intra_op_spinning else "off",
                                choices=("on", "off")),
                   help="ORT's pool threads spin-wait for work between parallel sections (on: "
                        "ORT's default); off yields the cores to other processes on a shared "
                        "machine (docs/benchmarks.md)")
    p.add_argument("--cuda-graphs", choices=["on", "off"],
                   default=from_env(p, "ORTSERVE_WORKER_CUDA_GRAPHS", "on" if d.cuda_graphs else "off",
                                choices=("on", "off")),
                   help="CUDA: decode steps replay one CUDA graph per batch-size bucket, captured "
                        "at start (on); off launches every kernel each step. No effect on the "
                        "CPU (docs/kv-arena.md, 'The decode step')")
    p.add_argument("--speculative", choices=["ngram", "off"],
                   default=from_env(p, "ORTSERVE_WORKER_SPECULATIVE", d.speculative,
                                    choices=("ngram", "off")),
                   help="speculative decoding: ngram proposes tokens from the sequence's own "
                        "earlier text and verifies several in one model run (greedy output "
                        "unchanged, sampling's distribution kept); off: one run per token "
                        "(docs/features/speculative-decoding.md; env ORTSERVE_WORKER_SPECULATIVE)")
    rows = in_range(int, 1, 1024, what="sequences running at once")
    p.add_argument("--max-batch-rows", type=rows,
                   default=from_env(p, "ORTSERVE_WORKER_MAX_BATCH_ROWS", d.max_batch_rows, kind=rows),
                   help="the most sequences running at once (the CPU KV arena's rows); admitted "
                        "ones beyond wait for a row in arrival order (vLLM's --max-num-seqs; "
                        "env ORTSERVE_WORKER_MAX_BATCH_ROWS)")
    context = in_range(int, 0, 10_000_000, " tokens", "0: the model's context length")
    p.add_argument("--max-context-tokens", type=context,
                   default=from_env(p, "ORTSERVE_WORKER_MAX_CONTEXT_TOKENS", d.max_context_tokens,
                                    kind=context),
                   help="the context this worker serves, at most the model's (0: the model's); "
                        "on CUDA each KV row is this long and allocated whole, so a shorter "
                        "context holds more rows (vLLM's --max-model-len; env "
                        "ORTSERVE_WORKER_MAX_CONTEXT_TOKENS)")
    p.add_argument("--lora", action="append", default=[], metavar="NAME=PATH", type=_lora_flag,
                   help="serve a LoRA adapter (an .onnx_adapter file) as NAME; repeatable. The "
                        "model folder must take its LoRA weights as inputs (make lora-demo); "
                        "a request names it in GenerateRequest.adapter; its bytes come out of "
                        "the KV capacity (env ORTSERVE_WORKER_LORA, a comma list)")
    p.add_argument("--kv-capacity",
                   help="KV-cache bytes this worker lets sequences hold (its capacity_bytes in "
                        "the ledger), e.g. 2GiB (env ORTSERVE_WORKER_KV_CAPACITY)")
    p.add_argument("--kv-capacity-fraction", type=float,
                   help="without --kv-capacity: this fraction of available (device) memory "
                        f"(default {d.kv_capacity_fraction:g}; env "
                        "ORTSERVE_WORKER_KV_CAPACITY_FRACTION)")
    p.add_argument("--kv-budget", help=argparse.SUPPRESS)  # deprecated: --kv-capacity
    p.add_argument("--kv-budget-fraction", help=argparse.SUPPRESS)  # deprecated
    p.add_argument("--metrics-port", type=int,
                   default=from_env(p, "ORTSERVE_WORKER_METRICS_PORT", None, kind=int),
                   help="serve Prometheus metrics on this port (0: any free port); off if unset")
    tracing.add_argument(p, "ORTSERVE_WORKER_")
    p.add_argument("--drain-timeout-s", type=float,
                   default=from_env(p, "ORTSERVE_WORKER_DRAIN_TIMEOUT_S", d.drain_timeout_s),
                   help="on SIGTERM, how long live streams may run before they are cut")
    interval_s = Checked(float, _keepalive_problem)
    p.add_argument("--caller-keepalive-s", type=interval_s,
                   default=from_env(p, "ORTSERVE_WORKER_CALLER_KEEPALIVE_S",
                                    d.caller_keepalive_s, kind=interval_s),
                   help="ping each caller's connection (the scheduler's relay, a gateway's or "
                        "client's direct calls) this often while its calls run; one that does "
                        "not answer within as long (its host gone, its process stopped) has its "
                        "streams cancelled and their KV freed in about twice this, not when "
                        f"they would end (default {d.caller_keepalive_s:g}); 0: off, else "
                        f"{keepalive.MIN_INTERVAL_S:g} to {keepalive.MAX_INTERVAL_S:g} "
                        "(env ORTSERVE_WORKER_CALLER_KEEPALIVE_S)")
    p.add_argument("--session-swap-bytes", default=from_env(p, "ORTSERVE_WORKER_SESSION_SWAP_BYTES"),
                   help="host memory idle sessions may be swapped out to, e.g. 256MiB; beyond it "
                        "a swapped-out session's KV is dropped and its next turn recomputes")
    p.add_argument("--session-dir", default=from_env(p, "ORTSERVE_WORKER_SESSION_DIR", ""),
                   help="the disk tier of parked sessions: a folder where idle sessions' K/V "
                        "is written (one checked file each) and found again after a restart "
                        "(docs/features/sessions.md); off if unset")
    p.add_argument("--session-disk-bytes", default=from_env(p, "ORTSERVE_WORKER_SESSION_DISK_BYTES"),
                   help=f"bytes the --session-dir files may take, e.g. 4GiB (default "
                        f"{d.session_disk_bytes // 2**30} GiB); beyond it a session stays in "
                        "memory, or is dropped when host memory has no room either")
    p.add_argument("--session-disk-after-s", type=float,
                   default=from_env(p, "ORTSERVE_WORKER_SESSION_DISK_AFTER_S",
                                    d.session_disk_after_s, kind=float),
                   help="seconds a session stays idle in memory before it is written to "
                        f"--session-dir and its memory freed (default {d.session_disk_after_s:g})")
    p.add_argument("--prefix-cache-bytes", default=from_env(p, "ORTSERVE_WORKER_PREFIX_CACHE_BYTES"),
                   help="KV bytes the automatic prefix cache may keep, inside --kv-capacity "
                        "(evicted whenever a request needs them), e.g. 512MiB; 0 turns it off "
                        "(default: half the KV capacity; docs/features/prefix-cache.md)")
    p.add_argument("--bench-rate-set-tokens-per-s", type=float, default=0.0,
                   help=f"benchmarks only, with {BENCH_ENV}=1 in the environment: run no model; "
                        "every stream gets this many tokens a second (the prompt's ids cycled, "
                        "sampling not applied) to measure the served path apart from the model")
    add_level_argument(p, "ORTSERVE_WORKER_LOG_LEVEL", d.log_level)
    p.add_argument("--log-json", action=argparse.BooleanOptionalAction,
                   default=from_env(p, "ORTSERVE_WORKER_LOG_JSON", kind=boolean))
    every_flag_from_env(p, "ORTSERVE_WORKER_", skip=("scheduler",))  # its own: ORTSERVE_SCHEDULER_ADDRESS
    a = p.parse_args(argv)
    if a.bench_rate_set_tokens_per_s:
        if os.environ.get(BENCH_ENV) != "1":
            p.error(f"--bench-rate-set-tokens-per-s is for benchmarks only: it runs no model and "
                    f"ignores sampling; set {BENCH_ENV}=1 to take it (bench.served.dataplane does)")
        if not 0 < a.bench_rate_set_tokens_per_s <= 100_000:
            p.error(f"--bench-rate-set-tokens-per-s {a.bench_rate_set_tokens_per_s:g}: give more "
                    "than 0 and at most 100000 tokens a second per stream")
    lora_adapters = tuple(a.lora)
    if len({name for name, _ in lora_adapters}) != len(lora_adapters):
        p.error(f"--lora: a name is given twice ({', '.join(n for n, _ in lora_adapters)})")
    if not a.model_dir:
        p.error("--model-dir (or ORTSERVE_WORKER_MODEL_DIR) is required; `make model` prepares "
                "the default under $ORTSERVE_MODEL_CACHE/models/")
    kv_capacity = _first_given(
        notices, (a.kv_capacity, None),
        (a.kv_budget, _DEPRECATED.format(old="--kv-budget", new="--kv-capacity")),
        (from_env(p, "ORTSERVE_WORKER_KV_CAPACITY"), None),
        (from_env(p, "ORTSERVE_WORKER_KV_BUDGET"), _DEPRECATED.format(
            old="ORTSERVE_WORKER_KV_BUDGET", new="ORTSERVE_WORKER_KV_CAPACITY")))
    fraction = _first_given(
        notices, (a.kv_capacity_fraction, None),
        (a.kv_budget_fraction, _DEPRECATED.format(old="--kv-budget-fraction",
                                                  new="--kv-capacity-fraction")),
        (from_env(p, "ORTSERVE_WORKER_KV_CAPACITY_FRACTION"), None),
        (from_env(p, "ORTSERVE_WORKER_KV_BUDGET_FRACTION"), _DEPRECATED.format(
            old="ORTSERVE_WORKER_KV_BUDGET_FRACTION", new="ORTSERVE_WORKER_KV_CAPACITY_FRACTION")))
    try:
        kv_capacity_bytes = parse_bytes(kv_capacity) if kv_capacity else None
    except ValueError as error:
        p.error(f"--kv-capacity: {error}")
    try:
        fraction = d.kv_capacity_fraction if fraction is None else float(fraction)
    except ValueError:
        p.error(f"--kv-capacity-fraction {fraction!r} is not a number")
    try:
        swap = parse_bytes(a.session_swap_bytes) if a.session_swap_bytes else d.session_swap_bytes
    except ValueError as error:
        p.error(f"--session-swap-bytes: {error}")
    try:
        prefix_cache = parse_bytes(a.prefix_cache_bytes) if a.prefix_cache_bytes else None
    except ValueError as error:
        p.error(f"--prefix-cache-bytes: {error}")
    try:
        disk_bytes = (parse_bytes(a.session_disk_bytes) if a.session_disk_bytes
                      else d.session_disk_bytes)
    except ValueError as error:
        p.error(f"--session-disk-bytes: {error}")
    if a.session_disk_after_s < 0:
        p.error(f"--session-disk-after-s {a.session_disk_after_s:g}: give 0 or more seconds")
    tls = TlsFiles(cert=a.tls_cert, key=a.tls_key, ca=a.tls_ca)
    try:
        tls.check("ortserve-worker", need_ca=True)
    except ValueError as error:
        p.error(str(error))
    return WorkerConfig(
        model_dir=Path(a.model_dir), scheduler_address=a.scheduler, host=a.host, port=a.port,
        advertise_address=a.advertise_address, worker_id=a.worker_id, device=a.device,
        device_id=a.device_id, intra_op_threads=a.threads, intra_op_spinning=a.spin_wait == "on",
        cuda_graphs=a.cuda_graphs == "on",
        kv_capacity_bytes=kv_capacity_bytes,
        kv_capacity_fraction=fraction, max_batch_rows=a.max_batch_rows,
        max_context_tokens=a.max_context_tokens, lora=lora_adapters, speculative=a.speculative,
        drain_timeout_s=a.drain_timeout_s, caller_keepalive_s=a.caller_keepalive_s,
        metrics_port=a.metrics_port, session_swap_bytes=swap, prefix_cache_bytes=prefix_cache,
        session_dir=a.session_dir, session_disk_bytes=disk_bytes,
        session_disk_after_s=a.session_disk_after_s,
        bench_rate_set_tokens_per_s=a.bench_rate_set_tokens_per_s,
        log_level=a.log_level, log_json=a.log_json, tls=tls,
        otlp_traces_endpoint=a.otlp_traces_endpoint,
    )


async def _serve(config: WorkerConfig) -> int:
    running, lifecycle = await build_server(config)
    banner.announce(banner.Banner(f"{config.host}:{running.port}"), "worker")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait({stopper, lifecycle}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if lifecycle in done and lifecycle.exception() is not None:
        error = lifecycle.exception()
        structlog.get_logger("worker").error("worker cannot serve", error=str(error),
                                             kind=type(error).__name__)
        if not json_enabled():  # with JSON logs, the line above says it (stderr stays JSON)
            print(f"ortserve-worker: {error}", file=sys.stderr)
        code = 2 if isinstance(error, EngineError) else 1
    stopper.cancel()
    if code == 0:
        await running.drain(config.drain_timeout_s)
    await running.stop()
    return code


def main(argv: list[str] | None = None) -> None:
    notices: list[str] = []
    config = parse_config(argv, notices)
    configure_logging(config.log_level, config.log_json, capture_native=True)
    tracing.setup_or_exit("ortserve-worker", config.otlp_traces_endpoint)
    for notice in notices:  # a log line: with JSON logs, stderr stays JSON
        structlog.get_logger("worker").warning(notice)
    try:
        ports.check_all_free(config.host, [("--port", config.port),
                                           ("--metrics-port", config.metrics_port)])
        code = asyncio.run(_serve(config))
    except ports.PortUnavailable as error:
        ports.refuse("ortserve-worker", error)
    sys.exit(code)


if __name__ == "__main__":
    main()
