"""A/B of the engine's decode between two source trees (a branch against main), interleaved.

  .venv/bin/python -m bench.experiments.tree_ab --tree main=/work/main --tree new=. \
      [--model fp32] [--streams 1 8 32] [--rounds 4] [--tokens 32] [--threads 2]

Each tree runs in its own process (PYTHONPATH set to the tree), one in-process
engine kept loaded (bench.peers.engine_peers.InProcessEngine, the bench's
decode window), answering one request line at a time; per round and stream
count each tree decodes once, the order rotating, so a shared machine's load
hits both alike. Printed (stdout, one JSON line per stream count): each tree's
median decode tokens/s and range, and the median and range of the per-round
ratios of each tree to the first; and the same for tokens per CPU second of the
tree's process (all its threads), which a crowded machine disturbs less than
wall time. Progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.common.measure import process_cpu_s

_SERVE = """
import json, sys
from bench.peers.engine_peers import InProcessEngine
from ortserve.process.logs import configure_logging
configure_logging("warning")
engine = InProcessEngine(__import__("pathlib").Path(sys.argv[1]), int(sys.argv[2]))
print("ready", flush=True)
for line in sys.stdin:
    streams, tokens = map(int, line.split())
    print(json.dumps(engine.decode(streams, tokens)), flush=True)
engine.close()
"""


class Tree:
    """One source tree's engine in its own process."""

    def __init__(self, name: str, root: Path, model_dir: Path, threads: int) -> None:
        self.name = name
        env = {**os.environ, "PYTHONPATH": str(root.resolve())}
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(model_dir), str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env, cwd=root)
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"tree {name} ({root}) did not start its engine")

    def decode(self, streams: int, tokens: int) -> tuple[float, float]:
        """(decode tokens/s in the bench's window, generated tokens per CPU second)."""
        cpu_s = process_cpu_s(self.proc.pid)
        self.proc.stdin.write(f"{streams} {tokens}\n")
        self.proc.stdin.flush()
        rate = json.loads(self.proc.stdout.readline())["decode"]
        cpu_s = process_cpu_s(self.proc.pid) - cpu_s
        return rate, streams * tokens / cpu_s if cpu_s else float("nan")

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def main() -> None:
    from devtools.cluster import model_cache

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", action="append", required=True, help="NAME=PATH (the first: base)")
    p.add_argument("--model", default="fp32")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    model_dir = model_cache() / "models" / f"smollm2-135m-instruct-{a.model}"
    trees = [Tree(n, Path(path), model_dir, a.threads)
             for n, path in (t.split("=", 1) for t in a.tree)]
    rate = {(t.name, s): [] for t in trees for s in a.streams}
    per_cpu = {(t.name, s): [] for t in trees for s in a.streams}
    try:
        for t in trees:  # warm-up
            t.decode(max(a.streams), 4)
        for r in range(a.rounds):
            for s in a.streams:
                order = trees[r % len(trees):] + trees[:r % len(trees)]
                for t in order:
                    x, c = t.decode(s, a.tokens)
                    rate[(t.name, s)].append(x)
                    per_cpu[(t.name, s)].append(c)
            print(f"round {r + 1}/{a.rounds} (load {os.getloadavg()[0]:.1f}): " + ", ".join(
                f"{t.name}@{s} {rate[(t.name, s)][-1]:.1f}" for s in a.streams for t in trees),
                file=sys.stderr, flush=True)
    finally:
        for t in trees:
            t.close()
    base = trees[0].name
    for s in a.streams:
        row: dict = {"model": a.model, "streams": s, "tokens": a.tokens, "rounds": a.rounds}
        for t in trees:
            v, c = rate[(t.name, s)], per_cpu[(t.name, s)]
            ratios = [x / y for x, y in zip(v, rate[(base, s)], strict=True)]
            cpu_ratios = [x / y for x, y in zip(c, per_cpu[(base, s)], strict=True)]
            row[t.name] = {"tokens_per_s": round(statistics.median(v), 1),
                           "range": [round(min(v), 1), round(max(v), 1)],
                           f"ratio_to_{base}": round(statistics.median(ratios), 3),
                           "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                           "tokens_per_cpu_s": round(statistics.median(c), 1),
                           "cpu_ratio": round(statistics.median(cpu_ratios), 3),
                           "cpu_ratio_range": [round(min(cpu_ratios), 3),
                                               round(max(cpu_ratios), 3)]}
        print(json.dumps(row))


if __name__ == "__main__":
    main()
