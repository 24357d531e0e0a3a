"""How the bench measures: summaries, per-repeat ratios, the machine's other load, the decode window.

Every figure is a median over repeats with min and max; every comparison is
the median of per-repeat ratios of two figures measured back to back (one
side, then the other), so the load of a shared machine hits both alike.
`ForeignLoad` records the CPU the rest of the machine used meanwhile, and
`quiet_paired_ratio` keeps the quiet pairs. Shared by every bench section.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

PROMPT = "Write a long story about a dragon who learns to paint."  # the bench's free-text prompt
CLK_TCK = os.sysconf("SC_CLK_TCK")


def progress(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def process_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), seconds; 0 when it is gone."""
    try:
        parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(parts[11]) + int(parts[12])) / CLK_TCK


def summary(values: list[float], unit: str) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values), "unit": unit, "values": values}


def ratio(a: dict, b: dict) -> float:
    return a["median"] / b["median"] if b["median"] else float("nan")


def paired_ratio(a: list[float], b: list[float]) -> dict:
    """Median of the per-repeat ratios a[i] / b[i] (each pair measured back to back)."""
    values = [x / y for x, y in zip(a, b, strict=True) if y]
    return summary(values, "ratio")


def window_rate(token_times: list[list[float]], tokens_per_event: list[list[int]] | None = None) -> float:
    """Tokens/s after every stream's first token: the shared decode window.

    The window opens when the last stream got its first token and closes at the
    last token; it counts the tokens that arrived inside it.
    """
    start = max(ts[0] for ts in token_times)
    end = max(ts[-1] for ts in token_times)
    counts = tokens_per_event or [[1] * len(ts) for ts in token_times]
    tokens = sum(c for ts, cs in zip(token_times, counts, strict=True)
                 for t, c in zip(ts, cs, strict=True) if t > start)
    return tokens / (end - start) if end > start else float("nan")


# -- the machine's other load ---------------------------------------------------------

def _machine_busy_s() -> float:
    """CPU seconds every process on the machine has used (all cores, from /proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


class ForeignLoad:
    """Cores' worth of CPU the rest of the machine used while a measurement ran.

    Busy time from /proc/stat minus this process's and the peer's own CPU time,
    over the wall time: 0 on a quiet machine, about 2 when another job fills
    both cores. Every run records it, so the quiet pairs can be told apart.
    """

    def __init__(self, pids: tuple[int, ...] = ()) -> None:
        self.pids = (os.getpid(), *pids)

    def __enter__(self) -> ForeignLoad:
        self._t, self._busy = time.perf_counter(), _machine_busy_s()
        self._own = sum(process_cpu_s(p) for p in self.pids)
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._t
        own = sum(process_cpu_s(p) for p in self.pids) - self._own
        self.cores = max(0.0, (_machine_busy_s() - self._busy - own) / wall) if wall > 0 else 0.0


QUIET_CORES = 0.5  # a pair counts as quiet when neither half saw more foreign load


def quiet_paired_ratio(a: list[float], b: list[float], load_a: list[float], load_b: list[float]) -> dict:
    """The median ratio over quiet pairs (all pairs when none was quiet), with the loads."""
    quiet = [i for i in range(len(a)) if max(load_a[i], load_b[i]) <= QUIET_CORES]
    use = quiet or list(range(len(a)))
    out = paired_ratio([a[i] for i in use], [b[i] for i in use])
    out.update(quiet_pairs=len(quiet), pairs=len(a), all_pairs=paired_ratio(a, b)["median"],
               foreign_load_cores=[round(max(x, y), 2) for x, y in zip(load_a, load_b, strict=True)])
    return out
