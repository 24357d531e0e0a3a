"""The token path's cost: CPU microseconds per delivered token, per process.

  python -m bench.served.dataplane [--quick] [--out bench/results/dataplane.json] [--skip-gateway]
                            [--variants relay,direct,interval]

A scheduler and one worker start as processes (devtools.cluster.LocalCluster),
then `streams` clients each stream `new_tokens` tokens at once (min_new_tokens
pins the length). Per round: each process's CPU seconds (utime + stime from
/proc/PID/stat) over the round, divided by the tokens the clients received;
the worker's figure split into time inside ONNX Runtime's session runs (its
ortserve_worker_ort_run_cpu_seconds metric: the engine thread's CPU inside
run_with_iobinding) and the rest. The worker runs ONE intra-op thread, so
every ORT cycle is on the engine thread and the split is exact. Also:
delivered tokens/s (wall, noisy on a shared machine) and messages per token
(TokenChunk events, or SSE data events through the gateway, per token). Each
figure is the median of `rounds` rounds; the machine's load average is
recorded with them. The gateway run goes through ortserve-gateway's
/v1/completions with stream=true.

Variants, on the same processes and interleaved round by round (so one
machine's load falls on each alike): `relay` (Scheduler.Generate relays the
worker's stream), `direct` (the two-step path: Admit, then the worker streams
to the client; through the gateway, a second gateway with --direct-to-workers),
`interval` (relayed, with GenerateRequest.stream_interval_ms = 50; through the gateway,
a third gateway with --stream-interval-ms 50).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.common.measure import PROMPT, process_cpu_s, progress, summary
from bench.served.stream_load import (
    INTERVAL_MS,
    VARIANTS,
    grpc_streams,
    metrics_address,
    ort_cpu_s,
    served_model,
    sse_streams,
    start_gateway,
)
from devtools.cluster import LocalCluster, Service, model_cache, stop_service

ROOT = Path(__file__).resolve().parents[2]


# -- one measured configuration ---------------------------------------------------------

def measure(variants: dict, metrics: str, rounds: int, new_tokens: int, streams: int) -> dict:
    """`rounds` rounds, each running every variant once in turn (interleaved: the machine's
    load falls on each alike); per variant and process, CPU us per delivered token.

    `variants`: name -> (pids {process name: pid}, run_round()).
    """
    per_round = {v: {name: [] for name in [*pids, "worker_ort", "worker_outside_ort"]}
                 for v, (pids, _) in variants.items()}
    rates = {v: [] for v in variants}
    per_message = {v: [] for v in variants}
    loads = {v: [] for v in variants}
    for r in range(rounds):
        for v, (pids, run_round) in variants.items():
            progress(f"round {r + 1}/{rounds} {v}: {streams} streams x {new_tokens} tokens")
            before = {name: process_cpu_s(pid) for name, pid in pids.items()}
            ort_before = ort_cpu_s(metrics)
            out = run_round()
            after = {name: process_cpu_s(pid) for name, pid in pids.items()}
            ort = ort_cpu_s(metrics) - ort_before
            tokens = out["tokens"]
            if tokens != streams * new_tokens:
                raise RuntimeError(f"dataplane {v}: {tokens} tokens delivered, expected "
                                   f"{streams} x {new_tokens}")
            for name in pids:
                per_round[v][name].append((after[name] - before[name]) / tokens * 1e6)
            per_round[v]["worker_ort"].append(ort / tokens * 1e6)
            per_round[v]["worker_outside_ort"].append(
                (after["worker"] - before["worker"] - ort) / tokens * 1e6)
            rates[v].append(tokens / out["wall_s"])
            per_message[v].append(out["messages"] / tokens)
            loads[v].append(os.getloadavg()[0])
    out = {}
    for v in variants:
        figures = {f"{name}_cpu_us_per_token": summary(values, "us/token")
                   for name, values in per_round[v].items()}
        figures["delivered_tokens_per_s"] = summary(rates[v], "tokens/s")
        figures["messages_per_token"] = summary(per_message[v], "messages/token")
        out[v] = {"streams": streams, "new_tokens": new_tokens, "rounds": rounds,
                  "figures": figures, "load_average_1m": loads[v]}
    return out


def dataplane_run(model_dir: Path, streams: int, new_tokens: int, rounds: int, log_dir: Path,
                  gateway: bool = False, variants: tuple[str, ...] = ("relay",),
                  scheduler_args: tuple[str, ...] = ()) -> dict:
    """A scheduler and one worker (1 intra-op thread); through the gateway when `gateway`.
    Returns {variant: run}."""
    from ortserve_client import Client
    from tokenizers import Tokenizer

    prompt_ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(PROMPT).ids
    with LocalCluster(model_dir=model_dir, workers=1, log_dir=log_dir, threads=1,
                      kv_capacities=["2GiB"], worker_args=["--metrics-port", "0"],
                      scheduler_args=list(scheduler_args)) as cluster:
        worker = cluster.worker_services[0]
        pids = {"scheduler": cluster.services[0].process.pid, "worker": worker.process.pid}
        metrics = metrics_address(worker)
        if not gateway:
            with Client(cluster.address, timeout_s=900) as client, \
                    Client(cluster.address, timeout_s=900, direct=True) as direct:
                runs = {
                    "relay": lambda: grpc_streams(client, prompt_ids, streams, new_tokens),
                    "direct": lambda: grpc_streams(direct, prompt_ids, streams, new_tokens),
                    "interval": lambda: grpc_streams(client, prompt_ids, streams, new_tokens,
                                                     INTERVAL_MS),
                }
                for c in (client, direct):
                    grpc_streams(c, prompt_ids, streams, 8)  # warm-up: channels, arena rows
                return measure({v: (pids, runs[v]) for v in variants}, metrics, rounds,
                               new_tokens, streams)
        gateways = {}
        try:
            flags = {"relay": [], "direct": ["--direct-to-workers"],
                     "interval": ["--stream-interval-ms", str(INTERVAL_MS)]}
            for v in variants:
                gateways[v] = start_gateway(cluster.address, log_dir / v, flags[v])
            model = served_model(next(iter(gateways.values())).address)

            def run(gw: Service):
                return lambda: sse_streams(gw.address, model, streams, new_tokens)

            for gw in gateways.values():
                sse_streams(gw.address, model, streams, 8)  # warm-up
            return measure({v: ({**pids, "gateway": gw.process.pid}, run(gw))
                            for v, gw in gateways.items()}, metrics, rounds, new_tokens, streams)
        finally:
            for gw in gateways.values():
                stop_service(gw)


def dataplane_section(quick: bool, log_dir: Path, gateway: bool = True,
                      variants: tuple[str, ...] | None = None,
                      scheduler_args: tuple[str, ...] = (), rate_set: bool = True) -> dict:
    """The bench's `dataplane` section: tiny model at 32 streams; int4 through the gateway.

    Keys: `tiny_32streams` and `int4_gateway_16streams` (the relayed path), then
    `<that>_direct` and `<that>_interval50ms` for the other variants. `variants`
    None: all of them, or only `relay` with `quick` (the smoke run stays short).
    With `rate_set`, the model-free load (bench/served/rate_set.py): `rate_set_<N>streams_<path>`.
    """
    if variants is None:
        variants = ("relay",) if quick else VARIANTS
    models = model_cache() / "models"
    rounds = 1 if quick else 3
    new_tokens = 32 if quick else 256
    out = {"method": "CPU seconds (utime+stime, /proc/PID/stat) per delivered token; worker: "
                     "1 intra-op thread, ORT share from ortserve_worker_ort_run_cpu_seconds; "
                     "variants interleaved round by round on the same processes"}
    suffix = {"relay": "", "direct": "_direct", "interval": f"_interval{INTERVAL_MS}ms"}
    tiny = dataplane_run(models / "tiny-llama", 32, new_tokens, rounds, log_dir / "tiny",
                         variants=variants, scheduler_args=scheduler_args)
    out.update({f"tiny_32streams{suffix[v]}": run for v, run in tiny.items()})
    if gateway:
        gw = dataplane_run(models / "smollm2-135m-instruct-int4", 16, 16 if quick else 128,
                           rounds, log_dir / "gateway", gateway=True, variants=variants,
                           scheduler_args=scheduler_args)
        out.update({f"int4_gateway_16streams{suffix[v]}": run for v, run in gw.items()})
    if rate_set:
        from bench.served.rate_set import rate_set_section
        out.update(rate_set_section(quick, log_dir / "rate-set", models))
    return out


def print_section(doc: dict) -> None:
    for name, run in doc.items():
        if not isinstance(run, dict) or "figures" not in run:
            continue
        print(f"dataplane {name} ({run['streams']} streams x {run['new_tokens']} tokens, "
              f"load {run['load_average_1m']})")
        for key, fig in run["figures"].items():
            print(f"  {key:<38} {fig['median']:>10.2f} {fig['min']:>10.2f} {fig['max']:>10.2f}  "
                  f"{fig['unit']}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.served.dataplane", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 round, few tokens: a smoke run")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dataplane.json")
    p.add_argument("--skip-gateway", action="store_true", help="only the scheduler + worker run")
    p.add_argument("--variants", default=",".join(VARIANTS),
                   help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--scheduler-arg", action="append", default=[], metavar="ARG",
                   help="passed to the scheduler, e.g. --scheduler-arg=--relay-calls=per-request "
                        "(repeat for more)")
    p.add_argument("--rate-set-only", action="store_true",
                   help="only the model-free rate-set load (bench/served/rate_set.py)")
    p.add_argument("--skip-rate-set", action="store_true", help="no rate-set load")
    p.add_argument("--rate-set-paths", default="",
                   help="comma-separated paths of the rate-set load (default: all)")
    p.add_argument("--stream-interval-ms", type=int, default=0,
                   help="the rate-set load's stream_interval_ms (the gateways' "
                        "--stream-interval-ms and the clients' requests)")
    p.add_argument("--gateway-arg", action="append", default=[], metavar="ARG",
                   help="passed to the rate-set load's gateways (repeat for more)")
    a = p.parse_args(argv)
    if a.rate_set_only:
        from bench.served.rate_set import PATHS, rate_set_section
        paths = tuple(x for x in a.rate_set_paths.split(",") if x) or PATHS
        load_start = os.getloadavg()
        doc = rate_set_section(a.quick, ROOT / "logs" / "bench-dataplane" / "rate-set",
                               model_cache() / "models", paths, a.stream_interval_ms,
                               tuple(a.gateway_arg))
        doc["load_average_start"] = load_start
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=2))
        print_section(doc)
        progress(f"wrote {a.out}")
        return
    variants = tuple(v for v in a.variants.split(",") if v)
    if not variants or set(variants) - set(VARIANTS):
        p.error(f"--variants {a.variants!r}: name some of {', '.join(VARIANTS)}")
    load_start = os.getloadavg()
    doc = dataplane_section(a.quick, ROOT / "logs" / "bench-dataplane", gateway=not a.skip_gateway,
                            variants=variants, scheduler_args=tuple(a.scheduler_arg),
                            rate_set=not a.skip_rate_set)
    doc["load_average_start"] = load_start
    doc["scheduler_args"] = a.scheduler_arg
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2))
    print_section(doc)
    progress(f"wrote {a.out}")


if __name__ == "__main__":
    main()
