"""The scheduler's sentences, rendered from the numbers (the ledger keeps the arithmetic).

Every message names the cause, the numbers and a next step. Text only, from
the value types' numbers: the DomainErrors the wing raises are built in
errors.py (the queue's own in queue.py), never here.
"""

from __future__ import annotations

from dataclasses import replace

from ortserve.status.errors import ContextWindowFull, quoted
from ortserve.status.units import human_bytes, human_bytes_at_least, tokens
from scheduler_service.ledger import time_sentences
from scheduler_service.ledger.types import CapLimit, Cause, NewTokensCap, NewTokensSource, Rejection

START_WORKER = ("start a worker (ortserve-worker --scheduler HOST:PORT) or check that workers "
                "can reach the scheduler")


def cap_reason(cap: NewTokensCap) -> str:
    """Why max_new_tokens was reduced, for BudgetCap.reason."""
    n_new, requested = cap.admitted_max_new_tokens, cap.requested_max_new_tokens
    asked = (f"max_new_tokens unset (the server default: {tokens(requested)})"
             if cap.requested_source is NewTokensSource.SERVER_DEFAULT
             else f"max_new_tokens unset (the remaining context window: {tokens(requested)})"
             if cap.requested_was_unset else f"max_new_tokens {requested:,}")
    if cap.limit is CapLimit.DEADLINE:
        return time_sentences.cap_reason(cap, f"prompt {tokens(cap.prompt_tokens)} + {asked}")
    if cap.limit is CapLimit.TENANT_QUOTA:
        return (f"prompt {tokens(cap.prompt_tokens)} + {asked} needs "
                f"{human_bytes(cap.requested_bytes)} of KV at {cap.bytes_per_token:,} B/token, but "
                f"tenant {quoted(cap.tenant)} holds {human_bytes(cap.tenant_reserved_bytes)} of its "
                f"{human_bytes(cap.tenant_quota_bytes)} quota, so {human_bytes(cap.available_bytes)}"
                f" is its room; capped to max_new_tokens {n_new:,} "
                f"({human_bytes(cap.admitted_bytes)}): retry when its requests end for the full "
                "ceiling, set cap_policy WAIT_FULL to wait for it (STRICT to be refused instead), "
                "or ask the operator to raise the tenant's quota")
    if cap.requested_bytes > cap.capacity_bytes:
        why = (f"worker {cap.worker_id}'s whole KV capacity is {human_bytes(cap.capacity_bytes)}; "
               f"raise its --kv-capacity to at least {human_bytes_at_least(cap.requested_bytes)} "
               f"or ask for max_new_tokens <= {n_new:,}")
    else:
        why = (f"other requests hold {human_bytes(cap.capacity_bytes - cap.available_bytes)} of "
               f"worker {cap.worker_id}'s {human_bytes(cap.capacity_bytes)} now; retry later for "
               "the full ceiling, or set cap_policy WAIT_FULL to wait for it (STRICT to be "
               "refused instead)")
    return (f"prompt {tokens(cap.prompt_tokens)} + {asked} needs {human_bytes(cap.requested_bytes)} "
            f"of KV at {cap.bytes_per_token:,} B/token, but {human_bytes(cap.available_bytes)} is "
            f"free; capped to max_new_tokens {n_new:,} ({human_bytes(cap.admitted_bytes)}): {why}")


def _prompt(r: Rejection) -> str:
    if r.prompt_tokens_unknown:
        return ("the prompt's length is unknown (a text or chat prompt is counted by a worker's "
                "tokenizer, and none answered)")
    return f"the prompt is {tokens(r.prompt_tokens)}"


def rendered(r: Rejection) -> Rejection:
    """The rejection with its message and remedy written from its numbers."""
    message, remedy = rejection_text(r)
    return replace(r, message=message, remedy=remedy)


def rejection_text(r: Rejection) -> tuple[str, str]:
    """(message, remedy) of a rejection, from its numbers."""
    floor = max(r.min_new_tokens, 1)
    if r.cause is Cause.NO_WORKER:
        of = f" for model {quoted(r.model)}" if r.model else ""
        if r.registered_workers:
            what = (f"none of the {r.registered_workers} registered workers answered Tokenize"
                    f"{of} (last error: {r.worker_error})")
        else:
            what = f"no worker is registered and heartbeating with the scheduler{of}"
        return f"{what}; {_prompt(r)}", f"retry in {r.retry_after_s:g} s; {START_WORKER}"
    if r.cause is Cause.CONTEXT_LENGTH_EXCEEDED:
        # The worker's sentence, so a caller reads one wording whichever service refused.
        full = ContextWindowFull(r.prompt_tokens, r.requested_max_new_tokens, r.context_length,
                                 r.min_new_tokens)
        return full.cause, full.remedy
    if r.cause in (Cause.QUEUE_FULL, Cause.QUEUE_TIMEOUT):
        return _queue_text(r, floor)
    if r.cause is Cause.TENANT_QUOTA:
        return _tenant_text(r, floor)
    if r.cause in (Cause.TIME_BUSY, Cause.TIME_GOAL_UNREACHABLE):
        return time_sentences.rejection_text(r)
    if r.cause is Cause.TENANT_RATE:
        return (f"tenant {quoted(r.tenant)} may start {r.tenant_requests_per_s:g} requests a "
                f"second (bursts of {r.tenant_burst:,}) and has none left now; "
                f"{_prompt(r)}, nothing is held",
                f"retry in {r.retry_after_s:.2f} s (the client's retry option does this), or ask "
                "the operator for a higher requests_per_s or burst (the scheduler's tenants file)")
    n_new = r.requested_max_new_tokens if r.cap_refused else floor
    what = (f"prompt {tokens(r.prompt_tokens)} + max_new_tokens {n_new:,} "
            "(cap policy STRICT refuses a smaller ceiling)" if r.cap_refused
            else f"prompt {tokens(r.prompt_tokens)} + min_new_tokens {n_new:,}")
    if r.cause is Cause.EXCEEDS_CAPACITY:
        message = (f"{what} need {human_bytes(r.needed_bytes)} of KV at {r.bytes_per_token:,} "
                   f"B/token, more than any worker's whole capacity (largest: "
                   f"{human_bytes(r.capacity_bytes)} on {r.largest_worker_id})")
        remedy = (f"raise the worker's --kv-capacity to at least {human_bytes_at_least(r.needed_bytes)}"
                  + (f", or ask for max_new_tokens <= {r.max_fit_new_tokens:,}"
                     if r.max_fit_new_tokens >= floor else ", or shorten the prompt"))
        return message, remedy
    message = (f"{what} need {human_bytes(r.needed_bytes)} of KV at {r.bytes_per_token:,} B/token; "
               f"the most free on any worker now is {human_bytes(r.available_bytes)} "
               f"(capacity {human_bytes(r.capacity_bytes)}): the budget is held by other requests")
    remedy = (f"retry in {r.retry_after_s:g} s"
              + (f", or accept a cap (max_new_tokens <= {r.admissible_max_new_tokens:,} fits now)"
                 if r.cap_refused else "")
              + ", or add workers")
    return message, remedy


def _queue_text(r: Rejection, floor: int) -> tuple[str, str]:
    need = (f"prompt {tokens(r.prompt_tokens)} + max_new_tokens {r.requested_max_new_tokens:,}"
            if r.cap_refused else f"prompt {tokens(r.prompt_tokens)} + min_new_tokens {floor:,}")
    if r.cause is Cause.QUEUE_FULL and r.tenant:
        message = (f"tenant {quoted(r.tenant)} has {r.queue_length:,} requests waiting in the "
                   f"admission queue, its share of {r.max_queue_length:,} places (by weight), and "
                   f"the queue's other free places are kept for other tenants' shares; {need} "
                   f"need {human_bytes(r.needed_bytes)}")
        remedy = (f"retry in {r.retry_after_s:g} s (the client's retry option does this), or "
                  "ask the operator for a larger weight or a longer --max-queue-length")
        return message, remedy
    if r.cause is Cause.QUEUE_FULL:
        message = (f"the admission queue is full: {r.queue_length:,} of {r.max_queue_length:,} "
                   f"requests wait for {human_bytes(r.bytes_ahead)} of KV; {need} need "
                   f"{human_bytes(r.needed_bytes)} and {human_bytes(r.available_bytes)} is free "
                   f"(capacity {human_bytes(r.capacity_bytes)})")
        remedy = (f"retry in {r.retry_after_s:g} s (the client's retry option does this), or "
                  "raise the scheduler's --max-queue-length, or add workers")
        return message, remedy
    ahead = (f"{r.requests_ahead:,} of {r.queue_length:,} waiting requests were still ahead, "
             f"waiting for {human_bytes(r.bytes_ahead)}" if r.requests_ahead
             else f"it was next in a queue of {r.queue_length:,}")
    message = (f"waited {r.waited_s:.1f} s of its {r.max_queue_wait_s:.1f} s allowed in the "
               f"admission queue: {need} need {human_bytes(r.needed_bytes)} of KV, "
               f"{human_bytes(r.available_bytes)} is free (capacity "
               f"{human_bytes(r.capacity_bytes)}); {ahead}")
    remedy = (f"retry in {r.retry_after_s:g} s, or allow a longer wait (a later deadline, "
              "AdmitRequest.max_queue_wait_ms, the scheduler's --max-queue-wait-s)"
              + (", or accept a cap (cap policy ALLOW)" if r.cap_refused else "")
              + ", or add workers")
    return message, remedy


def _tenant_text(r: Rejection, floor: int) -> tuple[str, str]:
    n_new = r.requested_max_new_tokens if r.cap_refused else floor
    what = (f"prompt {tokens(r.prompt_tokens)} + max_new_tokens {n_new:,} (cap policy STRICT "
            "refuses a smaller ceiling)" if r.cap_refused
            else f"prompt {tokens(r.prompt_tokens)} + min_new_tokens {n_new:,}")
    room = max(0, r.tenant_quota_bytes - r.tenant_reserved_bytes)
    message = (f"{what} need {human_bytes(r.needed_bytes)} of KV at {r.bytes_per_token:,} B/token; "
               f"tenant {quoted(r.tenant)} holds {human_bytes(r.tenant_reserved_bytes)} of its "
               f"quota of {r.tenant_quota_text or human_bytes(r.tenant_quota_bytes)}, "
               f"{human_bytes(room)} of room")
    if not r.waits_for_tenant_room:
        fewer = (f"ask for fewer new tokens (min_new_tokens and max_new_tokens <= "
                 f"{r.admissible_max_new_tokens:,} fit its whole quota)"
                 if r.admissible_max_new_tokens >= 1 else "shorten the prompt")
        return (message + ": more than its whole quota",
                fewer + ", or ask the operator to raise the tenant's quota (the scheduler's "
                "tenants file)")
    remedy = (f"retry in {r.retry_after_s:g} s (the tenant's own requests must end first)"
              + (f", or accept a cap (max_new_tokens <= {r.admissible_max_new_tokens:,} fits "
                 "its room now)" if r.cap_refused else "")
              + ", or wait in the admission queue (max_queue_wait_ms above 0), or ask the "
              "operator to raise the tenant's quota")
    return message, remedy
