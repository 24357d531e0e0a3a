"""The time budget's sentences (time_budget.py), rendered from a Rejection's or a cap's
numbers: the cause, the numbers and a next step, as sentences.py does for bytes."""

from __future__ import annotations

from scheduler_service.ledger.types import Cause, NewTokensCap, Rejection


def rejection_text(r: Rejection) -> tuple[str, str]:
    """(message, remedy) of a TIME_BUSY or TIME_GOAL_UNREACHABLE rejection."""
    if r.cause is Cause.TIME_GOAL_UNREACHABLE and r.first_token_late:
        message = (f"its {r.prompt_tokens:,}-token prompt takes about {r.prefill_ms / 1e3:.1f} s "
                   f"to its first token on worker {r.worker_id} with nothing else running "
                   f"(chunks of {r.prefill_budget_tokens:,} tokens at its measured prompt cost), "
                   f"past its TTFT goal max_ttft_ms {r.ttft_goal_ms:,}: no wait can meet it")
        remedy = (f"loosen max_ttft_ms to at least {int(r.prefill_ms) + 1:,}, or send a "
                  "shorter prompt, or use a smaller model or faster workers")
        return message, remedy
    if r.cause is Cause.TIME_GOAL_UNREACHABLE:
        message = (f"the gap goal max_itl_ms {r.itl_goal_ms:,} is below the decode step worker "
                   f"{r.worker_id} takes with one stream alone ({r.fastest_step_ms:.1f} ms "
                   "predicted from its measured steps): no wait can meet it")
        remedy = (f"loosen max_itl_ms to at least {int(r.fastest_step_ms) + 1:,}, or use a "
                  "smaller model or faster workers")
        return message, remedy
    goal = f"{r.itl_goal_ms:,} ms, the strictest gap goal among them and this request"
    if r.predicted_step_ms and r.itl_goal_ms and r.predicted_step_ms > r.itl_goal_ms:
        message = (f"worker {r.worker_id} serves {r.streams:,} streams; one more would make its "
                   f"decode step {r.predicted_step_ms:.1f} ms, over {goal}; enough of them end in "
                   f"about {r.estimated_wait_s:.1f} s")
        late = []
        if r.ttft_goal_ms and (r.waited_s * 1e3 + max(r.estimated_wait_s * 1e3, r.first_token_ms)
                               > r.ttft_goal_ms):
            late.append(f"its TTFT goal max_ttft_ms {r.ttft_goal_ms:,}" + _chunks(r))
        if r.deadline_ms and r.estimated_wait_s * 1e3 >= r.deadline_ms:
            late.append(f"its deadline ({r.deadline_ms / 1e3:.1f} s left)")
        if late:
            message += ", past " + " and ".join(late)
        remedy = (f"retry in {r.retry_after_s:.1f} s, or loosen max_itl_ms (> "
                  f"{int(r.predicted_step_ms):,} admits it now), or ask for fewer max_new_tokens, "
                  "or use another model or more workers")
        return message, remedy
    if r.first_token_late:
        message = (f"worker {r.worker_id} serves {r.streams:,} streams with gap goal "
                   f"{r.itl_goal_ms:,} ms; beside them its {r.prompt_tokens:,}-token prompt would "
                   f"run in chunks of {r.prefill_budget_tokens:,} tokens a step (what keeps the "
                   f"step within the goal){_ahead(r)}, {r.prefill_ms / 1e3:.1f} s to its first "
                   "token, and "
                   f"after enough of them end (about {r.estimated_wait_s:.1f} s) about "
                   f"{r.first_token_ms / 1e3:.1f} s{_waited(r)}: past its TTFT goal max_ttft_ms "
                   f"{r.ttft_goal_ms:,}")
        remedy = (f"retry in {r.retry_after_s:.1f} s, or loosen max_ttft_ms, or send a shorter "
                  "prompt, or use another model or more workers")
        return message, remedy
    floor = max(r.min_new_tokens, 1)
    at = (f"at worker {r.worker_id}'s predicted decode step of {r.predicted_step_ms:.1f} ms with "
          f"{r.streams:,} streams running")
    if r.cap_refused:
        message = (f"its deadline ({r.deadline_ms / 1e3:.2f} s left) fits "
                   f"{r.admissible_max_new_tokens:,} of max_new_tokens "
                   f"{r.requested_max_new_tokens:,} {at}, and cap policy STRICT refuses a "
                   "smaller ceiling")
        wanted = r.requested_max_new_tokens
        fewer = f"accept a cap (max_new_tokens <= {r.admissible_max_new_tokens:,} fits)"
    else:
        message = (f"its deadline ({r.deadline_ms / 1e3:.2f} s left) fits fewer than "
                   f"min_new_tokens {floor:,} {at}")
        wanted, fewer = floor, "lower min_new_tokens"
    remedy = (f"allow a later deadline (at least {(wanted + 1) * r.predicted_step_ms / 1e3:.2f} s),"
              f" or retry in {r.retry_after_s:.1f} s when fewer streams run, or {fewer}")
    return message, remedy


def _waited(r: Rejection) -> str:
    """The time it already spent in the admission queue, when it was tried again from it."""
    return f", after the {r.waited_s:.1f} s it already waited in line" if r.waited_s else ""


def _ahead(r: Rejection) -> str:
    """The prompts admitted before it that run first, when some have not run yet."""
    if not r.prompts_ahead_tokens:
        return ""
    return f" behind {r.prompts_ahead_tokens:,} prompt tokens admitted before it"


def _chunks(r: Rejection) -> str:
    """The prompt's chunks in a TTFT sentence, when they were predicted."""
    if not r.first_token_ms:
        return ""
    return (f" (its first token in about {r.first_token_ms / 1e3:.1f} s{_waited(r)}: the wait, "
            f"then its {r.prompt_tokens:,}-token prompt's chunks beside the streams left)")


def cap_reason(cap: NewTokensCap, asked: str) -> str:
    """Why a deadline capped max_new_tokens, for BudgetCap.reason."""
    return (f"{asked} at worker {cap.worker_id}'s predicted decode step of "
            f"{cap.predicted_step_ms:.1f} ms needs more than the call's deadline "
            f"({cap.deadline_ms / 1e3:.2f} s left); capped to max_new_tokens "
            f"{cap.admitted_max_new_tokens:,} (what fits it): allow a later deadline for the full "
            "ceiling, or set cap_policy STRICT to be refused instead")
