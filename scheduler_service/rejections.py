"""A REJECTED admission as the error a stream ends with (Generate, SessionTurn).

Its status code comes from the one table (ortserve.status.status_table), like every
other domain error's.
"""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2

from ortserve.rpc import worker_leg
from ortserve.status import rich_status
from ortserve.status.errors import DomainError, ErrorReason
from scheduler_service.convert import rejection_to_pb
from scheduler_service.ledger.ledger import Rejection


def rejection_error(rejection: Rejection) -> DomainError:
    """A REJECTED admission as the error Scheduler.Generate ends with (the one rule for
    every path: ortserve.rpc.worker_leg.rejection_error, from the Rejection callers receive)."""
    return worker_leg.rejection_error(rejection_to_pb(rejection))


def window_refused_prompt_tokens(error: grpc.aio.AioRpcError) -> int | None:
    """The prompt's length when a worker's Tokenize refused it for the context window
    (CONTEXT_LENGTH_EXCEEDED, its ErrorInfo carrying prompt_tokens); None for any other error.

    The scheduler then lets the ledger decide on that length, so the refusal is a
    REJECTED like any other: the Rejection in the details, counted in the metrics.
    """
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    if info is None or info.reason != ErrorReason.CONTEXT_LENGTH_EXCEEDED:
        return None
    try:
        return int(info.metadata["prompt_tokens"])
    except (KeyError, ValueError):
        return None
