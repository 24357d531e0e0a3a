"""Time to first token of prefix-cache misses (and hits), this tree against another, interleaved.

  .venv/bin/python -m bench.experiments.prefill_exact_ab --before-tree DIR [--rounds 5]

What exact prefix-cache hits cost (docs/features/prefix-cache.md, "A hit is exact"): no
prompt token runs alone over a past any more, a hit leaves two prompt tokens to
prefill, and generated tokens' K/V is not cached. DIR is a checkout of the code
to compare with (`git archive REV | tar -x -C DIR`). Each round runs one pass in a
fresh process per tree, the order alternating, so a shared machine's load hits
both alike. A pass, per model folder (SmolLM2 fp32 and int4, in process, 2
intra-op threads, the cache at its default): a short chat (37 tokens) and an
~800-token prompt of fresh random ids, each a miss then a hit (the same prompt
again), and turn 4 of a chat that resends its history (what the uncached
previous answers cost). JSON on stdout: per tree, model and figure, the
medians of the TTFTs in ms and their range, and the after/before ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

MODELS = ("smollm2-135m-instruct-fp32", "smollm2-135m-instruct-int4")
NOTES = " ".join(f"Note {i}: the meeting moved to room {i % 7}." for i in range(60))


def one_pass(seed: int) -> dict:
    """TTFTs of one pass in this process (the tree on sys.path), per model and figure."""
    from devtools.cluster import model_cache
    from worker_service.core.sampling import SamplingConfig
    from worker_service.core.sequence import SequenceRequest
    from worker_service.engine.config import EngineConfig
    from worker_service.engine.engine import Engine

    rng = random.Random(seed)
    out: dict = {}
    for name in MODELS:
        config = EngineConfig(model_dir=model_cache() / "models" / name, intra_op_threads=2,
                              kv_capacity_bytes=256 * 2**20)
        with Engine(config) as engine:
            figures = out[name] = {}

            def ttft(prompt, sid, max_new=1):
                done = engine.generate(SequenceRequest(sid, tuple(prompt), max_new,
                                                       sampling=SamplingConfig()), 600)
                return done.ttft_ms, done.cached_prompt_tokens, done.text

            short = engine.tokenizer.encode_chat([("user", f"What is the capital of "
                                                           f"{rng.choice(['Peru', 'Chile'])}? "
                                                           f"({rng.randrange(10**6)})")])
            long = [rng.randrange(100, 40_000) for _ in range(800)]
            for label, prompt in (("short", short), ("long", long)):
                figures[f"{label}_miss_ms"], _, _ = ttft(prompt, f"{label}-miss")
                figures[f"{label}_hit_ms"], cached, _ = ttft(prompt, f"{label}-hit")
                figures[f"{label}_hit_cached_tokens"] = cached
            messages = [("system", f"{NOTES} ({rng.randrange(10**6)})"), ("user", "What moved?")]
            for turn in range(4):
                ms, cached, text = ttft(engine.tokenizer.encode_chat(messages), f"chat{turn}", 16)
                messages += [("assistant", text), ("user", f"And after that? ({turn})")]
            figures["chat_turn4_ms"], figures["chat_turn4_cached_tokens"] = ms, cached
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench.experiments.prefill_exact_ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-tree", type=Path, help="a checkout of the code to compare with")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--one-pass", type=int, metavar="SEED", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one_pass is not None:
        print(json.dumps(one_pass(a.one_pass)))
        return
    if a.before_tree is None:
        p.error("--before-tree is required: a checkout to compare with "
                "(git archive REV | tar -x -C DIR)")
    trees = {"after": Path(__file__).resolve().parents[2], "before": a.before_tree.resolve()}
    passes: dict[str, list[dict]] = {"after": [], "before": []}
    for r in range(a.rounds):
        for label in (("after", "before") if r % 2 == 0 else ("before", "after")):
            env = dict(os.environ, PYTHONPATH=str(trees[label]))
            run = subprocess.run([sys.executable, __file__, "--one-pass", str(r)], env=env,
                                 cwd=trees[label], capture_output=True, text=True, check=True)
            passes[label].append(json.loads(run.stdout.strip().splitlines()[-1]))
            print(f"bench: round {r + 1}/{a.rounds} {label}: "
                  f"{json.dumps(passes[label][-1])}", file=sys.stderr)
    summary: dict = {"rounds": a.rounds, "before_tree": str(trees["before"])}
    for model in MODELS:
        for figure in passes["after"][0][model]:
            row = {}
            for label in ("before", "after"):
                values = [p[model][figure] for p in passes[label]]
                row[label] = {"median": statistics.median(values), "min": min(values),
                              "max": max(values)}
            if figure.endswith("_ms"):
                row["after_over_before"] = row["after"]["median"] / row["before"]["median"]
            summary[f"{model}/{figure}"] = row
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
