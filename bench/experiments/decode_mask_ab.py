"""Host seconds per decode step with the bucket mask written as counts in its first column
against right-padded rows of ones (runtime/mask_counts.py), interleaved step by step.

  .venv/bin/python -m bench.experiments.decode_mask_ab [--model tiny-llama] [--rows 1 8 32]
      [--steps 60] [--threads 2]

CPU device rows (the CUDA code path over CPU OrtValues: padded buckets, full-width
masks); each arm has its own runner and rows over one session, and the arms alternate
step by step so a shared machine's load hits both alike. Host seconds are a step's wall
time outside the session run (StepStats.host_s), and this thread's CPU seconds outside
the run (what a crowded machine's waits for a core do not inflate); on the CPU there is no copy to a device,
so what is measured is the host's writing of the mask (a GPU adds the copy of it).
Prints one JSON line per row count: median host ms per step of each arm (CPU and wall)
and their ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

from tests.models import prepared_model_dir
from worker_service.runtime.decode_step import StepStats
from worker_service.runtime.device import create_session
from worker_service.runtime.device_rows import DeviceRows
from worker_service.runtime.model import load_model_spec
from worker_service.runtime.ort_rows import OrtRows


def _arm(session, spec, rows: int, mask_counts: bool):
    store = DeviceRows(spec, rows, "cpu")
    runner = OrtRows(session, spec, store, max_chunk_tokens=64, mask_counts=mask_counts)
    runner.warm_graphs()
    for _ in range(rows):
        store.allocate(spec.context_length)
        runner.prefill(store.rows - 1, 0, [5, 17, 300, 42])
    return store, runner


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-llama")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    spec = load_model_spec(prepared_model_dir(a.model))
    session = create_session(spec, "cpu", 0, a.threads, 1, ())
    for rows in a.rows:
        arms = {name: _arm(session, spec, rows, counts)
                for name, counts in (("ones", False), ("counts", True))}
        past = {name: [4] * rows for name in arms}
        host_ms: dict[str, list[float]] = {name: [] for name in arms}
        host_cpu_ms: dict[str, list[float]] = {name: [] for name in arms}
        for step in range(a.steps):
            order = list(arms) if step % 2 == 0 else list(reversed(arms))
            for name in order:
                store, runner = arms[name]
                stats: StepStats = runner.step_stats
                before, cpu_before, ort_before = stats.host_s, time.thread_time(), runner.ort_cpu_s
                runner.decode_rows(rows, past[name], [7] * rows)
                host_ms[name].append((stats.host_s - before) * 1e3)
                # This thread's CPU seconds outside the run: what a loaded machine's waits
                # for a core do not inflate.
                host_cpu_ms[name].append((time.thread_time() - cpu_before
                                          - (runner.ort_cpu_s - ort_before)) * 1e3)
                past[name] = [q + 1 for q in past[name]]
        for store, _ in arms.values():
            store.close()
        median = {name: statistics.median(v) for name, v in host_ms.items()}
        cpu = {name: statistics.median(v) for name, v in host_cpu_ms.items()}
        print(json.dumps({"rows": rows, "mask_width": spec.context_length, "steps": a.steps,
                          "host_cpu_ms_per_step": {k: round(v, 4) for k, v in cpu.items()},
                          "cpu_counts_over_ones": round(cpu["counts"] / cpu["ones"], 3),
                          "host_wall_ms_per_step": {k: round(v, 4) for k, v in median.items()},
                          "wall_counts_over_ones": round(median["counts"] / median["ones"], 3),
                          "wall_p90_ms": {k: round(float(np.percentile(v, 90)), 4)
                                          for k, v in host_ms.items()}}), flush=True)
        print(f"rows {rows} done", file=sys.stderr)


if __name__ == "__main__":
    main()
