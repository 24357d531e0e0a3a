"""How many prompt tokens a step may run beside its decodes, so it stays within their gap goal.

A step that decodes the running streams also runs prompt chunks (step_scheduler.py), and
on a CPU those chunks cost far more than the decode: with 512 prompt tokens beside it, a
step of 23 streams took several times the decode alone, and those steps were the streams'
p99 gaps (issue 51's load sweep). The scheduler's admission holds the decode step within
the goals; this module holds the chunks beside it:

    budget = (goal x GOAL_SHARE - decode step at these rows (p90) - a chunk's own cost)
             / seconds per prompt token

clamped to [MIN_PREFILL_BUDGET_TOKENS, the configured chunk], where goal is the strictest
max_itl_ms among the decoding streams (the formula is ortserve/rules/prefill_math.py's, the
scheduler's TTFT prediction uses the same). With no goal among them the budget is the configured
chunk, exactly as before. The costs are measured as the engine runs (PrefillPace); until they
are, the budget is the configured chunk (the first steps measure them).

The decode step in the formula is a high percentile (p90) of the steps lately decoded at
these rows, not their mean: the goal is each stream's p99 gap, and a step's decode varies
(the machine's other work, the contexts growing); a margin held to the mean puts every step
whose decode runs above the mean, with a full chunk beside it, past the goal (issue 51's
quiet sweep at 4x saturation: 30 of 44 admitted streams over their 200 ms p99 gap).

The floor keeps every prompt moving (a budget of 3 always advances the first prompt in line:
step_scheduler.py); a decode step already past the goal leaves the floor, so a long prompt
then takes many steps: the scheduler's TTFT check knows the pace (docs/features/time-budget.md).
"""

from __future__ import annotations

import math
import threading
from collections import deque

from ortserve.rules.prefill_math import (  # noqa: F401 (the worker's names for them)
    GOAL_SHARE,
    MIN_PREFILL_BUDGET_TOKENS,
    prefill_budget_tokens,
    strictest_goal_ms,
)


class PrefillPace:
    """What a decode step and a prompt chunk cost on this worker, as measured (engine thread
    records; a reader may look from any thread).

    A step with no prompt tokens moves its row count's decode mean (weight `weight`). A
    step with prompt chunks leaves, over that decode mean, what its chunks cost; a fit of
    that over the step's chunks and tokens (exponentially weighted least squares, weight
    `fit_weight` a step) gives a chunk's own cost and a token's. Where its rows have no
    decode mean yet, the mean at the most rows below them stands in (a step is no faster
    with more rows, so the chunks' share comes out high: the budget errs small); with none
    below, the step teaches nothing. When the chunks seen lately are all of one size the two
    parts cannot be told apart: the last fit that could stands (before any, all per token).

    The budget's decode step is the `tail` quantile of the last `window` decode steps at its
    rows (decode_tail_s); the fit's base stays the mean (a chunk's cost is what a step takes
    over its typical decode)."""

    def __init__(self, weight: float = 0.2, fit_weight: float = 0.05, tail: float = 0.9,
                 window: int = 64) -> None:
        for name, value in (("weight", weight), ("fit_weight", fit_weight), ("tail", tail)):
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value}")
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        self.weight, self.fit_weight, self.tail, self.window = weight, fit_weight, tail, window
        self._lock = threading.Lock()
        self._decode_s: dict[int, float] = {}  # rows -> mean step seconds with no prompt tokens
        self._recent_s: dict[int, deque[float]] = {}  # rows -> the last `window` such steps
        # The fit's weighted sums: chunks^2, chunks x tokens, tokens^2, chunks x s, tokens x s.
        self._sums = [0.0] * 5
        self._fit: tuple[float, float] | None = None  # (a chunk's own s, a token's s)
        self.chunks_run = 0  # prompt chunks recorded since start (the worker's metrics)

    def record(self, rows: int, chunks: int, prompt_tokens: int, seconds: float) -> None:
        if seconds < 0 or rows < 0 or prompt_tokens < 0 or chunks < 0 \
                or (rows == 0 and prompt_tokens == 0):
            return
        with self._lock:
            self.chunks_run += chunks
            if prompt_tokens == 0:
                before = self._decode_s.get(rows)
                self._decode_s[rows] = seconds if before is None else \
                    before + self.weight * (seconds - before)
                self._recent_s.setdefault(rows, deque(maxlen=self.window)).append(seconds)
                return
            below = [r for r in self._decode_s if r <= rows]
            if rows and not below:
                return
            base = self._decode_s[max(below)] if rows else 0.0
            # A noisy step can come in under its decode mean: the chunks still cost something.
            self._learn(max(chunks, 1), prompt_tokens, max(seconds - base, 0.0))

    def _learn(self, chunks: int, tokens: int, extra_s: float) -> None:
        keep, w = 1.0 - self.fit_weight, self.fit_weight
        sample = (chunks * chunks, chunks * tokens, tokens * tokens, chunks * extra_s,
                  tokens * extra_s)
        self._sums = [keep * old + w * new for old, new in zip(self._sums, sample, strict=True)]
        cc, ct, tt, cy, ty = self._sums
        det = cc * tt - ct * ct
        # NOTE: 1 - det / (cc x tt) is the squared correlation of chunks and tokens: near 1
        # when the chunks are all one size, and then the split is noise.
        if det > 0.05 * cc * tt:
            chunk_s, token_s = (cy * tt - ty * ct) / det, (ty * cc - cy * ct) / det
            if chunk_s < 0:  # a chunk's own cost is not negative: all of it per token
                chunk_s, token_s = 0.0, ty / tt
            self._fit = (chunk_s, max(token_s, 0.0))
        elif self._fit is None:
            self._fit = (0.0, ty / tt)

    def decode_step_s(self, rows: int) -> float | None:
        """The mean decode step at `rows`; unmeasured there, the nearest measured row count's
        scaled by rows (proportional: pessimistic above, as the scheduler's step model);
        None before any."""
        with self._lock:
            return _at_rows(self._decode_s, rows)

    def decode_tail_s(self, rows: int) -> float | None:
        """The `tail` quantile of the last `window` decode steps at `rows` (the nearest
        measured row count's, scaled as decode_step_s); None before any."""
        with self._lock:
            return _at_rows({r: _quantile(steps, self.tail) for r, steps in self._recent_s.items()},
                            rows)

    @property
    def prompt_token_s(self) -> float | None:
        """A prompt token's cost in a step (None: not measured; 0: too small to tell)."""
        with self._lock:
            return None if self._fit is None else self._fit[1]

    @property
    def chunk_s(self) -> float:
        """A chunk's own cost in a step, whatever its tokens (0: not measured)."""
        with self._lock:
            return 0.0 if self._fit is None else self._fit[0]

    def budget_tokens(self, goal_ms: int, rows: int, max_tokens: int) -> int:
        """prefill_budget_tokens at this worker's measured costs, the decode step its tail."""
        if goal_ms <= 0:
            return max_tokens
        return prefill_budget_tokens(goal_ms, self.decode_tail_s(rows), self.prompt_token_s,
                                     max_tokens, self.chunk_s)


def _at_rows(by_rows: dict[int, float], rows: int) -> float | None:
    """by_rows[rows]; unmeasured there, the nearest measured row count's, scaled by rows above
    it (proportional: pessimistic, as the scheduler's step model); None when empty."""
    if rows in by_rows:
        return by_rows[rows]
    if not by_rows:
        return None
    nearest = min(by_rows, key=lambda r: (abs(r - rows), -r))
    return by_rows[nearest] * max(rows, 1) / nearest if rows > nearest else by_rows[nearest]


def _quantile(values: deque[float], q: float) -> float:
    """The nearest-rank q quantile (0 < q <= 1) of a non-empty window: a value it holds."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)), 1) - 1]
