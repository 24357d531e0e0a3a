"""The wall time of the engine's decoding steps by rows, summed until the next heartbeat
takes them (the scheduler's time budget, docs/features/time-budget.md).

A step's wall time is what one gap between a running stream's tokens costs: its
decode run, any prompt chunks sharing the step, sampling and postprocessing. The
engine thread records; the heartbeat drains. One lock, plain numbers.
"""

from __future__ import annotations

import threading


class StepTimes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_rows: dict[int, tuple[int, float]] = {}  # rows -> (steps, seconds summed)

    def record(self, rows: int, seconds: float) -> None:
        """One step that decoded `rows` rows in `seconds` (steps with no decode row count
        for nothing: no stream waited on them for a token)."""
        if rows < 1 or seconds < 0:
            return
        with self._lock:
            steps, total = self._by_rows.get(rows, (0, 0.0))
            self._by_rows[rows] = (steps + 1, total + seconds)

    def drain(self) -> list[tuple[int, int, float]]:
        """(rows, steps, seconds) for each row count since the last drain, by rows."""
        with self._lock:
            taken, self._by_rows = self._by_rows, {}
        return [(rows, steps, seconds) for rows, (steps, seconds) in sorted(taken.items())]
