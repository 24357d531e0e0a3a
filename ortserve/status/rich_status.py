"""google.rpc.Status with details (grpcio-status): built by servers, read by clients.

A message names the cause, the numbers and the next step; the details carry
the same facts for programs: ErrorInfo (a stable reason and the numbers as
metadata) plus RetryInfo / QuotaFailure / BadRequest where they fit, and any
ortserve message (a Rejection) packed as Any.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.protobuf.message import Message
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "ortserve.v1"


def error_info(reason: str, metadata: Mapping[str, object]) -> error_details_pb2.ErrorInfo:
    """ErrorInfo with stringified numbers (its metadata is map<string, string>)."""
    return error_details_pb2.ErrorInfo(
        reason=reason, domain=DOMAIN, metadata={k: str(v) for k, v in metadata.items()}
    )


def retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(seconds * 1e9))
    return error_details_pb2.RetryInfo(retry_delay=delay)


def bad_request(field: str, description: str) -> error_details_pb2.BadRequest:
    return error_details_pb2.BadRequest(
        field_violations=[error_details_pb2.BadRequest.FieldViolation(field=field, description=description)]
    )


def quota_failure(subject: str, description: str) -> error_details_pb2.QuotaFailure:
    return error_details_pb2.QuotaFailure(
        violations=[error_details_pb2.QuotaFailure.Violation(subject=subject, description=description)]
    )


def to_grpc_status(code: grpc.StatusCode, message: str, details: Iterable[Message] = ()) -> grpc.Status:
    packed = []
    for detail in details:
        any_msg = any_pb2.Any()
        any_msg.Pack(detail)
        packed.append(any_msg)
    status = status_pb2.Status(code=getattr(code_pb2, code.name), message=message, details=packed)
    return rpc_status.to_status(status)


def details_of(error: grpc.RpcError) -> list[any_pb2.Any]:
    """The packed details of a failed call (empty when it carried none)."""
    status = rpc_status.from_call(error)
    return list(status.details) if status is not None else []


def unpack(details: Iterable[any_pb2.Any], message_type: type[Message]) -> Message | None:
    """The first detail of `message_type`, or None."""
    for detail in details:
        if detail.Is(message_type.DESCRIPTOR):
            out = message_type()
            detail.Unpack(out)
            return out
    return None
