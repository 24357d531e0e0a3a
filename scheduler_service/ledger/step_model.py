"""One worker's decode rate as measured: engine step time by batch rows (pure).

Workers report, with each heartbeat, the wall time of the engine steps that
decoded since the last one and ran no prompt chunk, summed per number of decoding
rows (a step is what one inter-token gap of every running stream costs: its
decode run, sampling and postprocessing; the chunks beside streams with a gap
goal are held within it by the worker: worker_service/core/prefill_budget.py). The model keeps an
exponentially weighted mean per row count and predicts the step at any row
count from them:

- a measured row count: its mean;
- between two measured counts: the straight line between them;
- above the largest measured count: proportional to rows from it (pessimistic:
  batching makes a row cheaper than the step's mean share; with a straight line
  fitted through the measured points, one quick load sweep let a worker reach 41
  streams, a 110 ms step, against a 40 ms goal before its measurements caught up);
  admission thus grows a worker's streams only as far as its measurements reach,
  by at most goal / step a heartbeat;
- below the smallest: the smallest's mean (pessimistic too);

and never less than any measured mean at fewer rows, so a prediction does not
fall as rows grow because one mean was noisy. Before the first measurement it
predicts nothing (None): admission is then by bytes alone, and GetBudget says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class StepSample:
    """What a worker measured since its last report at one row count."""

    rows: int  # rows that decoded in each of these steps
    steps: int  # how many such steps
    seconds: float  # their wall time summed
    # The worker's p90 decode step at these rows lately (its prompt chunks' margin; 0: not said).
    tail_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.rows < 1 or self.steps < 1 or not math.isfinite(self.seconds) or self.seconds < 0 \
                or not math.isfinite(self.tail_seconds) or self.tail_seconds < 0:
            raise ValueError(f"a step sample needs rows >= 1, steps >= 1 and finite seconds and "
                             f"tail_seconds >= 0, got rows {self.rows}, steps {self.steps}, "
                             f"seconds {self.seconds}, tail_seconds {self.tail_seconds}")


@dataclass(frozen=True)
class PromptPace:
    """What a prompt token costs a worker in a step (its measured mean) and the most prompt
    tokens one step runs there: how fast a prompt's chunks run beside decoding streams
    (ortserve/rules/prefill_math.py), for the TTFT prediction."""

    prompt_token_ms: float
    chunk_tokens: int = 512  # a worker that does not say: the default chunk
    chunk_ms: float = 0.0  # a chunk's own run, whatever its tokens

    def __post_init__(self) -> None:
        if not math.isfinite(self.prompt_token_ms) or self.prompt_token_ms < 0 \
                or not math.isfinite(self.chunk_ms) or self.chunk_ms < 0 \
                or self.chunk_tokens < 1:
            raise ValueError(f"a prompt pace needs finite prompt_token_ms and chunk_ms >= 0 "
                             f"and chunk_tokens >= 1, got {self.prompt_token_ms}, "
                             f"{self.chunk_ms}, {self.chunk_tokens}")


class StepModel:
    """Mean step milliseconds by rows, as measured (see the module docstring).

    `weight` is what one step's measurement moves its row count's mean by: a
    report of n steps moves it by 1 - (1 - weight)^n, so a report of many steps
    counts for more than a report of one, and a slow machine's older figures fade
    in a few reports."""

    def __init__(self, weight: float = 0.1) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.weight = weight
        self._ms: dict[int, float] = {}
        self._tail_ms: dict[int, float] = {}  # rows -> the worker's last p90 decode step there
        self.steps = 0  # steps measured in all
        self.prefill: PromptPace | None = None  # the worker's last word on it (None: none)

    def observe(self, sample: StepSample) -> None:
        mean_ms = sample.seconds * 1e3 / sample.steps
        before = self._ms.get(sample.rows)
        if before is None:
            self._ms[sample.rows] = mean_ms
        else:
            moved = 1.0 - (1.0 - self.weight) ** sample.steps
            self._ms[sample.rows] = before + moved * (mean_ms - before)
        self.steps += sample.steps
        if sample.tail_seconds > 0:
            self._tail_ms[sample.rows] = sample.tail_seconds * 1e3

    @property
    def measured(self) -> bool:
        return bool(self._ms)

    def table(self) -> tuple[tuple[int, float], ...]:
        """(rows, mean step ms) for each measured row count, by rows."""
        return tuple(sorted(self._ms.items()))

    def predict_ms(self, rows: int) -> float | None:
        """The step's milliseconds with `rows` decoding rows; None before any measurement."""
        return _predict(self.table(), rows)

    def predict_tail_ms(self, rows: int) -> float | None:
        """The p90 decode step at `rows`, as the worker holds its prompt chunks to it
        (predicted from the worker's reports as predict_ms is from the means, never below
        the mean's prediction); the mean's prediction where the worker says none."""
        mean = self.predict_ms(rows)
        tail = _predict(tuple(sorted(self._tail_ms.items())), rows)
        return mean if tail is None or mean is None else max(tail, mean)


def _predict(points: tuple[tuple[int, float], ...], rows: int) -> float | None:
    """The step at `rows` from measured (rows, ms) points, by rows (the module docstring's
    rule); None with none."""
    if not points:
        return None
    rows = max(rows, 1)
    below = [ms for r, ms in points if r <= rows]
    floor = max(below) if below else 0.0
    exact = dict(points)
    if rows in exact:
        guess = exact[rows]
    elif rows < points[0][0]:
        guess = points[0][1]
    elif rows > points[-1][0]:
        guess = points[-1][1] * rows / points[-1][0]
    else:
        (r0, ms0), (r1, ms1) = next(
            (a, b) for a, b in zip(points, points[1:], strict=False) if a[0] < rows < b[0])
        guess = ms0 + (ms1 - ms0) * (rows - r0) / (r1 - r0)
    return max(guess, floor)
