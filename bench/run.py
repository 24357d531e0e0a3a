"""make bench: ortserve measured side by side with a peer, in the same run, as JSON.

  .venv/bin/python -m bench.run [--quick] [--out bench/results/results.json] [--skip-serving]
      [--skip-structured] [--skip-dataplane] [--skip-prefix]

Every figure is a median over repeats with min and max; every comparison is
the median of per-repeat ratios of two figures measured back to back in this
run (one engine run, one peer run, the order alternating), so the load of a
shared machine hits both alike. Each run records the CPU the rest of the
machine used meanwhile (ForeignLoad); the headline ratio is the median over
the quiet pairs (all pairs when none was quiet). `ratios_of_medians` keeps the
plain estimate. Decode tokens/s counts, on both sides, the tokens after every
stream's first token, over the time from the last stream's first token to the
last token (the peer: the steps after its first token, each one run). Progress goes to stderr,
the table to stdout, the JSON to --out.
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

from bench import structured
from bench.admission import admission_burst, admission_latency
from bench.dataplane import dataplane_section, print_section, process_cpu_s
from bench.prefix_ttft import prefix_section
from bench.roofline import l3_bytes, read_bandwidth
from bench.serving import serving_run
from devtools.cluster import LocalCluster, model_cache
from ortserve.logs import configure_logging

ROOT = Path(__file__).resolve().parents[1]
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"
PROMPT = "Write a long story about a dragon who learns to paint."
SCHEMA_VERSION = 2


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def summary(values: list[float], unit: str) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "unit": unit, "values": values}


def ratio(a: dict, b: dict) -> float:
    return a["median"] / b["median"] if b["median"] else float("nan")


def paired_ratio(a: list[float], b: list[float]) -> dict:
    """Median of the per-repeat ratios a[i] / b[i] (each pair measured back to back)."""
    values = [x / y for x, y in zip(a, b, strict=True) if y]
    return summary(values, "ratio")


# -- the machine's other load ---------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _machine_busy_s() -> float:
    """CPU seconds every process on the machine has used (all cores, from /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class ForeignLoad:
    """Cores' worth of CPU the rest of the machine used while a measurement ran.

    Busy time from /proc/stat minus this process's and the peer's own CPU time,
    over the wall time: 0 on a quiet machine, about 2 when another job fills
    both cores. Every run records it, so the quiet pairs can be told apart.
    """

    def __init__(self, pids: tuple[int, ...] = ()) -> None:
        self.pids = (os.getpid(), *pids)

    def __enter__(self) -> ForeignLoad:
        self._t, self._busy = time.perf_counter(), _machine_busy_s()
        self._own = sum(process_cpu_s(p) for p in self.pids)
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._t
        own = sum(process_cpu_s(p) for p in self.pids) - self._own
        self.cores = max(0.0, (_machine_busy_s() - self._busy - own) / wall) if wall > 0 else 0.0


QUIET_CORES = 0.5  # a pair counts as quiet when neither half saw more foreign load


def quiet_paired_ratio(a: list[float], b: list[float], load_a: list[float], load_b: list[float]) -> dict:
    """The median ratio over quiet pairs (all pairs when none was quiet), with the loads."""
    quiet = [i for i in range(len(a)) if max(load_a[i], load_b[i]) <= QUIET_CORES]
    use = quiet or list(range(len(a)))
    out = paired_ratio([a[i] for i in use], [b[i] for i in use])
    out.update(quiet_pairs=len(quiet), pairs=len(a), all_pairs=paired_ratio(a, b)["median"],
               foreign_load_cores=[round(max(x, y), 2) for x, y in zip(load_a, load_b, strict=True)])
    return out


# -- the in-process engine -----------------------------------------------------------

class InProcessEngine:
    """One Engine, kept loaded; `decode(n)` runs n identical streams and times their tokens."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        from worker_service.engine import Engine, EngineConfig

        self.engine = Engine(EngineConfig(model_dir=model_dir, device="cpu", intra_op_threads=threads,
                                          kv_capacity_bytes=4 * 2**30))
        self.ids = tuple(self.engine.tokenizer.encode(PROMPT))
        self._serial = 0

    def decode(self, streams: int, new_tokens: int) -> dict:
        """Decode tokens/s of `streams` sequences submitted at once (the bench's window)."""
        from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest, TokenDelta

        times: dict[str, list[float]] = {}
        done: list = []
        finished = threading.Event()

        def on_event(event) -> None:  # the engine thread: keep it cheap
            if isinstance(event, TokenDelta):
                times[event.sequence_id].append(time.perf_counter())
            elif isinstance(event, TERMINAL):
                done.append(event)
                if len(done) == streams:
                    finished.set()

        self._serial += 1
        for i in range(streams):
            sid = f"b{self._serial}-{i}"
            times[sid] = []
            self.engine.submit(SequenceRequest(sequence_id=sid, prompt_ids=self.ids,
                                               max_new_tokens=new_tokens, min_new_tokens=new_tokens),
                               on_event)
        if not finished.wait(900):
            raise RuntimeError("engine bench: streams did not finish in 900 s")
        failed = [e for e in done if not isinstance(e, Completed)]
        if failed:
            raise RuntimeError(f"engine bench sequence failed: {failed[0]}")
        if any(e.generated_tokens != new_tokens for e in done):
            raise RuntimeError("engine bench: a stream did not produce exactly new_tokens tokens")
        return {"decode": window_rate(list(times.values())),
                "ttft_ms": min(e.ttft_ms for e in done),
                "ttft_max_ms": max(e.ttft_ms for e in done)}

    def close(self) -> None:
        self.engine.close()


def window_rate(token_times: list[list[float]], tokens_per_event: list[list[int]] | None = None) -> float:
    """Tokens/s after every stream's first token: the shared decode window.

    The window opens when the last stream got its first token and closes at the
    last token; it counts the tokens that arrived inside it.
    """
    start = max(ts[0] for ts in token_times)
    end = max(ts[-1] for ts in token_times)
    counts = tokens_per_event or [[1] * len(ts) for ts in token_times]
    tokens = sum(c for ts, cs in zip(token_times, counts, strict=True)
                 for t, c in zip(ts, cs, strict=True) if t > start)
    return tokens / (end - start) if end > start else float("nan")


class GenaiPeer:
    """onnxruntime-genai in its own venv, kept loaded, answering one request line at a time."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        self.proc = subprocess.Popen(
            [str(TOOLS_PYTHON), str(ROOT / "bench" / "genai_peer.py"), "--model-dir", str(model_dir),
             "--threads", str(threads), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        hello = self._read()
        self.version = hello["genai_version"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"genai peer exited: {self.proc.stderr.read()[-2000:]}")
        return json.loads(line)

    def decode(self, batch: int, new_tokens: int, prompt_ids) -> float:
        self.proc.stdin.write(json.dumps({"batch": batch, "new_tokens": new_tokens,
                                          "prompt_ids": list(prompt_ids)}) + "\n")
        self.proc.stdin.flush()
        return self._read()["decode_tokens_per_s"]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def engine_vs_genai(name: str, path: Path, threads: int, stream_counts, new_tokens: int,
                    repeats: int, probe_bytes: int) -> dict:
    """Interleaved: per repeat, per stream count, one engine run and one peer run;
    per repeat, one bandwidth probe (the roofline) next to the 1-stream pair."""
    ours = InProcessEngine(path, threads)
    peer = GenaiPeer(path, threads)
    try:
        progress(f"{name}: warm-up (engine and onnxruntime-genai, {max(stream_counts)} streams)")
        ours.decode(max(stream_counts), 8)
        peer.decode(max(stream_counts), 8, ours.ids)
        rates = {n: {"engine": [], "genai": []} for n in stream_counts}
        loads = {n: {"engine": [], "genai": []} for n in stream_counts}
        ttfts, bandwidth = [], []
        for r in range(repeats):
            for n in stream_counts:
                progress(f"{name}: repeat {r + 1}/{repeats}, {n} stream(s), {new_tokens} tokens each")
                order = ("engine", "genai") if r % 2 == 0 else ("genai", "engine")
                if n == 1:  # the probe brackets the 1-stream pair: the limit is the faster
                    before = read_bandwidth(probe_bytes, threads, repeats=3)
                for side in order:
                    with ForeignLoad((peer.proc.pid,)) as load:
                        if side == "engine":
                            out = ours.decode(n, new_tokens)
                        else:
                            rate = peer.decode(n, new_tokens, ours.ids)
                    loads[n][side].append(load.cores)
                    if side == "engine":
                        rates[n]["engine"].append(out["decode"])
                        if n == 1:
                            ttfts.append(out["ttft_ms"])
                    else:
                        rates[n]["genai"].append(rate)
                if n == 1:
                    after = read_bandwidth(probe_bytes, threads, repeats=3)
                    bandwidth.append(max(before, after, key=lambda b: b["bytes_per_s"]))
        return {"rates": rates, "loads": loads, "ttft_ms": ttfts, "bandwidth": bandwidth, "version": peer.version,
                "prompt_tokens": len(ours.ids)}
    finally:
        peer.close()
        ours.close()


# -- through the real processes ---------------------------------------------------------

def client_decode(client, prompt, new_tokens: int) -> dict:
    """One stream as the client sees it: decode tokens/s after the first chunk, and TTFT."""
    start = time.perf_counter()
    times, counts = [], []
    for chunk in client.stream(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens):
        times.append(time.perf_counter())
        counts.append(len(chunk.token_ids))
    if sum(counts) != new_tokens:
        raise RuntimeError(f"e2e bench: {sum(counts)} tokens, asked for exactly {new_tokens}")
    return {"decode": window_rate([times], [counts]), "ttft_ms": (times[0] - start) * 1e3}


def e2e_vs_inprocess(path: Path, threads: int, new_tokens: int, repeats: int, log_dir: Path,
                     admissions: int) -> dict:
    """1 stream, the same metric both sides (tokens after the first / first -> last token),
    interleaved: the engine in this process, then a client through scheduler and worker."""
    from ortserve_client import Client

    ours = InProcessEngine(path, threads)
    try:
        with LocalCluster(model_dir=path, workers=1, log_dir=log_dir, threads=threads,
                          kv_capacities=["1GiB"]) as cluster, \
                Client(cluster.address, timeout_s=600) as client:
            ours.decode(1, 8)
            client_decode(client, list(ours.ids), 8)  # warm-ups
            e2e, inproc, e2e_ttft, inproc_ttft, loads_in, loads_e2e = [], [], [], [], [], []
            for r in range(repeats):
                progress(f"e2e: repeat {r + 1}/{repeats}")
                with ForeignLoad() as la:
                    a = ours.decode(1, new_tokens)
                with ForeignLoad(tuple(svc.process.pid for svc in cluster.services)) as lb:
                    b = client_decode(client, list(ours.ids), new_tokens)
                loads_in.append(la.cores)
                loads_e2e.append(lb.cores)
                inproc.append(a["decode"])
                inproc_ttft.append(a["ttft_ms"])
                e2e.append(b["decode"])
                e2e_ttft.append(b["ttft_ms"])
            progress(f"e2e: Admit latency, {admissions} Admit + Release pairs")
            admission = admission_latency(client, admissions)
            burst = admission_burst(client)
    finally:
        ours.close()
    return {"e2e": e2e, "inprocess": inproc, "loads_e2e": loads_e2e, "loads_in": loads_in, "e2e_ttft": e2e_ttft, "inprocess_ttft": inproc_ttft,
            "admission": admission, "burst": burst}


# -- the machine -----------------------------------------------------------------------

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


# -- the run ---------------------------------------------------------------------------

def cuda_section(models_root: Path, quick: bool) -> dict:
    """On a machine with a GPU: cuda_check on the CUDA folder (`make model-cuda`), whose
    decode_speed puts ortserve's device rows beside onnxruntime-genai at 1-128 streams."""
    from worker_service.runtime.device import resolve_device

    if resolve_device("auto") != "cuda":
        return {"skipped": "no GPU with a CUDA provider here"}
    folder = models_root / "smollm2-135m-instruct-fp16-cuda"
    if not (folder / "ortserve-model.json").is_file():
        return {"skipped": f"{folder} is not prepared: run `make model-cuda`"}
    out = subprocess.run([sys.executable, "-m", "worker_service.cuda_check", "--model-dir",
                          str(folder), "--speed-tokens", "16" if quick else "128"],
                         capture_output=True, text=True, timeout=900)
    try:
        return {"exit": out.returncode, **json.loads(out.stdout)}
    except ValueError:
        return {"exit": out.returncode, "stderr_tail": out.stderr[-2000:]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny model, few tokens: a smoke run")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "results.json")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--skip-serving", action="store_true", help="no Poisson serving run")
    p.add_argument("--skip-structured", action="store_true",
                   help="no constrained-vs-free decode run (bench/structured.py)")
    p.add_argument("--skip-dataplane", action="store_true",
                   help="no token-path CPU run (python -m bench.dataplane runs only that)")
    p.add_argument("--skip-prefix", action="store_true",
                   help="no prefix-cache TTFT run (python -m bench.prefix_ttft runs only that)")
    a = p.parse_args(argv)
    configure_logging("warning")  # the engine's log lines must not reach stdout
    t_start = time.perf_counter()
    cores = len(os.sched_getaffinity(0))
    load_start = os.getloadavg()
    models_root = model_cache() / "models"
    if a.quick:
        models = {"tiny": models_root / "tiny-llama"}
        new_tokens, repeats, stream_counts = 32, 1, (1, 4)
        serving = {"n": 6, "prompts": (16, 48), "outputs": (4, 12), "fractions": (0.5, 2.0),
                   "burst": 4}
        admissions = 20
    else:
        models = {"fp32": models_root / "smollm2-135m-instruct-fp32",
                  "int4": models_root / "smollm2-135m-instruct-int4"}
        new_tokens, repeats, stream_counts = 32, 6, (1, 4, 8, 16)
        serving = {"n": 24, "prompts": (16, 32, 64, 128), "outputs": (16, 32, 64, 128),
                   "fractions": (0.5, 1.0, 2.0), "burst": 12}
        admissions = 200
    for name, path in models.items():
        if not (path / "genai_config.json").exists():
            sys.exit(f"bench: model {name} missing at {path}: run `make model` (and `make tiny-model`)")
    figures: dict = {}
    ratios: dict = {f"engine_vs_genai_{n}stream": {} for n in stream_counts}
    paired: dict = {f"engine_vs_genai_{n}stream": {} for n in stream_counts}
    of_medians: dict = {f"engine_vs_genai_{n}stream": {} for n in stream_counts}
    roofline: dict = {}
    genai_version = ""
    for name, path in models.items():
        w = weight_bytes(path)
        res = engine_vs_genai(name, path, a.threads, stream_counts, new_tokens, repeats, w)
        genai_version = res["version"]
        for n in stream_counts:
            eng, gen = res["rates"][n]["engine"], res["rates"][n]["genai"]
            figures[f"{name}_engine_{n}stream_decode"] = {
                **summary(eng, "tokens/s"), "foreign_load_cores": res["loads"][n]["engine"]}
            figures[f"{name}_genai_{n}stream_decode"] = {
                **summary(gen, "tokens/s"), "foreign_load_cores": res["loads"][n]["genai"]}
            paired[f"engine_vs_genai_{n}stream"][name] = quiet_paired_ratio(
                eng, gen, res["loads"][n]["engine"], res["loads"][n]["genai"])
            ratios[f"engine_vs_genai_{n}stream"][name] = paired[f"engine_vs_genai_{n}stream"][name]["median"]
            of_medians[f"engine_vs_genai_{n}stream"][name] = ratio(summary(eng, ""), summary(gen, ""))
        figures[f"{name}_engine_1stream_ttft"] = summary(res["ttft_ms"], "ms")
        bw = [b["bytes_per_s"] for b in res["bandwidth"]]
        eng1, gen1 = res["rates"][1]["engine"], res["rates"][1]["genai"]
        fractions = [r * w / b for r, b in zip(eng1, bw, strict=True)]
        roofline[name] = {
            "weight_bytes_per_token": w, "probe_bytes": w, "probe_threads": a.threads,
            "read_bandwidth_bytes_per_s": statistics.median(bw),
            "bandwidth_limit_tokens_per_s": statistics.median(bw) / w,
            "fraction_of_bandwidth_limit": statistics.median(fractions),
            "fraction_values": fractions,
            # Over the quiet 1-stream pairs (ForeignLoad), as the headline ratios:
            "fraction_quiet": statistics.median(
                [f for f, le, lg in zip(fractions, res["loads"][1]["engine"], res["loads"][1]["genai"],
                                        strict=True) if max(le, lg) <= QUIET_CORES] or fractions),
            "genai_fraction_of_bandwidth_limit": statistics.median(
                [r * w / b for r, b in zip(gen1, bw, strict=True)]),
            "probes": res["bandwidth"], "prompt_tokens": res["prompt_tokens"],
        }
    first = next(iter(models))
    progress(f"{first}: end to end through scheduler and worker processes, interleaved")
    e2e = e2e_vs_inprocess(models[first], a.threads, new_tokens, repeats, ROOT / "logs" / "bench",
                           admissions)
    figures[f"{first}_e2e_1stream_client_decode"] = summary(e2e["e2e"], "tokens/s")
    figures[f"{first}_inprocess_1stream_client_decode"] = summary(e2e["inprocess"], "tokens/s")
    figures[f"{first}_e2e_1stream_client_ttft"] = summary(e2e["e2e_ttft"], "ms")
    figures[f"{first}_inprocess_1stream_ttft"] = summary(e2e["inprocess_ttft"], "ms")
    paired["e2e_vs_inprocess_1stream"] = {first: quiet_paired_ratio(
        e2e["e2e"], e2e["inprocess"], e2e["loads_e2e"], e2e["loads_in"])}
    ratios["e2e_vs_inprocess_1stream"] = {first: paired["e2e_vs_inprocess_1stream"][first]["median"]}
    of_medians["e2e_vs_inprocess_1stream"] = {
        first: ratio(figures[f"{first}_e2e_1stream_client_decode"],
                     figures[f"{first}_inprocess_1stream_client_decode"])}
    ttft_overhead_ms = (figures[f"{first}_e2e_1stream_client_ttft"]["median"]
                        - figures[f"{first}_inprocess_1stream_ttft"]["median"])
    progress("roofline: DRAM read bandwidth (a buffer 4x the largest cache)")
    dram = read_bandwidth(max(4 * l3_bytes(), 2**30), a.threads, repeats=3)
    serving_doc: dict = {"skipped": "--skip-serving"}
    if not a.skip_serving:
        progress(f"serving: capacity burst, then {serving['n']} Poisson requests at each of "
                 f"{serving['fractions']} x capacity")
        serving_doc = serving_run(models[first], a.threads, serving["fractions"], serving["n"],
                                  serving["prompts"], serving["outputs"],
                                  ROOT / "logs" / "bench-serving", burst=serving["burst"])
    structured_doc: dict = {"skipped": "--skip-structured"}
    if not a.skip_structured:
        progress("structured output: 8 streams under a JSON schema vs 8 free streams, interleaved")
        structured_doc = structured.measure(models[first], streams=8,
                                            tokens=16 if a.quick else 48,
                                            repeats=1 if a.quick else 5, threads=a.threads)
        ratios["structured_vs_free_8stream"] = {first: structured_doc["constrained_vs_free"]["median"]}
        paired["structured_vs_free_8stream"] = {first: {
            "median": structured_doc["constrained_vs_free"]["median"],
            "min": min(structured_doc["constrained_vs_free"]["values"]),
            "max": max(structured_doc["constrained_vs_free"]["values"]),
            "pairs": len(structured_doc["constrained_vs_free"]["values"]),
            "quiet_pairs": len(structured_doc["constrained_vs_free"]["values"])}}
    dataplane_doc: dict = {"skipped": "--skip-dataplane"}
    if not a.skip_dataplane:
        progress("dataplane: CPU per delivered token of scheduler, worker and gateway")
        dataplane_doc = dataplane_section(a.quick, ROOT / "logs" / "bench-dataplane")
    prefix_doc: dict = {"skipped": "--skip-prefix"}
    if not a.skip_prefix:
        progress("prefix cache: TTFT of a prompt whose prefix is cached vs not, interleaved")
        prefix_doc = prefix_section(models[first], a.quick)
        # The headline is bench.prefix_ttft's own (cold median / hit median); the pairs' spread
        # is per repeat (each repeat's cold and hit run back to back on a fresh prefix).
        ratios["prefix_cold_over_hit_ttft"] = {first: prefix_doc["ratio_cold_over_hit"]}
        per_pair = [c / h for c, h in zip(prefix_doc["cold_ttft_ms"], prefix_doc["hit_ttft_ms"],
                                          strict=True)]
        paired["prefix_cold_over_hit_ttft"] = {first: {
            "median": statistics.median(per_pair), "min": min(per_pair), "max": max(per_pair),
            "pairs": len(per_pair), "quiet_pairs": len(per_pair)}}
    progress("cuda: cuda_check's decode speed beside onnxruntime-genai (on a GPU only)")
    cuda_doc = cuda_section(models_root, a.quick)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, "-m", "bench.run", *(argv or sys.argv[1:])]),
        "quick": a.quick,
        "wall_s": time.perf_counter() - t_start,
        "machine": {"cores": cores, "cpu_model": cpu_model(), "platform": platform.platform(),
                    "l3_bytes": l3_bytes(), "load_average_start": load_start,
                    "load_average_end": os.getloadavg()},
        "versions": {**versions(), "onnxruntime_genai": genai_version},
        "settings": {"intra_op_threads": a.threads, "new_tokens": new_tokens, "repeats": repeats,
                     "prompt": PROMPT, "stream_counts": list(stream_counts),
                     "models": {k: str(v) for k, v in models.items()},
                     "metric": "decode tokens/s after every stream's first token (both sides)"},
        "figures": figures,
        "ratios": ratios,
        "paired_ratios": paired,
        "ratios_of_medians": of_medians,
        "e2e": {"ttft_overhead_ms": ttft_overhead_ms, **e2e["admission"],
                "admission_burst": e2e["burst"]},
        "roofline": roofline,
        "dram_read_bandwidth": dram,
        "serving": serving_doc,
        "structured": structured_doc,
        "dataplane": dataplane_doc,
        "prefix_cache": prefix_doc,
        "cuda": cuda_doc,
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=2))
    print_table(doc)
    progress(f"wrote {a.out} ({doc['wall_s']:.0f} s)")


def print_table(doc: dict) -> None:
    print(f"{'figure':<40} {'median':>10} {'min':>10} {'max':>10}")
    for key, fig in doc["figures"].items():
        print(f"{key:<40} {fig['median']:>10.1f} {fig['min']:>10.1f} {fig['max']:>10.1f}  {fig['unit']}")
    for key, per_model in doc["ratios"].items():
        print(f"{key:<40} " + "  ".join(
            f"{m}={r:.2f} ({doc['paired_ratios'][key][m]['min']:.2f}-"
            f"{doc['paired_ratios'][key][m]['max']:.2f}, {doc['paired_ratios'][key][m]['quiet_pairs']}/"
            f"{doc['paired_ratios'][key][m]['pairs']} quiet)" for m, r in per_model.items()))
    e2e = doc["e2e"]
    print(f"{'ttft overhead e2e (ms)':<40} {e2e['ttft_overhead_ms']:>10.1f}")
    lat = e2e["admit_latency_ms"]
    print(f"{'admit latency p50/p99 (ms)':<40} {lat['p50']:>10.2f} {lat['p99']:>10.2f}")
    print(f"{'admissions/s':<40} {e2e['admissions_per_s']:>10.0f}")
    for name, r in doc["roofline"].items():
        print(f"{'roofline ' + name:<40} {r['fraction_of_bandwidth_limit']:>10.2f} of "
              f"{r['bandwidth_limit_tokens_per_s']:.0f} tokens/s limit "
              f"(genai {r['genai_fraction_of_bandwidth_limit']:.2f})")
    print(f"{'dram read bandwidth (GB/s)':<40} {doc['dram_read_bandwidth']['bytes_per_s'] / 1e9:>10.1f}")
    if "capacity_per_s" in doc["serving"]:
        print(f"{'serving capacity (burst, req/s)':<40} {doc['serving']['capacity_per_s']:>10.2f}")
    for r in doc["serving"].get("by_rate", []):
        label = f"serving @ {r['rate_per_s']:.2f} req/s"
        print(f"{label:<40} {r['throughput_tokens_per_s']:>10.1f} tok/s  "
              f"ttft p50/p99 {r['ttft_ms']['p50']:.0f}/{r['ttft_ms']['p99']:.0f} ms  "
              f"tpot p50/p99 {r['tpot_ms']['p50']:.1f}/{r['tpot_ms']['p99']:.1f} ms  "
              f"{r['completed']}/{r['requests']} ok")
    print_section(doc["dataplane"])


if __name__ == "__main__":
    main()
