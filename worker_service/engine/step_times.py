"""The wall time of the engine's decoding steps by rows, summed until the next heartbeat
takes them (the scheduler's time budget, docs/features/time-budget.md).

A step's wall time is what one gap between a running stream's tokens costs: its
decode run, sampling and postprocessing. Steps that also ran prompt chunks are left
out: the chunks beside decoding streams with a gap goal are held within it on their
own (core/prefill_budget.py), so what admission must keep within the goals is the
decode step; a mean with the chunks in it (before, up to 512 prompt tokens a step)
read several times the decode on a CPU and refused streams the goals had room for.
The engine thread records; the heartbeat drains. One lock, plain numbers.
"""

from __future__ import annotations

import threading


class StepTimes:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_rows: dict[int, tuple[int, float]] = {}  # rows -> (steps, seconds summed)

    def record(self, rows: int, seconds: float, prompt_tokens: int = 0) -> None:
        """One step that decoded `rows` rows in `seconds` beside `prompt_tokens` (steps with
        no decode row count for nothing: no stream waited on them for a token; steps with
        prompt tokens neither: see the module docstring)."""
        if rows < 1 or seconds < 0 or prompt_tokens > 0:
            return
        with self._lock:
            steps, total = self._by_rows.get(rows, (0, 0.0))
            self._by_rows[rows] = (steps + 1, total + seconds)

    def drain(self) -> list[tuple[int, int, float]]:
        """(rows, steps, seconds) for each row count since the last drain, by rows."""
        with self._lock:
            taken, self._by_rows = self._by_rows, {}
        return [(rows, steps, seconds) for rows, (steps, seconds) in sorted(taken.items())]
