"""The bytes' decision, then time's (pure): the ledger calls this under its lock.

Bytes decide first, unchanged (a context or capacity refusal stays what it was).
An ADMITTED or CAPPED decision then passes the time rule (time_budget.py) on the
worker it chose; when that worker would pass a goal, the decision is taken again
over the workers that keep every goal, and when none does the request is
REJECTED TIME_BUSY (it queues when the estimated wait fits its TTFT goal and
deadline) or TIME_GOAL_UNREACHABLE. Last, a deadline that cannot fit
max_new_tokens at the predicted step caps it, said like the byte cap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from scheduler_service.ledger import placement, sentences, time_budget
from scheduler_service.ledger.step_model import StepModel
from scheduler_service.ledger.time_budget import TimeCheck, TimeGoals, Verdict
from scheduler_service.ledger.types import (
    AdmissionDecision,
    AdmissionRequest,
    CapLimit,
    Cause,
    Decision,
    NewTokensCap,
    NewTokensSource,
    Rejection,
)


def goals_of(req: AdmissionRequest, goals: TimeGoals) -> tuple[int, int]:
    """(gap goal, TTFT goal) in force for `req`: its own, else the server's; 0: none."""
    return req.max_itl_ms or goals.max_itl_ms, req.max_ttft_ms or goals.max_ttft_ms


def decided(decision: AdmissionDecision, req: AdmissionRequest, workers: list,
            models: Mapping[str, StepModel], goals: TimeGoals, now: float,
            retry_after_s: float, decide: Callable[[list], AdmissionDecision]) -> AdmissionDecision:
    """`decision` (the bytes') as time allows. `workers`: the open workers' state;
    `decide(subset)`: the bytes' decision over a subset of them."""
    if decision.decision is Decision.REJECTED or decision.worker is None:
        return decision
    itl, ttft = goals_of(req, goals)
    deadline_s = None if req.deadline_at is None else max(0.0, req.deadline_at - now)
    checks = {w.geometry.worker_id: time_budget.check(
        w.geometry.worker_id, models.get(w.geometry.worker_id), w.leases.values(), itl, ttft,
        deadline_s, now, req.queued_ahead, req.prompt_tokens, req.queue_waited_s)
        for w in placement.serving(workers, req.model)}
    chosen = checks[decision.worker.worker_id]
    if chosen.verdict is not Verdict.OK:
        keeping = [w for w in workers if checks.get(w.geometry.worker_id, chosen).verdict
                   is Verdict.OK]
        again = decide(keeping) if keeping else None
        if again is None or again.decision is Decision.REJECTED or again.worker is None:
            return _refused(req, decision, list(checks.values()), retry_after_s)
        decision, chosen = again, checks[again.worker.worker_id]
    if deadline_s is None or not (itl or ttft) or not chosen.predicted_step_ms:
        return decision
    return _within_deadline(decision, req, workers, chosen, deadline_s, retry_after_s)


def _refused(req: AdmissionRequest, decision: AdmissionDecision, checks: list[TimeCheck],
             retry_after_s: float) -> AdmissionDecision:
    order = {Verdict.WAIT: 0, Verdict.BUSY: 1, Verdict.UNREACHABLE: 2}
    best = min((c for c in checks if c.verdict is not Verdict.OK),
               key=lambda c: (order[c.verdict], c.estimated_wait_s, c.fastest_step_ms))
    cause = (Cause.TIME_GOAL_UNREACHABLE if best.verdict is Verdict.UNREACHABLE
             else Cause.TIME_BUSY)
    return _rejected(req, decision, best, cause, retry_after_s,
                     waits=best.verdict is Verdict.WAIT)


def _rejected(req: AdmissionRequest, decision: AdmissionDecision, check: TimeCheck, cause: Cause,
              retry_after_s: float, waits: bool = False,
              fit: int | None = None) -> AdmissionDecision:
    """`fit`: the new tokens its deadline fits (a deadline refusal); None: a goal refusal."""
    g = decision.worker
    assert g is not None
    requested = (decision.budget_cap.requested_max_new_tokens if decision.budget_cap
                 else decision.max_new_tokens)
    rejection = sentences.rendered(Rejection(
        cause=cause, prompt_tokens=req.prompt_tokens, min_new_tokens=req.min_new_tokens,
        requested_max_new_tokens=requested,
        admissible_max_new_tokens=decision.max_new_tokens if fit is None else fit,
        cap_refused=fit is not None and fit >= req.floor_new_tokens,
        context_length=g.context_length, bytes_per_token=g.bytes_per_token,
        capacity_bytes=g.capacity_bytes,
        # The bytes its floor needs: what a queue ticket for it waits on besides time.
        needed_bytes=g.bytes_for(req.prompt_tokens + req.floor_new_tokens),
        retry_after_s=(max(check.estimated_wait_s, retry_after_s)
                       if cause is Cause.TIME_BUSY else 0.0),
        worker_id=check.worker_id, predicted_step_ms=check.predicted_step_ms,
        itl_goal_ms=check.itl_goal_ms, ttft_goal_ms=check.ttft_goal_ms,
        fastest_step_ms=check.fastest_step_ms, streams=check.streams,
        estimated_wait_s=check.estimated_wait_s,
        deadline_ms=(check.deadline_s or 0.0) * 1e3, time_waits=waits,
        waited_s=req.queue_waited_s,
        prefill_ms=check.prefill_ms, prefill_budget_tokens=check.prefill_budget_tokens,
        prompts_ahead_tokens=check.prompts_ahead_tokens, first_token_ms=check.first_token_ms,
        first_token_late=fit is None and check.first_token_late))
    return AdmissionDecision(decision=Decision.REJECTED, request_id=req.request_id,
                     prompt_tokens=req.prompt_tokens, rejection=rejection)


def _within_deadline(decision: AdmissionDecision, req: AdmissionRequest, workers: list,
                     chosen: TimeCheck, deadline_s: float,
                     retry_after_s: float) -> AdmissionDecision:
    fit = time_budget.tokens_within_deadline(deadline_s, chosen.predicted_step_ms)
    if fit >= decision.max_new_tokens:
        return decision
    if fit < req.floor_new_tokens or req.strict:
        return _rejected(req, decision, chosen, Cause.TIME_BUSY, retry_after_s, fit=fit)
    g = decision.worker
    assert g is not None
    state = next(w for w in workers if w.geometry.worker_id == g.worker_id)
    before = decision.budget_cap
    requested = before.requested_max_new_tokens if before else decision.max_new_tokens
    source = decision.max_new_tokens_source or NewTokensSource.REQUEST
    cap = NewTokensCap(
        requested_max_new_tokens=requested, admitted_max_new_tokens=fit,
        requested_was_unset=source is not NewTokensSource.REQUEST,
        requested_bytes=g.bytes_for(req.prompt_tokens + requested),
        admitted_bytes=g.bytes_for(req.prompt_tokens + fit),
        available_bytes=state.available_bytes, capacity_bytes=g.capacity_bytes,
        bytes_per_token=g.bytes_per_token, prompt_tokens=req.prompt_tokens,
        worker_id=g.worker_id, limit=CapLimit.DEADLINE, requested_source=source,
        predicted_step_ms=chosen.predicted_step_ms, deadline_ms=deadline_s * 1e3)
    cap = replace(cap, reason=sentences.cap_reason(cap))
    return replace(decision, decision=Decision.CAPPED, max_new_tokens=fit,
                   reserved_bytes=cap.admitted_bytes, budget_cap=cap)
