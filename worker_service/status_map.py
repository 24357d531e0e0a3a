"""One table: an engine error -> its gRPC status code and rich details."""

from __future__ import annotations

import grpc
from google.protobuf.message import Message

from ortserve import rich_status

from .errors import CapacityExceeded, ContextWindowFull, EngineError, InvalidRequest


def engine_error_status(error: EngineError) -> tuple[grpc.StatusCode, str, list[Message]]:
    message = str(error)
    if isinstance(error, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, message, [
            rich_status.bad_request(error.field, message),
            rich_status.error_info("INVALID_REQUEST", {"field": error.field}),
        ]
    if isinstance(error, ContextWindowFull):
        return grpc.StatusCode.INVALID_ARGUMENT, message, [
            rich_status.bad_request("prompt", message),
            rich_status.error_info("CONTEXT_LENGTH_EXCEEDED", {
                "prompt_tokens": error.prompt_tokens, "max_new_tokens": error.max_new_tokens,
                "context_length": error.context_length}),
        ]
    if isinstance(error, CapacityExceeded):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, message, [
            rich_status.error_info("WORKER_KV_FULL", {
                "needed_bytes": error.needed_bytes, "held_bytes": error.held_bytes,
                "capacity_bytes": error.capacity_bytes}),
        ]
    return grpc.StatusCode.INTERNAL, message, [rich_status.error_info(type(error).__name__, {})]
