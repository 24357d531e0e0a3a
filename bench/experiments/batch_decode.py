"""Decode tokens/s: one batched run over the KV arena vs one run per sequence (round-robin).

  .venv/bin/python -m bench.experiments.batch_decode [--models fp32,int4] [--batches 1,4,8,16]
      [--tokens 16] [--repeats 2] [--threads 2]

Both modes run the same session, arena and prompts; only decode steps are
timed (prompts are prefilled first, untimed). Round-robin is today's engine:
one batch-1 run per sequence per token, into that sequence's own row. The
modes alternate step by step, so machine load hits both alike and each
repeat's ratio is a fair one even on a shared machine. Then
B=8 batched over rows of the full context (8,192 tokens) vs rows of a small
context, same prompts: the arena's large rows must not slow decode.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace

import numpy as np
import onnxruntime as ort
from tokenizers import Tokenizer

from devtools.cluster import model_cache
from worker_service.runtime.kv_arena import KVArena
from worker_service.runtime.model import ModelSpec, load_model_spec
from worker_service.runtime.ort_rows import OrtRows

PROMPTS = ["Write a long story about a dragon who learns to paint.",
           "What is the capital of France? Answer in one sentence.",
           "Explain how a hash table works.", "List five rivers in Europe and their lengths.",
           "Hi", "Describe the water cycle for a ten year old, step by step, with examples."]


def session_for(spec: ModelSpec, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(str(spec.model_file), options, providers=["CPUExecutionProvider"])


def prompts_for(spec: ModelSpec, batch: int) -> list[list[int]]:
    tok = Tokenizer.from_file(str(spec.model_dir / "tokenizer.json"))
    return [tok.encode(PROMPTS[b % len(PROMPTS)] + f" ({b})").ids for b in range(batch)]


class Streams:
    """B sequences prefilled into their own rows [first, first + B) of a runner's arena."""

    def __init__(self, runner: OrtRows, prompts: list[list[int]], new_tokens: int) -> None:
        self.runner = runner
        self.first = runner.arena.rows
        self.past, self.next, self.out = [], [], []
        for ids in prompts:
            row = runner.arena.allocate(len(ids) + new_tokens + 1)
            token = int(np.argmax(runner.prefill(row, 0, ids)))
            self.past.append(len(ids))
            self.next.append(token)
            self.out.append([token])
        self.seconds = 0.0

    def step(self, batched: bool) -> None:
        """One decode token for every stream, timed: one run (batched) or one run each."""
        runner, n = self.runner, len(self.past)
        t0 = time.perf_counter()
        if batched:
            assert self.first == 0  # a batched decode covers rows [0, n)
            logits = runner.decode(n, self.past, self.next)
            self.next = [int(i) for i in np.argmax(logits, axis=1)]
        else:
            self.next = [int(np.argmax(runner.prefill(self.first + b, self.past[b], [self.next[b]])))
                         for b in range(n)]
        self.seconds += time.perf_counter() - t0
        self.past = [p + 1 for p in self.past]
        for b, token in enumerate(self.next):
            self.out[b].append(token)

    def rate(self) -> float:
        return len(self.past) * (len(self.out[0]) - 1) / self.seconds


def clear(runner: OrtRows) -> None:
    while runner.arena.rows:
        runner.arena.free(runner.arena.rows - 1)
    runner.invalidate()


def paired(runner: OrtRows, prompts: list[list[int]], new_tokens: int) -> dict:
    """Batched and round-robin decode of the same prompts, alternating step by step.

    The two share the machine's load moment by moment, so their ratio holds even
    when other processes come and go (this machine is shared).
    """
    batched = Streams(runner, prompts, new_tokens)  # rows [0, B)
    rr = Streams(runner, prompts, new_tokens)  # rows [B, 2B)
    for _ in range(new_tokens):
        batched.step(batched=True)
        rr.step(batched=False)
    clear(runner)
    return {"batched": batched.rate(), "round_robin": rr.rate(),
            "tokens_equal": batched.out == rr.out}


def median(values: list[float]) -> float:
    return statistics.median(values)


def bench_model(name: str, args) -> dict:
    spec = load_model_spec(model_cache().expanduser() / "models" / name)
    session = session_for(spec, args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    arena = KVArena(spec, max_rows=max(*batches, 2), capacity_bytes=2**40)  # the warm-up runs 2
    runner = OrtRows(session, spec, arena)
    paired(runner, prompts_for(spec, 2), 4)  # warm-up
    result: dict = {"model": name, "by_batch": {}}
    for batch in batches:
        prompts = prompts_for(spec, batch)
        runs = [paired(runner, prompts, args.tokens) for _ in range(args.repeats)]
        entry = {"batched_tok_s": [r["batched"] for r in runs],
                 "round_robin_tok_s": [r["round_robin"] for r in runs],
                 "ratios": [r["batched"] / r["round_robin"] for r in runs],
                 "tokens_equal": all(r["tokens_equal"] for r in runs)}
        entry["ratio_median"] = median(entry["ratios"])
        result["by_batch"][batch] = entry
        print(f"{name} B={batch}: batched {median(entry['batched_tok_s']):.1f} tok/s, round-robin "
              f"{median(entry['round_robin_tok_s']):.1f} tok/s, ratio median "
              f"{entry['ratio_median']:.2f} (runs {', '.join(f'{x:.2f}' for x in entry['ratios'])}), "
              f"tokens equal {entry['tokens_equal']}", file=sys.stderr, flush=True)
    arena.close()
    if args.long_context:
        result["long_vs_small_context_B8"] = long_vs_small(spec, session, args)
    return result


def long_vs_small(spec: ModelSpec, session, args) -> dict:
    """B=8 batched decode: arena rows of the full context vs rows of 256 tokens, interleaved."""
    prompts = prompts_for(spec, 8)
    small_spec = replace(spec, context_length=256)
    full = OrtRows(session, spec, KVArena(spec, 8, 2**40))
    small = OrtRows(session, small_spec, KVArena(small_spec, 8, 2**40))
    ratios = []
    rates: dict[str, list[float]] = {"full": [], "small": []}
    for _ in range(args.repeats):
        a, b = Streams(full, prompts, args.tokens), Streams(small, prompts, args.tokens)
        for _ in range(args.tokens):
            a.step(batched=True)
            b.step(batched=True)
        rates["full"].append(a.rate())
        rates["small"].append(b.rate())
        ratios.append(a.rate() / b.rate())
        clear(full)
        clear(small)
    out = {"row_tokens": {"full": full.arena.seq_tokens, "small": small.arena.seq_tokens},
           "rates_tok_s": rates, "ratios_full_over_small": ratios,
           "ratio_median": median(ratios)}
    print(f"{spec.name} B=8 rows of {full.arena.seq_tokens} vs {small.arena.seq_tokens} tokens: "
          f"{median(rates['full']):.1f} vs {median(rates['small']):.1f} tok/s, ratio median "
          f"{out['ratio_median']:.2f} (runs {', '.join(f'{x:.2f}' for x in ratios)})",
          file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="fp32,int4")
    parser.add_argument("--batches", default="1,4,8,16")
    parser.add_argument("--tokens", type=int, default=16, help="decode steps timed per run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-long-context", dest="long_context", action="store_false")
    args = parser.parse_args()
    results = {"load_average_at_start": os.getloadavg(), "ort": ort.__version__,
               "args": vars(args), "models": []}
    for precision in args.models.split(","):
        results["models"].append(bench_model(f"smollm2-135m-instruct-{precision}", args))
    results["load_average_at_end"] = os.getloadavg()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
