"""The served path apart from the model: a worker that emits tokens at a set rate.

  python -m bench.served.dataplane --rate-set-only [--quick]

The worker runs the bench-only rate-set runner (`--bench-rate-set-tokens-per-s`,
taken only with ORTSERVE_BENCH=1: no ORT run, every running stream gets a token
per tick), so what is measured is the path: the engine's Python around a step,
the worker's streams, the scheduler, the gateway. Loads: 32 and 128 streams at
200 tokens/s each, `new_tokens` tokens per stream, through each path on the
same processes, interleaved round by round:

  gateway_default HTTP -> the gateway as it starts with no token-path flags
  gateway_relay   HTTP /v1/completions (stream) -> gateway -> scheduler (relays) -> worker
  gateway_direct  HTTP -> gateway (--direct-to-workers: Admit, then the worker) -> worker
  client_relay    Python client -> Scheduler.Generate (relays) -> worker
  client_default  Python client, Client() as it is made with no token-path arguments
  client_direct   Python client, the two-step path: Admit, then Worker.Relay/Generate

A path may carry `@N` (stream_interval_ms N: the gateway's --stream-interval-ms, the
client's requests) and, for a gateway, `xP` (--processes P): e.g. `gateway_direct@20x2`.

Figures per path: delivered tokens/s; CPU us per delivered token of the scheduler,
worker, gateway and the bench's own client process (utime + stime from /proc);
p50/p99 of the gaps between a stream's messages as the client receives them
(inter-chunk latency: one token each at one message per token); messages per
token at the client, relayed by the scheduler (its relayed-messages counter) and sent
by the worker on its Relay calls (ortserve_worker_relay_messages_total).
"""

from __future__ import annotations

import json
import os
import re
import urllib.request
from pathlib import Path

from bench.common.measure import PROMPT, process_cpu_s, progress, summary
from bench.served.stream_load import (
    grpc_streams,
    metrics_address,
    served_model,
    sse_streams,
    start_gateway,
)
from devtools.cluster import LocalCluster, stop_service

RATE_TOKENS_PER_S = 200.0
PATHS = ("gateway_default", "gateway_relay", "gateway_direct", "client_default", "client_relay",
         "client_direct")
_PATH = re.compile(r"^(gateway_default|gateway_relay|gateway_direct|client_default|client_relay|"
                   r"client_direct)(?:@(\d+))?(?:x(\d+))?$")


def parse_path(path: str) -> tuple[str, int | None, int]:
    """(base path, stream interval in ms or None: the run's, gateway processes)."""
    found = _PATH.match(path)
    if found is None:
        raise ValueError(f"rate-set path {path!r}: one of {', '.join(PATHS)}, with an optional "
                         "@<interval ms> and x<gateway processes>")
    interval = int(found.group(2)) if found.group(2) is not None else None
    return found.group(1), interval, int(found.group(3) or 1)


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _counter(address: str, name: str) -> float:
    """A counter's value from a /metrics page (NaN: a process without it)."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


def _messages(sched_metrics: str, worker_metrics: str) -> tuple[float, float]:
    """(token chunks the scheduler relayed, RelayFrames messages the worker sent) so far."""
    return (_counter(sched_metrics, "ortserve_scheduler_relayed_messages_total"),
            _counter(worker_metrics, "ortserve_worker_relay_messages_total"))


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (a gateway's --processes copies)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid:
            found.append(int(stat.parent.name))
    return found


def rate_set_run(model_dir: Path, stream_counts: tuple[int, ...], new_tokens: int, rounds: int,
                 log_dir: Path, paths: tuple[str, ...] = PATHS, interval_ms: int = 0,
                 gateway_args: tuple[str, ...] = ()) -> dict:
    """One scheduler, one rate-set worker, a gateway per gateway mode; every path and
    stream count per round, interleaved. Returns {f"{streams}streams_{path}": run}."""
    from ortserve_client import Client
    from tokenizers import Tokenizer

    prompt_ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(PROMPT).ids
    rows = max(stream_counts)
    os.environ["ORTSERVE_BENCH"] = "1"  # the worker takes the rate-set runner only with it
    with LocalCluster(model_dir=model_dir, workers=1, log_dir=log_dir, threads=1,
                      kv_capacities=["8GiB"],
                      worker_args=["--metrics-port", "0", "--max-batch-rows", str(rows),
                                   "--prefix-cache-bytes", "0",
                                   "--bench-rate-set-tokens-per-s", f"{RATE_TOKENS_PER_S:g}"],
                      scheduler_args=["--metrics-port", "0"]) as cluster:
        scheduler, worker = cluster.services[0], cluster.worker_services[0]
        worker_metrics = metrics_address(worker)
        sched_metrics = metrics_address(scheduler)
        gateways = {}
        try:
            modes = {"gateway_default": [], "gateway_relay": ["--no-direct-to-workers"],
                     "gateway_direct": ["--direct-to-workers"]}
            for path in paths:
                base, interval, processes = parse_path(path)
                if base in modes:
                    if interval is None and base != "gateway_default":
                        interval = interval_ms
                    gateways[path] = start_gateway(
                        cluster.address, log_dir / path.replace("@", "-"),
                        [*modes[base], "--processes", str(processes), *gateway_args,
                         *(["--stream-interval-ms", str(interval)] if interval is not None
                           else [])])
            model = served_model(next(iter(gateways.values())).address) if gateways else ""
            with Client(cluster.address, timeout_s=900, direct=False) as relayed, \
                    Client(cluster.address, timeout_s=900, direct=True) as direct, \
                    Client(cluster.address, timeout_s=900) as default:
                clients = {"client_relay": relayed, "client_direct": direct,
                           "client_default": default}

                def load(path: str, streams: int, tokens: int) -> dict:
                    if path in gateways:
                        return sse_streams(gateways[path].address, model, streams, tokens)
                    base, interval, _ = parse_path(path)
                    return grpc_streams(clients[base], prompt_ids, streams, tokens,
                                        interval_ms if interval is None else interval)

                for path in paths:
                    load(path, 8, 8)  # warm-up: channels, relay calls
                pids = {"scheduler": scheduler.process.pid, "worker": worker.process.pid,
                        "client": os.getpid()}
                per = {(s, p): {"cpu": {}, "rate": [], "client_mpt": [], "relayed_mpt": [], "worker_mpt": [],
                                "p50": [], "p99": [], "load": []}
                       for s in stream_counts for p in paths}
                for r in range(rounds):
                    for streams in stream_counts:
                        for path in paths:
                            progress(f"rate-set round {r + 1}/{rounds} {path}: {streams} streams "
                                     f"x {new_tokens} tokens at {RATE_TOKENS_PER_S:g}/s")
                            procs = dict(pids)
                            if path in gateways:
                                procs["gateway"] = gateways[path].process.pid
                                # --processes P: the copies are the parent's children
                                procs.update({f"gateway_{i}": child for i, child in enumerate(
                                    _children(gateways[path].process.pid))})
                            before = {n: process_cpu_s(pid) for n, pid in procs.items()}
                            relayed_before, sent_before = _messages(sched_metrics, worker_metrics)
                            out = load(path, streams, new_tokens)
                            after = {n: process_cpu_s(pid) for n, pid in procs.items()}
                            relayed, sent = _messages(sched_metrics, worker_metrics)
                            relayed, sent = relayed - relayed_before, sent - sent_before
                            tokens = out["tokens"]
                            if tokens != streams * new_tokens:
                                raise RuntimeError(f"rate-set {path}: {tokens} tokens delivered, "
                                                   f"expected {streams} x {new_tokens}")
                            fig = per[(streams, path)]
                            for n in procs:
                                fig["cpu"].setdefault(n, []).append(
                                    (after[n] - before[n]) / tokens * 1e6)
                            fig["rate"].append(tokens / out["wall_s"])
                            fig["client_mpt"].append(out["messages"] / tokens)
                            fig["relayed_mpt"].append(relayed / tokens)
                            fig["worker_mpt"].append(sent / tokens)
                            fig["p50"].append(_percentile(out["gaps_s"], 0.50) * 1e3)
                            fig["p99"].append(_percentile(out["gaps_s"], 0.99) * 1e3)
                            fig["load"].append(os.getloadavg()[0])
        finally:
            for gw in gateways.values():
                stop_service(gw)
    out = {}
    for (streams, path), fig in per.items():
        gateways_cpu = [n for n in fig["cpu"] if n.startswith("gateway_")]
        if gateways_cpu:  # the gateway's figure is all its processes together
            fig["cpu"]["gateway"] = [sum(fig["cpu"][n][i] for n in ["gateway", *gateways_cpu])
                                     for i in range(len(fig["rate"]))]
            for n in gateways_cpu:
                del fig["cpu"][n]
        figures = {f"{n}_cpu_us_per_token": summary(v, "us/token") for n, v in fig["cpu"].items()}
        served = [n for n in ("gateway", "scheduler", "worker") if n in fig["cpu"]]
        sums = [sum(fig["cpu"][n][i] for n in served) for i in range(len(fig["rate"]))]
        figures["served_path_cpu_us_per_token"] = summary(sums, "us/token")
        figures["delivered_tokens_per_s"] = summary(fig["rate"], "tokens/s")
        figures["inter_chunk_p50_ms"] = summary(fig["p50"], "ms")
        figures["inter_chunk_p99_ms"] = summary(fig["p99"], "ms")
        figures["client_messages_per_token"] = summary(fig["client_mpt"], "messages/token")
        figures["scheduler_relayed_messages_per_token"] = summary(fig["relayed_mpt"],
                                                                  "messages/token")
        # The worker's hop: RelayFrames messages for the relay and the gateway's two-step
        # path; the Python client's two-step path reads a Generate call, a message a chunk.
        figures["worker_relay_messages_per_token"] = summary(fig["worker_mpt"], "messages/token")
        out[f"rate_set_{streams}streams_{path}"] = {
            "streams": streams, "new_tokens": new_tokens, "rounds": rounds,
            "tokens_per_s_per_stream": RATE_TOKENS_PER_S, "stream_interval_ms": interval_ms,
            "figures": figures, "load_average_1m": fig["load"]}
    return out


def rate_set_section(quick: bool, log_dir: Path, models: Path,
                     paths: tuple[str, ...] = PATHS, interval_ms: int = 0,
                     gateway_args: tuple[str, ...] = ()) -> dict:
    """`make bench`'s rate-set figures: 32 and 128 streams at 200 tokens/s, every path."""
    doc = rate_set_run(models / "tiny-llama", (32,) if quick else (32, 128),
                       40 if quick else 400, 1 if quick else 3, log_dir, paths, interval_ms,
                       gateway_args)
    doc_median = {k: {f: round(v["median"], 2) for f, v in run["figures"].items()}
                  for k, run in doc.items()}
    progress("rate-set medians: " + json.dumps(doc_median))
    return {"rate_set_method": "bench-only rate-set runner (no model; "
                               f"{RATE_TOKENS_PER_S:g} tokens/s per stream); CPU from "
                               "/proc/PID/stat per delivered token; paths interleaved",
            **doc}

