"""How many prompt tokens a step may run beside its decodes, so it stays within their gap goal.

A step that decodes the running streams also runs prompt chunks (step_scheduler.py), and
on a CPU those chunks cost far more than the decode: with 512 prompt tokens beside it, a
step of 23 streams took several times the decode alone, and those steps were the streams'
p99 gaps (issue 51's load sweep). The scheduler's admission holds the decode step within
the goals; this module holds the chunks beside it:

    budget = (goal x GOAL_SHARE - decode step at these rows) / seconds per prompt token

clamped to [MIN_PREFILL_BUDGET_TOKENS, the configured chunk], where goal is the strictest
max_itl_ms among the decoding streams (the formula is ortserve/rules/prefill_math.py's, the
scheduler's TTFT prediction uses the same). With no goal among them the budget is the configured
chunk, exactly as before. Both costs are measured as the engine runs (PrefillPace, an
exponentially weighted mean of each); until they are, the budget is the configured chunk
(the first steps measure them).

The floor keeps every prompt moving (a budget of 3 always advances the first prompt in line:
step_scheduler.py); a decode step already past the goal leaves the floor, so a long prompt
then takes many steps: the scheduler's TTFT check knows the pace (docs/features/time-budget.md).
"""

from __future__ import annotations

import threading

from ortserve.rules.prefill_math import (  # noqa: F401 (the worker's names for them)
    GOAL_SHARE,
    MIN_PREFILL_BUDGET_TOKENS,
    prefill_budget_tokens,
    strictest_goal_ms,
)


class PrefillPace:
    """What a decode step and a prompt token cost on this worker, as measured (engine thread
    records; a reader may look from any thread).

    A step with no prompt tokens moves its row count's decode mean; a step with prompt
    tokens moves the prompt-token mean by (step - the decode mean at its rows) / tokens,
    or step / tokens when it decoded nothing. Where its rows have no decode mean yet, the
    mean at the most rows below them stands in (a step is no faster with more rows, so the
    prompt's share comes out high: the budget errs small); with none below, the step
    teaches nothing (its split is unknown). Under steady arrivals most steps carry a chunk,
    so waiting for an exact row count would leave the cost unmeasured."""

    def __init__(self, weight: float = 0.2) -> None:
        if not 0 < weight <= 1:
            raise ValueError(f"weight must be in (0, 1], got {weight}")
        self.weight = weight
        self._lock = threading.Lock()
        self._decode_s: dict[int, float] = {}  # rows -> mean step seconds with no prompt tokens
        self._token_s: float | None = None

    def record(self, rows: int, prompt_tokens: int, seconds: float) -> None:
        if seconds < 0 or rows < 0 or prompt_tokens < 0 or (rows == 0 and prompt_tokens == 0):
            return
        with self._lock:
            if prompt_tokens == 0:
                self._decode_s[rows] = self._moved(self._decode_s.get(rows), seconds)
                return
            below = [r for r in self._decode_s if r <= rows]
            if rows and not below:
                return
            base = self._decode_s[max(below)] if rows else 0.0
            # A noisy step can come in under its decode mean: the chunk still cost something.
            per_token = max(seconds - base, 0.0) / prompt_tokens
            self._token_s = self._moved(self._token_s, per_token)

    def _moved(self, before: float | None, value: float) -> float:
        return value if before is None else before + self.weight * (value - before)

    def decode_step_s(self, rows: int) -> float | None:
        """The mean decode step at `rows`; unmeasured there, the nearest measured row count's
        scaled by rows (proportional: pessimistic above, as the scheduler's step model);
        None before any."""
        with self._lock:
            if rows in self._decode_s:
                return self._decode_s[rows]
            if not self._decode_s:
                return None
            nearest = min(self._decode_s, key=lambda r: (abs(r - rows), -r))
            return self._decode_s[nearest] * max(rows, 1) / nearest if rows > nearest \
                else self._decode_s[nearest]

    @property
    def prompt_token_s(self) -> float | None:
        with self._lock:
            return self._token_s

    def budget_tokens(self, goal_ms: int, rows: int, max_tokens: int) -> int:
        """prefill_budget_tokens at this worker's measured costs."""
        if goal_ms <= 0:
            return max_tokens
        return prefill_budget_tokens(goal_ms, self.decode_step_s(rows), self.prompt_token_s,
                                     max_tokens)
