"""A/B of plain ORT decode loops: session settings, KV row length, ORT build, interleaved.

  .venv/bin/python -m bench.experiments.ort_ab MODEL_DIR --variant base: --variant short:rows_tokens=256 \
      [--variant peer:python=.venv-tools/bin/python] [--batch 1 8 16] [--rounds 6] [--steps 48]

Each variant is a process of its own (`--serve`, any venv with numpy and
onnxruntime: the peer's ORT build is a variant too) holding one session and a
KV buffer laid out like the engine's arena ([rows, kv_heads, rows_tokens,
head_dim] per layer, rows [0, B) bound as past and present). The parent asks
every variant in turn for one decode loop of B rows, the order rotating per
round, so a shared machine's load hits all alike. Printed: per variant and B,
the median ms per step over rounds with min and max, and the median of the
per-round ratios against the first variant; the same for the process's CPU
time per step (all its threads), which a loaded machine disturbs less (with
spinning on it counts the spin too).

Variant keys: rows_tokens (8192: the arena's full context), spinning (1/0:
session.intra_op.allow_spinning), denormal (1/0: session.set_denormal_as_zero),
opt (all/extended/basic), python (the interpreter), threads, affinity (a
CPU list for the process, e.g. 0-1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _serve(model_dir: Path, settings: dict) -> None:
    import onnxruntime as ort

    if "affinity" in settings:
        lo, _, hi = settings["affinity"].partition("-")
        os.sched_setaffinity(0, range(int(lo), int(hi or lo) + 1))
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(settings.get("threads", 2))
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    options.graph_optimization_level = {
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}[settings.get("opt", "all")]
    if "spinning" in settings:
        options.add_session_config_entry("session.intra_op.allow_spinning", settings["spinning"])
    if "denormal" in settings:
        options.add_session_config_entry("session.set_denormal_as_zero", settings["denormal"])
    session = ort.InferenceSession(str(model_dir / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    config = json.loads((model_dir / "genai_config.json").read_text())["model"]["decoder"]
    kv_heads, head_dim, layers = (config["num_key_value_heads"], config["head_size"],
                                  config["num_hidden_layers"])
    vocab = session.get_outputs()[0].shape[-1]
    rows_tokens = int(settings.get("rows_tokens", 8192))
    max_rows = 32
    # One region per layer and K/V, rows laid out as the arena's (commit on touch: np.zeros).
    regions = [np.zeros((max_rows, kv_heads, rows_tokens, head_dim), np.float32)
               for _ in range(2 * layers)]
    logits = np.empty(max_rows * vocab, np.float32)
    print(json.dumps({"ready": True, "onnxruntime": ort.__version__}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        batch, steps, prompt = int(req["batch"]), int(req["steps"]), int(req.get("prompt", 16))
        binding = session.io_binding()
        shape = [batch, kv_heads, rows_tokens, head_dim]
        for i in range(layers):
            for j, kind in enumerate(("key", "value")):
                ptr = regions[2 * i + j].ctypes.data
                binding.bind_input(f"past_key_values.{i}.{kind}", "cpu", 0, np.float32, shape, ptr)
                binding.bind_output(f"present.{i}.{kind}", "cpu", 0, np.float32, shape, ptr)
        binding.bind_output("logits", "cpu", 0, np.float32, [batch, 1, vocab], logits.ctypes.data)
        ids = np.full((batch, 1), 42, np.int64)
        times, cpu = [], []
        for step in range(steps):
            width = prompt + step + 1
            mask = np.ones((batch, width), np.int64)
            binding.bind_cpu_input("input_ids", ids)
            binding.bind_cpu_input("attention_mask", mask)
            t0, c0 = time.perf_counter(), time.process_time()
            session.run_with_iobinding(binding)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            ids[:, 0] = np.argmax(logits[:batch * vocab].reshape(batch, vocab), axis=1)
        print(json.dumps({"median_step_ms": float(np.median(times[2:])) * 1e3,
                          "median_cpu_ms": float(np.median(cpu[2:])) * 1e3}), flush=True)


def _parse_variant(text: str) -> tuple[str, dict]:
    name, _, rest = text.partition(":")
    settings = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, settings


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--variant", action="append", default=[], help="NAME:key=value,key=value")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--steps", type=int, default=48)
    p.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.serve is not None:
        _serve(a.model_dir, json.loads(a.serve))
        return
    variants = [_parse_variant(v) for v in a.variant] or [("base", {})]
    procs = {}
    for name, settings in variants:
        python = settings.get("python", sys.executable)
        procs[name] = subprocess.Popen([python, __file__, str(a.model_dir), "--serve", json.dumps(settings)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = json.loads(procs[name].stdout.readline())
        print(f"{name}: onnxruntime {hello['onnxruntime']} {settings}", file=sys.stderr, flush=True)
    names = [n for n, _ in variants]
    ms: dict = {(n, b): [] for n in names for b in a.batch}
    cpu_ms: dict = {(n, b): [] for n in names for b in a.batch}
    load = []
    for r in range(a.rounds):
        load.append(os.getloadavg()[0])
        for b in a.batch:
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                procs[n].stdin.write(json.dumps({"batch": b, "steps": a.steps}) + "\n")
                procs[n].stdin.flush()
                reply = json.loads(procs[n].stdout.readline())
                ms[(n, b)].append(reply["median_step_ms"])
                cpu_ms[(n, b)].append(reply["median_cpu_ms"])
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(
            f"{n}@{b} {ms[(n, b)][-1]:.2f}" for b in a.batch for n in names), file=sys.stderr, flush=True)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    out = {"load_average_1m": load, "rounds": a.rounds, "steps": a.steps, "results": []}
    for b in a.batch:
        for n in names:
            v = ms[(n, b)]
            ratios = [x / y for x, y in zip(v, ms[(names[0], b)], strict=True)]
            c = cpu_ms[(n, b)]
            cpu_ratios = [x / y for x, y in zip(c, cpu_ms[(names[0], b)], strict=True)]
            out["results"].append({"variant": n, "batch": b, "median_step_ms": round(statistics.median(v), 2),
                                   "range_ms": [round(min(v), 2), round(max(v), 2)],
                                   "ratio": round(statistics.median(ratios), 3),
                                   "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                                   "cpu_ms": round(statistics.median(c), 2),
                                   "cpu_ratio": round(statistics.median(cpu_ratios), 3),
                                   "cpu_ratio_range": [round(min(cpu_ratios), 3), round(max(cpu_ratios), 3)]})
    for row in out["results"]:
        print(json.dumps(row))
    print(json.dumps({k: v for k, v in out.items() if k != "results"}))


if __name__ == "__main__":
    main()
