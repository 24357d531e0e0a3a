"""make bench: ortserve measured side by side with a peer, in the same run, as JSON.

  .venv/bin/python -m bench.run [--quick] [--out bench/results.json]

Every figure is a median over repeats with min and max; every comparison is a
ratio of two figures measured in this run on this machine. Progress goes to
stderr, the table to stdout, the JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from devtools.cluster import LocalCluster, model_cache
from ortserve.logs import configure_logging

ROOT = Path(__file__).resolve().parents[1]
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"
PROMPT = "Write a long story about a dragon who learns to paint."
SCHEMA_VERSION = 1


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def summary(values: list[float], unit: str) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "unit": unit, "values": values}


def ratio(a: dict, b: dict) -> float:
    return a["median"] / b["median"] if b["median"] else float("nan")


# -- the in-process engine -----------------------------------------------------------

def engine_decode(model_dir: Path, threads: int, streams: int, new_tokens: int, repeats: int) -> dict:
    """Aggregate decode tokens/s of `streams` concurrent sequences on one Engine."""
    from worker_service.engine import Engine, EngineConfig
    from worker_service.sequence import TERMINAL, Completed, SequenceRequest

    engine = Engine(EngineConfig(model_dir=model_dir, device="cpu", intra_op_threads=threads,
                                 kv_capacity_bytes=4 * 2**30))
    try:
        ids = tuple(engine.tokenizer.encode(PROMPT))
        rates, ttfts = [], []
        for repeat in range(repeats + 1):  # the first is a warm-up
            done: list = []
            finished = threading.Event()

            def on_event(event, done=done, finished=finished):
                if isinstance(event, TERMINAL):
                    done.append(event)
                    if len(done) == streams:
                        finished.set()

            for i in range(streams):
                engine.submit(SequenceRequest(sequence_id=f"b{repeat}-{i}", prompt_ids=ids,
                                              max_new_tokens=new_tokens, min_new_tokens=new_tokens),
                              on_event)
            finished.wait(600)
            failed = [e for e in done if not isinstance(e, Completed)]
            if failed:
                raise RuntimeError(f"engine bench sequence failed: {failed[0]}")
            first = min(e.ttft_ms for e in done) / 1e3
            last = max(e.total_ms for e in done) / 1e3
            tokens = sum(e.generated_tokens - 1 for e in done)
            if repeat:
                rates.append(tokens / (last - first))
                ttfts.append(min(e.ttft_ms for e in done))
        return {"decode": summary(rates, "tokens/s"), "ttft": summary(ttfts, "ms")}
    finally:
        engine.close()


def genai_decode(model_dir: Path, threads: int, batch: int, new_tokens: int, repeats: int) -> dict:
    out = subprocess.run(
        [str(TOOLS_PYTHON), str(ROOT / "bench" / "genai_peer.py"), "--model-dir", str(model_dir),
         "--threads", str(threads), "--batch", str(batch), "--new-tokens", str(new_tokens),
         "--repeats", str(repeats), "--prompt", PROMPT],
        capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"genai peer failed: {out.stderr[-2000:]}")
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return {"decode": summary(doc["decode_tokens_per_s"], "tokens/s"), "version": doc["genai_version"]}


# -- through the real processes ---------------------------------------------------------

def e2e_decode(model_dir: Path, threads: int, new_tokens: int, repeats: int, log_dir: Path) -> dict:
    from ortserve_client import Client

    with LocalCluster(model_dir=model_dir, workers=1, log_dir=log_dir, threads=threads,
                      kv_budgets=["1GiB"]) as cluster, Client(cluster.address, timeout_s=600) as client:
        rates, ttfts = [], []
        for repeat in range(repeats + 1):
            start = time.perf_counter()
            stream = client.stream(PROMPT, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
            first_chunk_ms = None
            for _ in stream:
                if first_chunk_ms is None:
                    first_chunk_ms = (time.perf_counter() - start) * 1e3
            if repeat:
                rates.append(stream.result.timings.decode_tokens_per_s)
                ttfts.append(first_chunk_ms)
        admission = admission_latency(client, 200 if repeats > 1 else 50)
    return {"decode": summary(rates, "tokens/s"), "client_ttft": summary(ttfts, "ms"), **admission}


def admission_latency(client, n: int) -> dict:
    from ortserve_client.client import build_request

    from ortserve.v1 import scheduler_pb2

    stub = client._stub
    request = scheduler_pb2.AdmitRequest(request=build_request(list(range(1, 33)), max_new_tokens=64))
    latencies = []
    start = time.perf_counter()
    for _ in range(n):
        t0 = time.perf_counter()
        adm = stub.Admit(request, timeout=10)
        latencies.append((time.perf_counter() - t0) * 1e3)
        stub.Release(scheduler_pb2.ReleaseRequest(lease_id=adm.lease_id), timeout=10)
    wall = time.perf_counter() - start
    lat = np.array(latencies)
    return {"admit_latency_ms": {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)),
                                 "n": n, "unit": "ms"},
            "admissions_per_s": n / wall, "admission_note": "Admit + Release pairs, sequential, loopback"}


# -- the roofline ----------------------------------------------------------------------

def read_bandwidth_bytes_per_s(repeats: int = 3) -> float:
    data = np.ones(256 * 2**20 // 8, dtype=np.float64)  # 256 MiB, larger than any cache
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - t0)
    return data.nbytes / best


def weight_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.iterdir() if f.name.startswith("model.onnx"))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def versions() -> dict:
    import grpc
    import onnxruntime

    return {"python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "grpcio": grpc.__version__, "numpy": np.__version__}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny model, few tokens: a smoke run")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results.json")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = p.parse_args(argv)
    configure_logging("warning")  # the engine's log lines must not reach stdout
    models_root = model_cache() / "models"
    if a.quick:
        models = {"tiny": models_root / "tiny-llama"}
        new_tokens, repeats, stream_counts = 16, 1, (1, 4)
    else:
        models = {"fp32": models_root / "smollm2-135m-instruct-fp32",
                  "int4": models_root / "smollm2-135m-instruct-int4"}
        new_tokens, repeats, stream_counts = 64, 3, (1, 4, 8)
    for name, path in models.items():
        if not (path / "genai_config.json").exists():
            sys.exit(f"bench: model {name} missing at {path}: run `make model` (and `make tiny-model`)")
    figures: dict = {}
    ratios: dict = {f"engine_vs_genai_{n}stream": {} for n in stream_counts}
    genai_version = ""
    for name, path in models.items():
        for n in stream_counts:
            progress(f"{name}: engine, {n} stream(s), {new_tokens} tokens x {repeats}")
            ours = engine_decode(path, a.threads, n, new_tokens, repeats)
            progress(f"{name}: onnxruntime-genai, batch {n}")
            peer = genai_decode(path, a.threads, n, new_tokens, repeats)
            genai_version = peer["version"]
            figures[f"{name}_engine_{n}stream_decode"] = ours["decode"]
            figures[f"{name}_genai_{n}stream_decode"] = peer["decode"]
            if n == 1:
                figures[f"{name}_engine_1stream_ttft"] = ours["ttft"]
            ratios[f"engine_vs_genai_{n}stream"][name] = ratio(ours["decode"], peer["decode"])
    first = next(iter(models))
    progress(f"{first}: end to end through scheduler and worker processes")
    e2e = e2e_decode(models[first], a.threads, new_tokens, repeats, ROOT / "logs" / "bench")
    figures[f"{first}_e2e_1stream_decode"] = e2e["decode"]
    figures[f"{first}_e2e_1stream_client_ttft"] = e2e["client_ttft"]
    ratios["e2e_vs_inprocess_1stream"] = {first: ratio(e2e["decode"], figures[f"{first}_engine_1stream_decode"])}
    ttft_overhead_ms = e2e["client_ttft"]["median"] - figures[f"{first}_engine_1stream_ttft"]["median"]
    progress("roofline: memory read bandwidth")
    bandwidth = read_bandwidth_bytes_per_s()
    roofline = {}
    for name, path in models.items():
        w = weight_bytes(path)
        rate = figures[f"{name}_engine_1stream_decode"]["median"]
        roofline[name] = {"weight_bytes_per_token": w, "read_bandwidth_bytes_per_s": bandwidth,
                          "bandwidth_limit_tokens_per_s": bandwidth / w,
                          "fraction_of_bandwidth_limit": rate * w / bandwidth}
    doc = {
        "schema_version": SCHEMA_VERSION,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", "bench.run", *(argv or sys.argv[1:])]),
        "quick": a.quick,
        "machine": {"cores": len(os.sched_getaffinity(0)), "cpu_model": cpu_model(),
                    "platform": platform.platform()},
        "versions": {**versions(), "onnxruntime_genai": genai_version},
        "settings": {"intra_op_threads": a.threads, "new_tokens": new_tokens, "repeats": repeats,
                     "prompt": PROMPT, "models": {k: str(v) for k, v in models.items()}},
        "figures": figures,
        "ratios": ratios,
        "e2e": {"ttft_overhead_ms": ttft_overhead_ms, "admit_latency_ms": e2e["admit_latency_ms"],
                "admissions_per_s": e2e["admissions_per_s"]},
        "roofline": roofline,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2))
    print(f"{'figure':<40} {'median':>10} {'min':>10} {'max':>10}")
    for key, fig in figures.items():
        print(f"{key:<40} {fig['median']:>10.1f} {fig['min']:>10.1f} {fig['max']:>10.1f}  {fig['unit']}")
    for key, per_model in ratios.items():
        print(f"{key:<40} " + "  ".join(f"{m}={r:.2f}" for m, r in per_model.items()))
    print(f"{'ttft overhead e2e (ms)':<40} {ttft_overhead_ms:>10.1f}")
    lat = e2e["admit_latency_ms"]
    print(f"{'admit latency p50/p99 (ms)':<40} {lat['p50']:>10.2f} {lat['p99']:>10.2f}")
    print(f"{'admissions/s':<40} {e2e['admissions_per_s']:>10.0f}")
    for name, r in roofline.items():
        print(f"{'roofline ' + name:<40} {r['fraction_of_bandwidth_limit']:>10.2f} of "
              f"{r['bandwidth_limit_tokens_per_s']:.0f} tokens/s limit")
    progress(f"wrote {a.out}")


if __name__ == "__main__":
    main()
