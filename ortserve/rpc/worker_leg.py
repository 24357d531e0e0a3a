"""The worker leg of an admitted request, written once for every caller that runs it.

An admitted request reaches its worker from four places: the scheduler's relay
(Generate) and SessionTurn, the gateway's two-step path and the Python client's.
Each builds the worker's request, composes the timings, words a worker's failure
and turns a REJECTED admission into the status Scheduler.Generate ends with;
the rules for those four are here, so every path answers alike:

- `worker_request`: the admitted ceiling and the resolved model; the queue
  wait is the scheduler's business, decided.
- `compose_timings`: the worker timed from its own start; the caller's wait
  before it (admission, queue, the call's setup) belongs to queue and ttft,
  and total is the caller's.
- `failure_message`: a worker call's failure as the caller passes it on.
- `rejection_error` / `rejection_status`: a Rejection as its DomainError
  (the code from the one table) and as a failed call's status.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
from google.rpc import error_details_pb2, status_pb2

from ortserve.rpc.error_path import (
    STATUS_DETAILS_KEY,
    domain_status,
    is_worker_failure,
    reason_of,
    worker_failed_status,
)
from ortserve.status import rich_status
from ortserve.status.errors import (
    METADATA_ECHO_LIMIT,
    ContextWindowFull,
    DomainError,
    ErrorReason,
    clip,
)
from ortserve.status.units import human_bytes
from ortserve.v1 import types_pb2, worker_pb2

# Admit's wait when the request sets none: the server's bound (--max-queue-wait-s) and the
# call's deadline then decide, as for Generate's unset max_queue_wait_ms.
SERVER_BOUND_MS = 2**32 - 1
# A lease lost to a scheduler restart: a worker re-registers within a heartbeat or two, so
# an admission a second later finds the new scheduler serving.
LEASE_LOST_RETRY_S = 1.0


def stream_deadline_ms(remaining_s: float | None) -> int:
    """AdmitRequest.stream_deadline_ms for a two-step caller whose worker stream will have
    `remaining_s` (its one deadline; None: none, 0 sent): the scheduler caps to it as it caps a
    relayed Generate to its gRPC deadline (docs/features/time-budget.md)."""
    if remaining_s is None:
        return 0
    return min(max(int(remaining_s * 1e3), 1), 2**32 - 1)


def worker_request(request: types_pb2.GenerateRequest, lease_id: str, max_new_tokens: int,
                   model: str | None = None, prompt_token_ids: Sequence[int] = (),
                   session_id: str = "") -> worker_pb2.WorkerGenerateRequest:
    """What the worker gets for an admitted `request` (left as it is): the admitted
    ceiling, the resolved `model` (None: the request's own), no queue wait."""
    inner = types_pb2.GenerateRequest()
    inner.CopyFrom(request)
    inner.max_new_tokens = max_new_tokens
    if model is not None:
        inner.model = model
    # The scheduler's business, decided: the queue's wait and order.
    inner.ClearField("max_queue_wait_ms")
    inner.ClearField("priority")
    return worker_pb2.WorkerGenerateRequest(lease_id=lease_id, request=inner,
                                            prompt_token_ids=prompt_token_ids,
                                            session_id=session_id)


def compose_timings(timings: types_pb2.Timings, started_s: float, offset_ms: float) -> None:
    """The worker's Finished timings as the caller reports them: `offset_ms` (what the caller
    waited before the worker's start) added to queue and ttft; total from `started_s`
    (perf_counter at the caller's start) to now."""
    timings.queue_ms += offset_ms
    timings.ttft_ms += offset_ms
    timings.total_ms = (time.perf_counter() - started_s) * 1e3


def failure_message(worker_id: str, address: str, error: grpc.RpcError, tokens: int,
                    if_worker_dies: str | None) -> str:
    """A worker call's failure as its caller words it: a worker gone mid-stream
    (UNAVAILABLE) with the tokens it sent and `if_worker_dies` (the next step; None:
    named by the worker only), anything else named by the worker."""
    if error.code() == grpc.StatusCode.UNAVAILABLE and if_worker_dies is not None:
        return worker_failed_message(worker_id, address, tokens, clip(error.details(), 300),
                                     if_worker_dies)
    return f"worker {worker_id}: {clip(error.details(), 600)}"


def worker_failed_message(worker_id: str, address: str, tokens: int, why: str,
                          next_step: str) -> str:
    """The one wording of a worker that failed mid-request, for every path."""
    return f"worker {worker_id} at {address} failed after {tokens} tokens: {why}; {next_step}"


class StatusError(grpc.RpcError):
    """A failure in the shape of a failed call (code, details, rich status), for callers
    that raise what a call would (the two-step paths), so one decoder reads both paths."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 trailing: Sequence[tuple[str, bytes]] = ()) -> None:
        super().__init__(message)
        self._code, self._message, self._trailing = code, message, tuple(trailing)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self):
        return self._trailing


def relabelled(error: grpc.RpcError, message: str, field_prefix: str = "") -> StatusError:
    """`error` with `message` (its rich status kept, re-labelled to agree: a google.rpc.Status
    must match grpc-message, or clients drop it); `field_prefix` stripped from field paths."""
    # NOTE: an upstream UNKNOWN (a bug there) is INTERNAL, as the scheduler's relay makes it.
    code = error.code() if error.code() != grpc.StatusCode.UNKNOWN else grpc.StatusCode.INTERNAL
    status_bin = next((v for k, v in (error.trailing_metadata() or ()) if k == STATUS_DETAILS_KEY),
                      None)
    if status_bin is None:
        return StatusError(code, message)
    status = status_pb2.Status.FromString(status_bin)
    status.code = code.value[0]
    status.message = message
    if field_prefix:
        for packed in status.details:
            if packed.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                packed.Unpack(bad)
                for violation in bad.field_violations:
                    violation.field = violation.field.removeprefix(field_prefix)
                packed.Pack(bad)
            elif packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                packed.Unpack(info)
                if "field" in info.metadata:
                    info.metadata["field"] = info.metadata["field"].removeprefix(field_prefix)
                packed.Pack(info)
    return StatusError(code, message, ((STATUS_DETAILS_KEY, status.SerializeToString()),))


def worker_failure(error: grpc.RpcError, admission: types_pb2.Admission, tokens: int,
                   claimed: bool) -> StatusError:
    """A two-step caller's worker call failure (the gateway's, the client's), worded as the
    scheduler's relay words it; `claimed`: the worker had claimed the lease, so it, not the
    caller, gives it back. A worker that failed (no answer of its own) is UNAVAILABLE with
    ErrorInfo WORKER_FAILED, as the relay answers it; one that no longer knows the lease
    the caller was admitted is UNAVAILABLE LEASE_LOST (lease_lost)."""
    if reason_of(error) == ErrorReason.LEASE_NOT_FOUND.value:
        return lease_lost(error, admission, tokens)
    if not is_worker_failure(error):
        return relabelled(error, failure_message(admission.worker_id, admission.worker_address,
                                                 error, tokens, None))
    lease = ("its lease returns to the budget when the scheduler expires it (its "
             "--lease-ttl-s)" if claimed else "its unclaimed lease is given back")
    message = worker_failed_message(admission.worker_id, admission.worker_address, tokens,
                                    clip(error.details() or "", 300), f"{lease}; retry the request")
    return StatusError(grpc.StatusCode.UNAVAILABLE, message, ((STATUS_DETAILS_KEY, (
        worker_failed_status(message, admission.worker_id, admission.worker_address,
                             tokens, error))),))


def lease_lost(error: grpc.RpcError, admission: types_pb2.Admission, tokens: int
               ) -> StatusError:
    """The worker answers LEASE_NOT_FOUND for a lease Admit granted this caller: the
    scheduler that granted it restarted without it (the worker's claim found no such
    lease, or its re-registration was refused it), or it expired before the worker took
    the request. Not the caller's NOT_FOUND (clients read 404 as "no such route or
    model" and do not retry): UNAVAILABLE, ErrorInfo LEASE_LOST with the lease, worker and
    tokens already sent, and RetryInfo."""
    message = (f"lease {clip(admission.lease_id)} was lost on worker {admission.worker_id} "
               f"at {admission.worker_address} after {tokens} tokens: the scheduler that "
               "admitted the request restarted without it, or it expired before the worker "
               f"took the request (the worker said: {clip(error.details() or '', 300)}); "
               "retry the request")
    info = rich_status.error_info(ErrorReason.LEASE_LOST.value, {
        "lease_id": clip(admission.lease_id, METADATA_ECHO_LIMIT),
        "worker_id": clip(admission.worker_id, METADATA_ECHO_LIMIT),
        "worker_address": clip(admission.worker_address, METADATA_ECHO_LIMIT),
        "tokens_sent": tokens})
    status = rich_status.to_grpc_status(grpc.StatusCode.UNAVAILABLE, message,
                                        [info, rich_status.retry_info(LEASE_LOST_RETRY_S)])
    return StatusError(grpc.StatusCode.UNAVAILABLE, message, status.trailing_metadata)


def rejection_error(r: types_pb2.Rejection) -> DomainError:
    """A REJECTED admission as the error Scheduler.Generate ends with.

    Every cause takes this one path, NO_WORKER included, so clients always find
    the Rejection detail (the Python client keys its exception on it).
    """
    cause = types_pb2.RejectionCause.Name(r.cause)
    numbers = {
        "prompt_tokens": r.prompt_tokens, "prompt_tokens_unknown": str(r.prompt_tokens_unknown).lower(),
        "min_new_tokens": r.min_new_tokens, "requested_max_new_tokens": r.requested_max_new_tokens,
        "admissible_max_new_tokens": r.admissible_max_new_tokens,
        "context_length": r.context_length, "needed_bytes": r.needed_bytes,
        "available_bytes": r.available_bytes, "capacity_bytes": r.capacity_bytes,
        "bytes_per_token": r.bytes_per_token, "cap_refused": str(r.cap_refused).lower(),
    }
    if cause in ("QUEUE_FULL", "QUEUE_TIMEOUT"):
        numbers.update(queue_length=r.queue_length, max_queue_length=r.max_queue_length,
                       requests_ahead=r.requests_ahead, bytes_ahead=r.bytes_ahead,
                       waited_ms=round(r.waited_ms, 1), max_queue_wait_ms=round(r.max_queue_wait_ms, 1))
    if cause == "TENANT_RATE":
        numbers.update(tenant=r.tenant, tenant_requests_per_s=r.tenant_requests_per_s,
                       tenant_burst=r.tenant_burst)
    if cause in ("TIME_BUSY", "TIME_GOAL_UNREACHABLE"):
        numbers.update(worker_id=r.worker_id, predicted_step_ms=round(r.predicted_step_ms, 1),
                       itl_goal_ms=r.itl_goal_ms, ttft_goal_ms=r.ttft_goal_ms,
                       fastest_step_ms=round(r.fastest_step_ms, 1), streams=r.streams,
                       estimated_wait_ms=round(r.estimated_wait_ms, 1),
                       deadline_ms=round(r.deadline_ms, 1), prefill_ms=round(r.prefill_ms, 1),
                       prefill_budget_tokens=r.prefill_budget_tokens,
                       first_token_ms=round(r.first_token_ms, 1))
    if cause == "TENANT_QUOTA":
        numbers.update(tenant=r.tenant, tenant_quota_bytes=r.tenant_quota_bytes,
                       tenant_reserved_bytes=r.tenant_reserved_bytes)
    details = [r]
    field = ""
    if cause == "CONTEXT_LENGTH_EXCEEDED":
        # The worker's choice of field too: the one the caller set that overflows.
        field = ContextWindowFull(r.prompt_tokens, r.requested_max_new_tokens, r.context_length,
                                  r.min_new_tokens).field
    if cause in ("BUDGET_BUSY", "EXCEEDS_CAPACITY", "QUEUE_FULL", "QUEUE_TIMEOUT"):
        details.append(rich_status.quota_failure(
            "kv_cache_bytes", f"needs {human_bytes(r.needed_bytes)}, "
            f"{human_bytes(r.available_bytes)} free of {human_bytes(r.capacity_bytes)}"))
    if cause in ("TIME_BUSY", "TIME_GOAL_UNREACHABLE"):
        details.append(rich_status.quota_failure(
            f"worker/{r.worker_id}/decode_step_ms",
            f"{r.predicted_step_ms:.1f} ms predicted with one more stream; goal "
            f"{r.itl_goal_ms:,} ms; {r.streams:,} streams running"))
    if cause == "TENANT_RATE":
        details.append(rich_status.quota_failure(
            f"tenant/{r.tenant}/requests_per_s",
            f"{r.tenant_requests_per_s:g} requests/s, bursts of {r.tenant_burst:,}"))
    if cause == "TENANT_QUOTA":
        details.append(rich_status.quota_failure(
            f"tenant/{r.tenant}/kv_cache_bytes",
            f"needs {human_bytes(r.needed_bytes)}, the tenant holds "
            f"{human_bytes(r.tenant_reserved_bytes)} of its "
            f"{human_bytes(r.tenant_quota_bytes)} quota"))
    return DomainError(ErrorReason(cause), f"rejected ({cause.lower()}): {r.message}; {r.remedy}",
                       metadata=numbers, field=field,
                       retry_after_s=r.retry_after.ToNanoseconds() / 1e9, details=details)


def rejection_status(r: types_pb2.Rejection) -> StatusError:
    """A REJECTED Admit as the status Scheduler.Generate ends with for the same rejection."""
    return StatusError(*domain_status(rejection_error(r)))
