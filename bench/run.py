"""make bench: ortserve measured side by side with a peer, in the same run, as JSON.

  .venv/bin/python -m bench.run [--quick] [--out bench/results/results.json] [--skip-serving]
      [--skip-structured] [--skip-dataplane] [--skip-prefix] [--skip-lora] [--skip-load]

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
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.common.machine import cpu_model, versions, weight_bytes
from bench.common.measure import PROMPT, QUIET_CORES, progress, quiet_paired_ratio, ratio, summary
from bench.common.roofline import l3_bytes, read_bandwidth
from bench.features import structured
from bench.features.prefix_ttft import prefix_section
from bench.peers.e2e_decode import e2e_vs_inprocess
from bench.peers.engine_peers import ROOT, engine_vs_genai
from bench.served.dataplane import dataplane_section, print_section
from bench.served.load_report import print_table as print_load_table
from bench.served.load_sweep import load_section
from bench.served.serving import serving_run
from devtools.cluster import model_cache
from ortserve.process.logs import configure_logging

SCHEMA_VERSION = 2


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


def lora_section(models_root: Path, quick: bool, threads: int) -> dict:
    """8 streams over 4 LoRA adapters vs 8 on one (bench/features/lora_mix.py), per layout, on the
    folders `python -m model_tools.lora` builds (the tiny ones: `make lora-demo`)."""
    base = "tiny-llama" if quick else "smollm2-135m-instruct"
    doc: dict = {}
    for layout, suffix in (("per_row", "-lora-rows"), ("shared", "-lora")):
        folder = models_root / f"{base}{suffix}"
        if not (folder / "adapters").is_dir():
            doc[layout] = {"skipped": f"{folder} is not built: run `.venv-tools/bin/python -m "
                                      f"model_tools.lora --base {base} --per-row`"}
            continue
        out = subprocess.run([sys.executable, "-m", "bench.features.lora_mix", "--model-dir", str(folder),
                              "--adapters", "4", "--streams", "8", "--threads", str(threads),
                              "--new-tokens", "16" if quick else "64",
                              "--rounds", "1" if quick else "3"],
                             capture_output=True, text=True, timeout=1800)
        try:
            doc[layout] = json.loads(out.stdout)
        except ValueError:
            doc[layout] = {"exit": out.returncode, "stderr_tail": out.stderr[-2000:]}
    return doc


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the tiny model, few tokens: a smoke run")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "results.json")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--skip-serving", action="store_true", help="no Poisson serving run")
    p.add_argument("--skip-structured", action="store_true",
                   help="no constrained-vs-free decode run (bench/features/structured.py)")
    p.add_argument("--skip-dataplane", action="store_true",
                   help="no token-path CPU run (python -m bench.served.dataplane runs only that)")
    p.add_argument("--skip-prefix", action="store_true",
                   help="no prefix-cache TTFT run (python -m bench.features.prefix_ttft runs only that)")
    p.add_argument("--skip-lora", action="store_true",
                   help="no LoRA mix run (python -m bench.features.lora_mix runs only that)")
    p.add_argument("--skip-load", action="store_true",
                   help="no load sweep against the peers (python -m bench.served.load_sweep runs only that)")
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
        # The headline is bench.features.prefix_ttft's own (cold median / hit median); the pairs' spread
        # is per repeat (each repeat's cold and hit run back to back on a fresh prefix).
        ratios["prefix_cold_over_hit_ttft"] = {first: prefix_doc["ratio_cold_over_hit"]}
        per_pair = [c / h for c, h in zip(prefix_doc["cold_ttft_ms"], prefix_doc["hit_ttft_ms"],
                                          strict=True)]
        paired["prefix_cold_over_hit_ttft"] = {first: {
            "median": statistics.median(per_pair), "min": min(per_pair), "max": max(per_pair),
            "pairs": len(per_pair), "quiet_pairs": len(per_pair)}}
    lora_doc: dict = {"skipped": "--skip-lora"}
    if not a.skip_lora:
        progress("lora: 8 streams over 4 adapters vs 8 on one, per-row and shared layouts")
        lora_doc = lora_section(models_root, a.quick, a.threads)
        for layout, run in lora_doc.items():
            if "rounds" in run:  # the figure: mixed / one adapter, median of the rounds
                ratios[f"lora_4adapters_vs_1_8stream_{layout}"] = {run["model"]: run["ratio_median"]}
                values = [r["ratio"] for r in run["rounds"]]
                paired[f"lora_4adapters_vs_1_8stream_{layout}"] = {run["model"]: {
                    "median": run["ratio_median"], "min": min(values), "max": max(values),
                    "pairs": len(values), "quiet_pairs": len(values)}}
    load_doc: dict = {"skipped": "--skip-load"}
    if not a.skip_load:
        progress("load: a Poisson chat mix at rates up to past saturation, ortserve beside "
                 "llama-server and genai's Engine")
        load_doc = load_section(a.quick, a.threads, a.out, models_root)
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
        "lora": lora_doc,
        "load": load_doc,
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
    if "by_rate" in doc["load"]:
        print_load_table(doc["load"])


if __name__ == "__main__":
    main()
