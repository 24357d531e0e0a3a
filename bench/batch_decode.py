"""Decode tokens/s: one batched run over the KV arena vs one run per sequence (round-robin).

  .venv/bin/python -m bench.batch_decode [--models fp32,int4] [--batches 1,4,8,16]
      [--tokens 16] [--repeats 2] [--threads 2]

Both modes run the same session, arena and prompts; only the decode loop is
timed (prompts are prefilled first, untimed). Round-robin is today's engine:
one batch-1 run per sequence per token, into that sequence's own row. The
modes alternate within each repeat so machine load hits both alike. Then
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
from worker_service.batch_runner import BatchRunner
from worker_service.kv_arena import KVArena
from worker_service.model import ModelSpec, load_model_spec

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


def decode_rate(runner: BatchRunner, prompts: list[list[int]], new_tokens: int,
                batched: bool) -> tuple[float, list[list[int]]]:
    """Decode tokens/s over all sequences, and the tokens (prefill untimed)."""
    arena = runner.arena
    past, nxt = [], []
    for ids in prompts:
        row = arena.allocate(len(ids) + new_tokens + 1)
        logits = runner.prefill(row, 0, ids)
        past.append(len(ids))
        nxt.append(int(np.argmax(logits)))
    out = [[t] for t in nxt]
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        if batched:
            logits = runner.decode(len(prompts), past, nxt)
            nxt = [int(i) for i in np.argmax(logits, axis=1)]
        else:
            nxt = [int(np.argmax(runner.prefill(b, past[b], [nxt[b]]))) for b in range(len(prompts))]
        past = [p + 1 for p in past]
        for b, t in enumerate(nxt):
            out[b].append(t)
    elapsed = time.perf_counter() - t0
    while arena.rows:
        arena.free(arena.rows - 1)
    runner.invalidate()
    return len(prompts) * new_tokens / elapsed, out


def median(values: list[float]) -> float:
    return statistics.median(values)


def bench_model(name: str, args) -> dict:
    spec = load_model_spec(model_cache().expanduser() / "models" / name)
    session = session_for(spec, args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    arena = KVArena(spec, max_rows=max(*batches, 2), capacity_bytes=2**40)  # the warm-up runs 2
    runner = BatchRunner(session, spec, arena)
    decode_rate(runner, prompts_for(spec, 2), 4, batched=True)  # warm-up
    result: dict = {"model": name, "by_batch": {}}
    for batch in batches:
        prompts = prompts_for(spec, batch)
        rates: dict[str, list[float]] = {"batched": [], "round_robin": []}
        same = True
        for _ in range(args.repeats):
            rate_b, tok_b = decode_rate(runner, prompts, args.tokens, batched=True)
            rate_r, tok_r = decode_rate(runner, prompts, args.tokens, batched=False)
            rates["batched"].append(rate_b)
            rates["round_robin"].append(rate_r)
            same = same and tok_b == tok_r
        entry = {k: {"median_tok_s": median(v), "values": v} for k, v in rates.items()}
        entry["ratio"] = median(rates["batched"]) / median(rates["round_robin"])
        entry["tokens_equal"] = same
        result["by_batch"][batch] = entry
        print(f"{name} B={batch}: batched {median(rates['batched']):.1f} tok/s, round-robin "
              f"{median(rates['round_robin']):.1f} tok/s, ratio {entry['ratio']:.2f}, "
              f"tokens equal {same}", file=sys.stderr, flush=True)
    arena.close()
    if args.long_context:
        result["long_vs_small_context_B8"] = long_vs_small(spec, session, args)
    return result


def long_vs_small(spec: ModelSpec, session, args) -> dict:
    """B=8 batched decode: arena rows of the full context vs rows of 256 tokens."""
    prompts = prompts_for(spec, 8)
    runners = {"full": BatchRunner(session, spec, KVArena(spec, 8, 2**40)),
               "small": None}
    small_spec = replace(spec, context_length=256)
    runners["small"] = BatchRunner(session, small_spec, KVArena(small_spec, 8, 2**40))
    rates: dict[str, list[float]] = {"full": [], "small": []}
    for _ in range(args.repeats + 1):
        for key, runner in runners.items():
            rates[key].append(decode_rate(runner, prompts, args.tokens, batched=True)[0])
    out = {"row_tokens": {"full": runners["full"].arena.seq_tokens, "small": 256},
           "full_median_tok_s": median(rates["full"]), "small_median_tok_s": median(rates["small"]),
           "ratio_full_over_small": median(rates["full"]) / median(rates["small"]), "rates": rates}
    print(f"{spec.name} B=8 rows of {out['row_tokens']['full']} vs 256 tokens: "
          f"{out['full_median_tok_s']:.1f} vs {out['small_median_tok_s']:.1f} tok/s, ratio "
          f"{out['ratio_full_over_small']:.2f}", file=sys.stderr, flush=True)
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
