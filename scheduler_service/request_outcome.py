"""Every Generate and SessionTurn ends in exactly one outcome, counted once at its exit.

The handler opens one RequestOutcome around its whole body; whatever way the body
ends (the worker's Finished relayed, a rejection raised, the caller gone, the
deadline, the worker's failure) passes through its __exit__ exactly once, and
`classify` names it. The outcomes and their causes:

  finished       the Finished event was relayed; cause: its finish reason
                 (length, eos, stop_sequence)
  rejected       answered before any worker ran it; cause: the reason, lowercase
                 (budget_busy, queue_full, queue_timeout, exceeds_capacity,
                 context_length_exceeded, no_worker, invalid_request, model_not_found,
                 session_busy, ...)
  cancelled      the caller cancelled (or went away); cause: queued or running
  deadline       the caller's deadline passed; cause: queued or running
  worker_failed  the worker's stream failed or ended without a Finished; cause:
                 its status code, lowercase (unavailable, internal, ...), or
                 ended_without_finished
  error          anything else (a bug: the error path logs its traceback); cause:
                 the exception's type

A two-step request (Scheduler.Admit, then the worker's own Generate) has no handler
here: its worker says how it ended when it releases the lease, and count_two_step
counts it once under rpc "direct" with the same outcomes (a failure's cause is the
worker's error reason, lowercase).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
from google.rpc import error_details_pb2, status_pb2

from ortserve.process import tracing
from ortserve.rpc.error_path import Relayed, at_deadline
from ortserve.status.errors import DomainError, ErrorReason
from ortserve.v1 import scheduler_pb2, types_pb2

OUTCOMES = ("finished", "rejected", "cancelled", "deadline", "worker_failed", "error")


def finish_reason_label(finish_reason: int) -> str:
    """types_pb2.FinishReason as the label vLLM's finished_reason takes: lowercase."""
    return types_pb2.FinishReason.Name(finish_reason).lower()


def _reason_of(error: Relayed) -> str:
    """The ErrorInfo reason a relayed status carries, lowercase; else its code's name."""
    if error.status_bin:
        status = status_pb2.Status.FromString(error.status_bin)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                return info.reason.lower()
    return error.code.name.lower()


def classify(error: BaseException | None, relaying: bool, finish_reason: str | None,
             time_remaining_s: float | None) -> tuple[str, str]:
    """(outcome, cause) of one request's exit; see the module docstring."""
    if finish_reason is not None:
        # The Finished went out: whatever follows (the caller leaving after it) is not
        # this request's outcome.
        return "finished", finish_reason
    stage = "running" if relaying else "queued"
    if error is None:
        return ("worker_failed", "ended_without_finished") if relaying else ("error", "no_answer")
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        if at_deadline(time_remaining_s):
            return "deadline", stage
        return "cancelled", stage
    if isinstance(error, DomainError):
        if error.reason is ErrorReason.DEADLINE_EXCEEDED:
            return "deadline", stage
        return "rejected", error.reason.value.lower()
    if isinstance(error, grpc.aio.AioRpcError):
        error = Relayed(error)
    if isinstance(error, Relayed):
        if not relaying:
            return "rejected", _reason_of(error)  # a worker judged the request (Tokenize)
        if error.code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return "deadline", stage
        if error.code is grpc.StatusCode.CANCELLED:
            return "cancelled", stage
        return "worker_failed", error.code.name.lower()
    return "error", type(error).__name__


class RequestOutcome:
    """`with RequestOutcome(...) as outcome:` around one request's handler body.

    The handler says `outcome.relaying = True` once its admission is decided and the
    worker's stream starts, and `outcome.finished(event)` when the Finished goes out
    (counted then); the exit does the rest. `count(rpc, outcome, cause, finished)` is
    called once.
    """

    def __init__(self, rpc: str, time_remaining: Callable[[], float | None],
                 count: Callable[[str, str, str, types_pb2.Finished | None], None]) -> None:
        self.rpc = rpc
        self.relaying = False
        self._time_remaining = time_remaining
        self._count = count
        self._finished: types_pb2.Finished | None = None
        self.outcome: tuple[str, str] | None = None

    def finished(self, finished: types_pb2.Finished) -> None:
        """Counted now, before the Finished is sent: whatever follows cannot change the
        outcome (see classify), and a caller that has the Finished and then reads the
        metrics must find its request counted (the handler's exit runs only when grpc
        asks the generator for more, after the caller may have read on)."""
        self._finished = finished
        self._close(None)

    def __enter__(self) -> RequestOutcome:
        return self

    def __exit__(self, exc_type, error, traceback) -> bool:
        self._close(error)
        return False  # the error goes on to the error path

    def _close(self, error: BaseException | None) -> None:
        if self.outcome is None:  # once, whatever calls it
            reason = (finish_reason_label(self._finished.finish_reason)
                      if self._finished is not None else None)
            self.outcome = classify(error, self.relaying, reason, self._time_remaining())
            self._count(self.rpc, *self.outcome, self._finished)
            tracing.annotate(outcome=self.outcome[0], outcome_cause=self.outcome[1])


def request_outcome(rpc: str, context, metrics=None) -> RequestOutcome:
    """A RequestOutcome counting into `metrics` (SchedulerMetrics; None: counting nothing)."""
    count = metrics.request if metrics is not None else (lambda *outcome: None)
    return RequestOutcome(rpc, context.time_remaining, count)

def count_two_step(metrics, request: scheduler_pb2.ReleaseRequest) -> None:
    """A two-step request's one count (rpc "direct"), from its worker's release: outcome and
    cause as RequestOutcome's (docs/operations/operations.md); a finished one's tokens and timings too."""
    finished = request.finished if request.HasField("finished") else None
    if request.outcome == "finished" and finished is not None:
        metrics.request("direct", "finished", finish_reason_label(finished.finish_reason),
                        finished)
    elif request.outcome == "failed":
        metrics.request("direct", "worker_failed", request.cause or "unknown", None)
    elif request.outcome in ("cancelled", "deadline"):
        metrics.request("direct", request.outcome, "running", None)

