"""The roofline's denominator: how fast this machine can read memory, all cores at once.

  .venv/bin/python -m bench.common.roofline [--mib 540] [--threads 2]

Each of `threads` threads reads its own slice of one buffer with a numpy
reduction (numpy drops the GIL inside it); the wall time of the slowest thread
over the whole buffer gives bytes/s. Several read kernels are tried and the
fastest counts, best of `repeats`: the probe must not under-read the machine,
or a decode rate could read above 100 % of "the limit". The buffer is sized to
the model's weights, so caches help the probe exactly as much as they can help
the model (this machine's L3 is large enough to hold a good part of the fp32
weights); a buffer several times the L3 gives the DRAM figure alongside.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from pathlib import Path

import numpy as np

KERNELS = {
    "sum_f32": lambda a: np.add.reduce(a),
    "max_f32": lambda a: np.maximum.reduce(a),
    "count_nonzero": lambda a: np.count_nonzero(a.view(np.uint8)),
}


def _parallel_read(parts: list[np.ndarray], kernel) -> float:
    """Seconds for len(parts) threads to each read their part once (started together)."""
    barrier = threading.Barrier(len(parts) + 1)
    done = [0.0] * len(parts)

    def work(i: int) -> None:
        barrier.wait()
        kernel(parts[i])
        done[i] = time.perf_counter()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(parts))]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return max(done) - start


def read_bandwidth(size_bytes: int, threads: int, repeats: int = 5) -> dict:
    """The best read bandwidth over kernels and repeats, bytes/s, and each kernel's best."""
    data = np.ones(max(size_bytes // 4, threads * 1024), dtype=np.float32)  # committed, not zero pages
    parts = np.array_split(data, threads)
    per_kernel = {}
    for name, kernel in KERNELS.items():
        kernel(parts[0][: 1 << 16])  # warm the code path
        best = min(_parallel_read(parts, kernel) for _ in range(repeats))
        per_kernel[name] = data.nbytes / best
    del data, parts
    best_name = max(per_kernel, key=per_kernel.get)
    return {"bytes": size_bytes, "threads": threads, "bytes_per_s": per_kernel[best_name],
            "kernel": best_name, "per_kernel_bytes_per_s": per_kernel, "repeats": repeats}


def l3_bytes() -> int:
    """The largest cache's size from sysfs (0 when unknown)."""
    best = 0
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip().upper()
        mult = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        with contextlib.suppress(ValueError):
            best = max(best, int(text.rstrip("KMG")) * mult)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=540)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = p.parse_args()
    print(json.dumps(read_bandwidth(a.mib * 2**20, a.threads), indent=1))


if __name__ == "__main__":
    main()
