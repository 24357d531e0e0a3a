"""Time in the ledger beside bytes: may one more stream start on a worker now (pure)?

A worker's engine advances every running stream by one token per step, so the
gap between a stream's tokens is the step's time, and one more stream makes
every step longer. The rule (docs/features/time-budget.md):

- goals: a request's own `max_itl_ms` / `max_ttft_ms`, else the server's
  (`--max-itl-ms`, `--max-ttft-ms`); 0 is no goal. With no goal anywhere (the
  default) nothing here applies: admission is by bytes alone, as before.
- admit while the step predicted with one more row (step_model.py) is within the
  gap goal of every stream it would serve: the newcomer's and each admitted
  stream's (never slow the admitted below their goal);
- otherwise the request waits in the admission queue for streams to end, unless
  the estimated wait would pass its TTFT goal or its deadline: then it is refused
  at once (TIME_BUSY, retry after the estimated wait);
- its first token comes after the wait and its prompt's chunks, which run beside
  the streams decoding at the pace their gap goal allows (a step spends on prompt
  tokens only what keeps it within the goal: ortserve/rules/prefill_math.py, at
  the worker's measured prompt-token cost), behind the prompts admitted before it
  that have not run yet (the worker runs prompts first come, first served): when
  that passes its TTFT goal it waits for enough streams to end that it does not
  (or is refused, as above); a prompt that passes its TTFT goal even alone is
  refused as unreachable, as no wait cures it;
- a gap goal below what the worker's step takes with one row (the request alone)
  can never be met: TIME_GOAL_UNREACHABLE;
- a deadline shorter than max_new_tokens at the predicted rate caps
  max_new_tokens to what fits (said like the byte cap), or refuses when not even
  min_new_tokens fit.

Before a worker's first measurement nothing is predicted and it is admitted by
bytes alone. The estimated wait is the time until enough of its streams end,
each at the predicted step times what its lease may still generate (its
max_new_tokens less what the time since admission could have produced), the
requests already waiting in line taking their departures first: an upper bound
for streams that stop early. No preemption: nothing here ever ends
or slows an admitted stream.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from ortserve.rules.prefill_math import prefill_budget_tokens, prefill_s
from scheduler_service.ledger.step_model import PromptPace, StepModel
from scheduler_service.ledger.types import Lease


@dataclass(frozen=True)
class TimeGoals:
    """The server's default goals (0: none), for requests that set none."""

    max_itl_ms: int = 0
    max_ttft_ms: int = 0

    def __post_init__(self) -> None:
        for name in ("max_itl_ms", "max_ttft_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0: no goal), got {getattr(self, name)}")


class Verdict(enum.Enum):
    OK = "ok"  # within every goal now (or no goal, or not measured yet)
    WAIT = "wait"  # not now; the estimated wait fits its TTFT goal and deadline: queue
    BUSY = "busy"  # not now, and the wait would pass its TTFT goal or deadline: refuse now
    UNREACHABLE = "unreachable"  # its gap goal is below the step with it alone


@dataclass(frozen=True)
class TimeCheck:
    """One worker's answer on time for one request, with the numbers a message needs."""

    verdict: Verdict
    worker_id: str
    streams: int = 0  # streams the worker serves now (leases holding a batch row)
    predicted_step_ms: float = 0.0  # the step with one more row (0: not measured)
    itl_goal_ms: int = 0  # the strictest gap goal among the newcomer and the admitted
    ttft_goal_ms: int = 0  # the newcomer's TTFT goal (0: none)
    fastest_step_ms: float = 0.0  # the step with one row: no gap goal below it can be met
    estimated_wait_s: float = 0.0  # until enough streams end for the step to fit the goal
    deadline_s: float | None = None  # time left on the request's call when it arrived
    # Its prompt's chunks beside the streams running now, held to their gap goal (0: not
    # predicted: no TTFT goal, or the worker's prompt-token cost unmeasured).
    prefill_ms: float = 0.0
    prefill_budget_tokens: int = 0  # the prompt tokens a step beside them may run
    # Prompt tokens admitted before it that have not run yet, by the prediction: they run
    # first, and prefill_ms counts them.
    prompts_ahead_tokens: int = 0
    first_token_ms: float = 0.0  # the wait, then its chunks beside the streams left (0: ditto)
    # The verdict is its first token's (its TTFT goal, its prompt's chunks), not the step's.
    first_token_late: bool = False


@dataclass(frozen=True)
class WorkerTime:
    """A worker's time budget now, for GetBudget and the metrics."""

    worker_id: str
    measured: bool
    streams: int
    step_ms: float  # predicted at its streams now (0: not measured, or no stream)
    next_step_ms: float  # predicted with one more stream (0: not measured)
    itl_goal_ms: int  # the strictest gap goal among its streams (0: none)
    steps_measured: int
    table: tuple[tuple[int, float], ...]  # (rows, mean step ms) as measured
    prefill: PromptPace | None = None  # its prompt chunks' pace, as its last heartbeat said


def streams_of(leases: Iterable[Lease]) -> list[Lease]:
    """The leases that hold a batch row: a session's lease between turns decodes nothing,
    one whose turn runs is a stream like any other."""
    return [lease for lease in leases if lease.decoding]


def strictest(goals: Iterable[int]) -> int:
    """The smallest goal set (> 0), or 0 when none is."""
    return min((g for g in goals if g > 0), default=0)


def worker_time(worker_id: str, model: StepModel | None, leases: Iterable[Lease]) -> WorkerTime:
    streams = streams_of(leases)
    n = len(streams)
    step = model.predict_ms(n) if model is not None and n else None
    after = model.predict_ms(n + 1) if model is not None else None
    return WorkerTime(worker_id=worker_id, measured=bool(model and model.measured), streams=n,
                      step_ms=step or 0.0, next_step_ms=after or 0.0,
                      itl_goal_ms=strictest(s.max_itl_ms for s in streams),
                      steps_measured=model.steps if model else 0,
                      table=model.table() if model else (),
                      prefill=model.prefill if model else None)


def check(worker_id: str, model: StepModel | None, leases: Iterable[Lease], itl_goal_ms: int,
          ttft_goal_ms: int, deadline_s: float | None, now: float, ahead: int = 0,
          prompt_tokens: int = 0, waited_s: float = 0.0) -> TimeCheck:
    """May a request with these goals (already resolved against the server's) start on this
    worker now? `ahead`: requests waiting in line before it, each taking a departure first;
    `prompt_tokens`: its prompt (its chunks' time counts toward its TTFT goal); `waited_s`:
    what it already waited in the admission queue (spent of its TTFT goal).
    See the module docstring for the rule."""
    streams = streams_of(leases)
    n = len(streams)
    binding = strictest([itl_goal_ms, *(s.max_itl_ms for s in streams)])
    predicted = model.predict_ms(n + 1) if model is not None else None
    prefill = _prefill(model, streams, prompt_tokens) if ttft_goal_ms else None
    base = TimeCheck(Verdict.OK, worker_id, streams=n, predicted_step_ms=predicted or 0.0,
                     itl_goal_ms=binding, ttft_goal_ms=ttft_goal_ms, deadline_s=deadline_s)
    if predicted is None:
        return base
    assert model is not None
    fastest = model.predict_ms(1) or 0.0
    leaving = 0  # streams that must end before it starts
    if binding and predicted > binding:
        if itl_goal_ms and fastest > itl_goal_ms:
            return _with(base, Verdict.UNREACHABLE, fastest, 0.0)
        # How many streams must end before the step with this one fits the strictest goal.
        leaving = next((k for k in range(1, n + 1)
                        if (model.predict_ms(n + 1 - k) or 0.0) <= binding), n)
    step_s = (model.predict_ms(n) or predicted) / 1e3
    ends_s = sorted(max(0.0, s.max_new_tokens * step_s - (now - s.decoding_since)) for s in streams)

    def wait_s(k: int) -> float:
        return _departure_s(ends_s, k - 1 + ahead, _mean_tokens(streams) * step_s) if k else 0.0

    chunks_s = 0.0
    if prefill is not None:
        alone_s, chunk_tokens = prefill(0, 0)
        if alone_s > ttft_goal_ms / 1e3:
            # Its prompt alone, on an idle worker, passes its TTFT goal: no wait cures it.
            return replace(base, verdict=Verdict.UNREACHABLE, prefill_ms=alone_s * 1e3,
                           prefill_budget_tokens=chunk_tokens, first_token_ms=alone_s * 1e3,
                           first_token_late=True)
        prompts_ahead = _prompts_ahead(streams, now, _prompt_rate(prefill(n, 0)[1], model, n))

        def first_s(k: int) -> float:
            """Its first token once k streams have ended: the wait, then the prompts still
            ahead of it then, then its own, beside the streams left."""
            wait = wait_s(k)
            return wait + prefill(n - k, prompts_ahead(now + wait))[0]

        # NOTE: the goal counts from its arrival: a request tried again from the queue has
        # spent its time in line (before, it was held to the whole goal again, and its first
        # token came that much later than the goal).
        ttft_left_s = ttft_goal_ms / 1e3 - waited_s
        step_leaving = leaving
        leaving = next((k for k in range(leaving, n + 1) if first_s(k) <= ttft_left_s),
                       n)  # n: only an empty worker would do, too late as the wait says below
        now_s, budget = prefill(n, prompts_ahead(now))
        chunks_s = first_s(leaving) - wait_s(leaving)
        base = replace(base, prefill_ms=now_s * 1e3, prefill_budget_tokens=budget,
                       prompts_ahead_tokens=prompts_ahead(now), first_token_ms=first_s(leaving) * 1e3,
                       first_token_late=leaving > step_leaving)
    wait = wait_s(leaving)
    if not leaving:
        return base
    too_late = ((ttft_goal_ms and (waited_s + wait + chunks_s) * 1e3 > ttft_goal_ms)
                or (deadline_s is not None and wait >= deadline_s))
    return _with(base, Verdict.BUSY if too_late else Verdict.WAIT, fastest, wait)


def _prefill(model: StepModel | None, streams: list[Lease], prompt_tokens: int):
    """(seconds, budget tokens) of the prompt's chunks beside m of these streams behind
    `ahead` prompt tokens that run first, by (m, ahead); None when the worker's prompt-token
    cost is not measured. The step at m rows is the measured decode mean, the budget beside it
    leaves room for the worker's p90 decode there (as the worker's own budget does), the goal
    the strictest among all of them (pessimistic once some end)."""
    pace = model.prefill if model is not None else None
    if pace is None or prompt_tokens <= 0:
        return None
    assert model is not None
    goal_ms = strictest(s.max_itl_ms for s in streams)
    token_s, chunk_s = pace.prompt_token_ms / 1e3, pace.chunk_ms / 1e3

    def at(m: int, ahead: int) -> tuple[float, int]:
        step = (model.predict_ms(m) or 0.0) / 1e3 if m else 0.0
        tail = (model.predict_tail_ms(m) or 0.0) / 1e3 if m else 0.0
        goal = goal_ms if m else 0
        # NOTE: the worker's budget is shared by the prompts in line, first come first
        # served: the prompts ahead and its own run as one line of tokens.
        return (prefill_s(ahead + prompt_tokens, goal, step, token_s, pace.chunk_tokens, chunk_s,
                          tail),
                prefill_budget_tokens(goal, tail, token_s, pace.chunk_tokens, chunk_s))
    return at


def _prompt_rate(budget_tokens: int, model: StepModel, rows: int) -> float:
    """Prompt tokens a second the worker runs beside `rows` streams at this budget a step:
    each step its decode, a chunk's own run and the budget's tokens."""
    pace = model.prefill
    assert pace is not None
    step_s = ((model.predict_ms(rows) or 0.0) if rows else 0.0) / 1e3 + pace.chunk_ms / 1e3 \
        + budget_tokens * pace.prompt_token_ms / 1e3
    return budget_tokens / step_s if step_s > 0 else math.inf


def _prompts_ahead(streams: list[Lease], now: float, tokens_per_s: float):
    """The prompt tokens of these streams not yet run at a time t >= now, by t: the worker
    runs admitted prompts first come, first served, each from its admission (or when the one
    before it ends) at `tokens_per_s`. A prediction, not a report: the worker does not say
    which prompts it has run (see docs/features/time-budget.md's limits)."""
    left: list[tuple[float, float, int]] = []  # (start, end, tokens) of those not done by now
    free_at = -math.inf
    for lease in sorted(streams, key=lambda s: s.decoding_since):
        if lease.prompt_tokens <= 0:
            continue  # nothing to run (and no span to divide by below)
        start = max(free_at, lease.decoding_since)
        free_at = start + lease.prompt_tokens / tokens_per_s
        if free_at > now:
            left.append((start, free_at, lease.prompt_tokens))

    def at(t: float) -> int:
        return math.ceil(sum(tokens * min(1.0, (end - t) / (end - start))
                             for start, end, tokens in left if end > t))
    return at


def _mean_tokens(streams: list[Lease]) -> float:
    return sum(s.max_new_tokens for s in streams) / len(streams) if streams else 0.0


def _departure_s(ends_s: list[float], index: int, stream_s: float) -> float:
    """When the `index`-th stream (0: the first) to end from now leaves: one of those
    running now, or beyond them, one more every stream_s / n (n streams each lasting about
    stream_s, as those that take their rows do)."""
    if not ends_s:
        return 0.0
    if index < len(ends_s):
        return ends_s[index]
    return ends_s[-1] + (index - len(ends_s) + 1) * stream_s / len(ends_s)


def _with(base: TimeCheck, verdict: Verdict, fastest_ms: float, wait_s: float) -> TimeCheck:
    return replace(base, verdict=verdict, fastest_step_ms=fastest_ms, estimated_wait_s=wait_s)


def tokens_within_deadline(deadline_s: float, step_ms: float) -> int:
    """New tokens that fit `deadline_s` at `step_ms` a token, the prompt's prefill counted as
    one more step (a low estimate: a long prompt's chunks take several, so a capped request
    with a long prompt may still reach its deadline; the cap never cuts what decode fits)."""
    if step_ms <= 0:
        return 2**31 - 1
    return max(0, math.floor(deadline_s * 1e3 / step_ms) - 1)
