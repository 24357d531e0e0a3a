"""The worker's one error table: a domain error's reason -> its gRPC status code.

Applied in one place (ortserve.error_path.register_service); handlers raise.
"""

from __future__ import annotations

import grpc

from ortserve.errors import ErrorReason

STATUS_OF_REASON = {
    ErrorReason.INVALID_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.CONTEXT_LENGTH_EXCEEDED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorReason.WORKER_KV_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorReason.LEASE_NOT_FOUND: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.LEASE_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.NOT_READY: grpc.StatusCode.UNAVAILABLE,
    ErrorReason.ENGINE_FAILED: grpc.StatusCode.INTERNAL,
    ErrorReason.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorReason.SESSION_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorReason.SESSION_BUSY: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorReason.SESSION_WORKER_LOST: grpc.StatusCode.FAILED_PRECONDITION,
}
