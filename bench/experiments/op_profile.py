"""ORT's per-kernel time in a batched decode step: a plain loop over the engine's binding
layout against onnxruntime-genai on the same folder, both with ORT's profiler on.

  .venv/bin/python -m bench.experiments.op_profile [--model int4] [--batch 16] [--steps 32] [--threads 2]

Each side decodes `batch` copies of one prompt for `steps` steps in its own
process (genai in the tools venv) with `enable_profiling`; the last steps' runs
are summed per kernel type. Printed (stdout, JSON lines): per side, ms per
step (profiled), ms per run and per kernel type with the kernel count. It
answers one question: does the same graph run differently under our binding
and session options than under genai's? (docs/benchmarks.md, round 3.)
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PROMPT = "Write a long story about a dragon who learns to paint."
ROOT = Path(__file__).resolve().parents[2]


def ours(model_dir: Path, batch: int, steps: int, threads: int, prefix: str) -> dict:
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from worker_service.runtime.kv_arena import KVArena
    from worker_service.runtime.model import load_model_spec
    from worker_service.runtime.ort_rows import OrtRows

    spec = load_model_spec(model_dir)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.enable_profiling, options.profile_file_prefix = True, prefix
    session = ort.InferenceSession(str(spec.model_file), options, providers=["CPUExecutionProvider"])
    ids = Tokenizer.from_file(str(spec.model_dir / "tokenizer.json")).encode(PROMPT).ids
    arena = KVArena(spec, batch, 2**31)
    for _ in range(batch):
        arena.allocate(len(ids) + steps + 1)
    runner = OrtRows(session, spec, arena, max_chunk_tokens=batch * len(ids))
    next_ids = np.argmax(runner.prefill_first(0, [ids] * batch), axis=1).tolist()
    past = [len(ids)] * batch
    start = time.perf_counter()
    for _ in range(steps):
        next_ids = np.argmax(runner.decode(batch, past, next_ids), axis=1).tolist()
        past = [p + 1 for p in past]
    step_ms = (time.perf_counter() - start) / steps * 1e3
    return {"side": "ours", "step_ms": step_ms, **kernels(session.end_profiling(), steps)}


def peer(model_dir: Path, batch: int, steps: int, threads: int, prefix: str) -> dict:
    import onnxruntime_genai as og

    folder = Path(tempfile.mkdtemp(prefix="op-profile-"))
    for item in model_dir.iterdir():
        if item.name != "genai_config.json":
            os.symlink(item, folder / item.name)
    config = json.loads((model_dir / "genai_config.json").read_text())
    config["model"]["decoder"].setdefault("session_options", {}).update(
        {"intra_op_num_threads": threads, "inter_op_num_threads": 1, "enable_profiling": prefix})
    (folder / "genai_config.json").write_text(json.dumps(config))
    model = og.Model(og.Config(str(folder)))
    ids = np.array(og.Tokenizer(model).encode(PROMPT), dtype=np.int32)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + steps + 1, min_length=len(ids) + steps + 1,
                              batch_size=batch, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.tile(ids, (batch, 1)))
    generator.generate_next_token()  # samples the prefill's logits: no run
    start = time.perf_counter()
    while not generator.is_done():
        generator.generate_next_token()
    step_ms = (time.perf_counter() - start) / steps * 1e3
    del generator, params, model  # the session writes its profile as it closes
    written = sorted(Path(prefix).parent.glob(Path(prefix).name + "*.json"))
    return {"side": "genai", "step_ms": step_ms, **kernels(str(written[-1]), steps)}


def kernels(profile: str, runs: int) -> dict:
    """Per kernel type over the last `runs` model runs: ms per run and kernels per run."""
    events = json.loads(Path(profile).read_text())
    model_runs = [e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"]
    last = model_runs[-runs:]
    low, high = last[0]["ts"], last[-1]["ts"] + last[-1]["dur"]
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e in events:
        if (e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                and low <= e["ts"] <= high):
            op = e["args"].get("op_name", "?")
            total[op] += e["dur"]
            count[op] += 1
    return {"run_ms": sum(r["dur"] for r in last) / len(last) / 1e3,
            "kernels": {op: {"ms_per_run": us / len(last) / 1e3, "per_run": count[op] // len(last)}
                        for op, us in total.most_common()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="int4")
    p.add_argument("--model-dir", type=Path)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--side", choices=["ours", "genai"], help=argparse.SUPPRESS)  # one side only
    a = p.parse_args()
    if a.model_dir is None:
        from devtools.cluster import model_cache

        a.model_dir = model_cache() / "models" / f"smollm2-135m-instruct-{a.model}"
    prefix = str(Path(tempfile.mkdtemp(prefix="op-profile-")) / "run")
    if a.side:
        side = ours if a.side == "ours" else peer
        print(json.dumps(side(a.model_dir, a.batch, a.steps, a.threads, prefix)))
        return
    for side, python in (("genai", ROOT / ".venv-tools" / "bin" / "python"), ("ours", sys.executable)):
        print(f"op-profile: {side}, batch {a.batch}, {a.steps} steps", file=sys.stderr, flush=True)
        out = subprocess.run([str(python), "-m", "bench.experiments.op_profile", "--side", side,
                              "--model-dir", str(a.model_dir), "--batch", str(a.batch),
                              "--steps", str(a.steps), "--threads", str(a.threads)],
                             cwd=ROOT, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        print(out.stdout.strip().splitlines()[-1], flush=True)


if __name__ == "__main__":
    main()
