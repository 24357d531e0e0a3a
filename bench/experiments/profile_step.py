"""Where an engine step's time goes: the ORT run vs the Python around it, per step.

  .venv/bin/python -m bench.experiments.profile_step [--model fp32] [--streams 8] [--tokens 64] [--threads 2]

Wraps (on the instance, nothing patched globally) the engine's `step` and its
session's `run_with_iobinding`, decodes `streams` identical sequences and
prints one JSON object: per decode step (all streams batched), the median
wall time of the step, of the ORT run(s) inside it, and the rest (scheduling,
mask and binding set-up, sampling, events). For a stack-level view run it
under py-spy: `py-spy record -o profile.svg -- .venv/bin/python -m bench.experiments.profile_step`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from bench.peers.engine_peers import InProcessEngine
from devtools.cluster import model_cache
from ortserve.process.logs import configure_logging


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="fp32")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    configure_logging("warning")
    path = model_cache() / "models" / f"smollm2-135m-instruct-{a.model}"
    ours = InProcessEngine(path, a.threads)
    engine = ours.engine
    session = engine.runner.session
    steps: list[tuple[float, float, int]] = []  # (step s, ORT s, runs)
    ort_time = [0.0, 0]
    run_with_iobinding, step = session.run_with_iobinding, engine.step

    def timed_run(binding, *args, **kw):
        t0 = time.perf_counter()
        try:
            return run_with_iobinding(binding, *args, **kw)
        finally:
            ort_time[0] += time.perf_counter() - t0
            ort_time[1] += 1

    def timed_step():
        ort_time[0], ort_time[1] = 0.0, 0
        t0 = time.perf_counter()
        step()
        steps.append((time.perf_counter() - t0, ort_time[0], ort_time[1]))

    session.run_with_iobinding = timed_run
    engine.step = timed_step
    try:
        ours.decode(a.streams, 8)  # warm-up
        steps.clear()
        t0 = time.perf_counter()
        rate = ours.decode(a.streams, a.tokens)["decode"]
        wall = time.perf_counter() - t0
    finally:
        ours.close()
    decode_steps = [s for s in steps if s[2] == 1]  # one batched run, no prompt chunk
    med = statistics.median
    out = {"model": a.model, "streams": a.streams, "tokens": a.tokens, "threads": a.threads,
           "decode_tokens_per_s": rate, "wall_s": wall, "steps": len(steps),
           "decode_steps": len(decode_steps),
           "step_ms_median": med(s[0] for s in decode_steps) * 1e3,
           "ort_run_ms_median": med(s[1] for s in decode_steps) * 1e3,
           "python_ms_median": med(s[0] - s[1] for s in decode_steps) * 1e3,
           "python_share": sum(s[0] - s[1] for s in decode_steps) / sum(s[0] for s in decode_steps),
           "outside_steps_share": 1 - sum(s[0] for s in steps) / wall}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
