"""The pace of a prompt's chunks beside decoding streams, shared by the worker (which holds
its steps to it: worker_service/core/prefill_budget.py) and the scheduler (which predicts a
request's first token from it: scheduler_service/ledger/time_budget.py), so the two sides
never disagree on how fast a prompt moves under a gap goal.

A step that decodes streams with a gap goal spends on prompt tokens only what keeps it
within the strictest one:

    budget = (goal x GOAL_SHARE - the decode step - a chunk's own cost) / a prompt token's

clamped to [MIN_PREFILL_BUDGET_TOKENS, the configured chunk]; no goal: the configured chunk.
The decode step in it is a high percentile of the decode steps (the worker's PrefillPace), not
their mean: each stream's p99 gap is the goal, and a margin held to the mean puts every decode
above the mean, a full chunk beside it, past the goal. A chunk costs a fixed part (its own batch-1 run over its past: inputs, outputs, the run's
launch) and a part per token; on a CPU the fixed part is what a small chunk is mostly
made of, so a cost per token alone, measured on small chunks, would read as dear tokens and
keep the chunks small.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

# One token of budget more than the two a run over a past needs: a budget of b >= 3 always
# advances the first prompt in line (b tokens, or b - 1 leaving two, or all it has left;
# worker_service/core/step_scheduler.py says why a run over a past is never one token).
MIN_PREFILL_BUDGET_TOKENS = 3

# NOTE: the chunk's costs are means and a chunk's tail is above its mean (a loaded machine, a
# long past): aiming the step at the whole goal would put half the steps with chunks past it.
GOAL_SHARE = 0.8


def strictest_goal_ms(goals_ms: Iterable[int]) -> int:
    """The smallest gap goal set (> 0), or 0 when none is."""
    return min((g for g in goals_ms if g > 0), default=0)


def prefill_budget_tokens(goal_ms: int, decode_step_s: float | None,
                          prompt_token_s: float | None, max_tokens: int,
                          chunk_s: float = 0.0) -> int:
    """Prompt tokens a step may run beside a decode of `decode_step_s` within `goal_ms`,
    a chunk costing `chunk_s` plus `prompt_token_s` a token.

    goal_ms 0 (no goal) or no measured prompt-token cost: `max_tokens`. An unmeasured
    decode step counts as 0 (the chunk alone is held to the goal)."""
    if goal_ms <= 0 or not prompt_token_s or prompt_token_s <= 0:
        return max_tokens
    room_s = goal_ms / 1e3 * GOAL_SHARE - (decode_step_s or 0.0) - max(chunk_s, 0.0)
    if room_s <= 0:
        return min(MIN_PREFILL_BUDGET_TOKENS, max_tokens)
    fits = math.floor(room_s / prompt_token_s)
    return max(MIN_PREFILL_BUDGET_TOKENS, min(max_tokens, fits))


def prefill_s(prompt_tokens: int, goal_ms: int, decode_step_s: float, prompt_token_s: float,
              max_tokens: int, chunk_s: float = 0.0, decode_tail_s: float | None = None) -> float:
    """Seconds a prompt's chunks take beside decodes of `decode_step_s` (their mean) held to
    `goal_ms` (0: no decode or no goal): one step per budget's worth of tokens, each step its
    decode and its chunk (a step with no decode still runs at most `max_tokens`). The budget
    leaves room for `decode_tail_s`, the decode's high percentile the worker holds its chunks
    to (None: the mean)."""
    if prompt_tokens <= 0 or prompt_token_s <= 0:
        return 0.0
    margin_s = decode_step_s if decode_tail_s is None else max(decode_tail_s, decode_step_s)
    budget = prefill_budget_tokens(goal_ms, margin_s, prompt_token_s, max_tokens, chunk_s)
    steps = math.ceil(prompt_tokens / max(budget, 1))
    return steps * (decode_step_s + max(chunk_s, 0.0)) + prompt_tokens * prompt_token_s
