"""Decode cost of mixing LoRA adapters in one batch: N streams on one adapter against the
same N streams spread over A adapters, on one engine.

  .venv/bin/python -m bench.features.lora_mix --model-dir DIR [--adapters 4] [--streams 8]
      [--new-tokens 64] [--rounds 2]

DIR is a `make lora-demo` folder (adapters/*.onnx_adapter). The worker serves A
adapters under A names; with fewer files than A, the files serve more than one name
(what a step costs does not depend on the weights' values: the shared layout runs
once per adapter group, the per-row layout gathers each row's slot, whatever they
hold). In the shared layout the LoRA weights are batch-shared graph inputs, so the
mixed batch costs A runs of N/A rows where the single-adapter batch costs one run of
N rows; the per-row layout (`-rows` folders) decodes any mix in one run. Prints one
JSON object on stdout: decode tokens/s and runs per step for each arm, per round,
and their ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from ortserve.process.logs import configure_logging
from worker_service.core.sequence import TERMINAL, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine


def run_arm(engine: Engine, adapters: list[str], streams: int, new_tokens: int) -> dict:
    """Every stream submitted in one step (under the engine's lock); decode tokens/s."""
    prompt = tuple(range(100, 116))
    done = threading.Event()
    finished: list[object] = []

    def on_event(event) -> None:
        if isinstance(event, TERMINAL):
            finished.append(event)
            if len(finished) == streams:
                done.set()

    runs_before = engine.runner.batch.runs
    started = time.perf_counter()
    with engine._cond:
        for i in range(streams):
            engine.submit(SequenceRequest(f"s{i}", prompt, new_tokens, min_new_tokens=new_tokens,
                                          adapter=adapters[i % len(adapters)]), on_event)
    if not done.wait(600):
        raise TimeoutError("the streams did not finish in 600 s")
    wall_s = time.perf_counter() - started
    return {"adapters": sorted(set(adapters)), "tokens_per_s": round(streams * new_tokens / wall_s, 1),
            "runs_per_step": round((engine.runner.batch.runs - runs_before) / new_tokens, 2)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.features.lora_mix", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--adapters", type=int, default=4, help="adapter names served and mixed")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    configure_logging("warning")
    files = sorted((a.model_dir / "adapters").glob("*.onnx_adapter"))
    if not files:
        p.error(f"{a.model_dir}/adapters has no .onnx_adapter files: run `make lora-demo`")
    if a.adapters < 1:
        p.error("--adapters: at least 1")
    served = [(f"adapter{i}", files[i % len(files)]) for i in range(a.adapters)]
    names = [name for name, _ in served]
    config = EngineConfig(model_dir=a.model_dir, intra_op_threads=a.threads,
                          kv_capacity_bytes=256 * 2**20, prefix_cache_bytes=0,
                          lora_adapters=tuple((n, str(f)) for n, f in served))
    rounds = []
    with Engine(config) as engine:
        run_arm(engine, [names[0]], a.streams, 8)  # warm-up
        for _ in range(a.rounds):
            one = run_arm(engine, [names[0]], a.streams, a.new_tokens)
            mixed = run_arm(engine, names, a.streams, a.new_tokens)
            rounds.append({"one_adapter": one, "mixed": mixed,
                           "ratio": round(mixed["tokens_per_s"] / one["tokens_per_s"], 2)})
    json.dump({"model": a.model_dir.name, "adapters": a.adapters,
               "adapter_files": sorted({f.name for _, f in served}), "streams": a.streams,
               "new_tokens": a.new_tokens, "threads": a.threads, "rounds": rounds,
               "ratio_median": sorted(r["ratio"] for r in rounds)[len(rounds) // 2]},
              sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
