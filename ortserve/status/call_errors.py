"""A failed call as a typed exception: one per rejection cause, carrying the numbers, and
the rest by status. The gateway and the Python client (ortserve_client.errors) decode the
scheduler's status with the same from_rpc_error."""

from __future__ import annotations

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2

from ortserve.status import rich_status
from ortserve.v1 import types_pb2

__all__ = ["RETRYABLE", "BudgetBusy", "ContextLengthExceeded", "ExceedsCapacity",
           "GenerationFailed", "InvalidRequest", "NoWorker", "OrtserveError", "QueueFull",
           "QueueTimeout", "Rejected", "from_rpc_error", "rejection_dict"]


def rejection_dict(pb: types_pb2.Rejection) -> dict:
    out = json_format.MessageToDict(pb, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    out["retry_after_s"] = pb.retry_after.ToNanoseconds() / 1e9
    out.pop("retry_after", None)
    return out


class OrtserveError(Exception):
    """A failed call: the status code, the server's message and its structured details."""

    def __init__(self, code: grpc.StatusCode, message: str, details: list | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details or []

    def retry_delay_s(self) -> float:
        """The server's RetryInfo delay in seconds; 0 when it sent none."""
        info = rich_status.unpack(self.details, error_details_pb2.RetryInfo)
        return info.retry_delay.ToNanoseconds() / 1e9 if info is not None else 0.0

    def error_info(self) -> error_details_pb2.ErrorInfo | None:
        return rich_status.unpack(self.details, error_details_pb2.ErrorInfo)

    def to_dict(self) -> dict:
        info = self.error_info()
        return {"error": type(self).__name__, "code": self.code.name, "message": self.message,
                "reason": info.reason if info else "", "metadata": dict(info.metadata) if info else {}}


class Rejected(OrtserveError):
    """The scheduler refused admission; `.rejection` has the cause and the numbers."""

    def __init__(self, code, message, details, rejection: types_pb2.Rejection) -> None:
        super().__init__(code, message, details)
        self.rejection = rejection
        self.cause = types_pb2.RejectionCause.Name(rejection.cause)
        self.remedy = rejection.remedy
        self.prompt_tokens = rejection.prompt_tokens
        self.needed_bytes = rejection.needed_bytes
        self.available_bytes = rejection.available_bytes
        self.capacity_bytes = rejection.capacity_bytes
        self.admissible_max_new_tokens = rejection.admissible_max_new_tokens
        self.cap_refused = rejection.cap_refused
        self.retry_after_s = rejection.retry_after.ToNanoseconds() / 1e9
        self.queue_length = rejection.queue_length
        self.bytes_ahead = rejection.bytes_ahead
        self.waited_ms = rejection.waited_ms

    def to_dict(self) -> dict:
        return {**super().to_dict(), "rejection": rejection_dict(self.rejection)}


class ContextLengthExceeded(Rejected):
    """prompt (+ min_new_tokens, or + max_new_tokens) beyond the model's context window."""


class ExceedsCapacity(Rejected):
    """More than any worker's whole KV capacity, even idle."""


class BudgetBusy(Rejected):
    """The budget is held by other requests now; retry after `.retry_after_s`."""


class TimeBusy(Rejected):
    """One more stream would pass a latency goal, and the wait would pass the request's TTFT
    goal or deadline; retry after `.retry_after_s` (the estimated wait)."""


class TimeGoalUnreachable(Rejected):
    """The request's max_itl_ms is below a worker's step with one stream: loosen it."""


class NoWorker(Rejected):
    """No worker is registered and healthy."""


class QueueFull(Rejected):
    """The scheduler's admission queue is full; retry after `.retry_after_s`."""


class QueueTimeout(Rejected):
    """The request waited the longest the scheduler allows; retry after `.retry_after_s`."""


class InvalidRequest(OrtserveError):
    """A bad field (INVALID_ARGUMENT); `.field` names it when the server said."""

    @property
    def field(self) -> str:
        bad = rich_status.unpack(self.details, error_details_pb2.BadRequest)
        return bad.field_violations[0].field if bad and bad.field_violations else ""


class GenerationFailed(OrtserveError):
    """Any other failure: a worker died, a deadline passed, an internal error."""


_BY_CAUSE = {
    types_pb2.CONTEXT_LENGTH_EXCEEDED: ContextLengthExceeded,
    types_pb2.EXCEEDS_CAPACITY: ExceedsCapacity,
    types_pb2.BUDGET_BUSY: BudgetBusy,
    types_pb2.NO_WORKER: NoWorker,
    types_pb2.QUEUE_FULL: QueueFull,
    types_pb2.QUEUE_TIMEOUT: QueueTimeout,
    types_pb2.TIME_BUSY: TimeBusy,
    types_pb2.TIME_GOAL_UNREACHABLE: TimeGoalUnreachable,
}

# Worth retrying after RetryInfo's delay: the same request may be admitted later.
RETRYABLE = (BudgetBusy, NoWorker, QueueFull, QueueTimeout, TimeBusy)


def from_rpc_error(error: grpc.RpcError) -> OrtserveError:
    code, message = error.code(), error.details() or ""
    try:
        details = rich_status.details_of(error)
    except ValueError:
        details = []
    rejection = rich_status.unpack(details, types_pb2.Rejection)
    if rejection is not None:
        return _BY_CAUSE.get(rejection.cause, Rejected)(code, message, details, rejection)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidRequest(code, message, details)
    return GenerationFailed(code, message, details)
