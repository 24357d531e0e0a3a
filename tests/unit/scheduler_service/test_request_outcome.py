"""scheduler_service.request_outcome: one outcome per exit, whatever ends the request."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from ortserve.rpc.error_path import Relayed
from ortserve.status.errors import DomainError, ErrorReason
from ortserve.v1 import types_pb2
from scheduler_service.request_outcome import RequestOutcome, classify


class _Upstream(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details="gone")


@pytest.mark.parametrize(("error", "relaying", "remaining", "expected"), [
    (None, True, None, ("worker_failed", "ended_without_finished")),
    (asyncio.CancelledError(), True, 30.0, ("cancelled", "running")),
    (asyncio.CancelledError(), False, None, ("cancelled", "queued")),
    (asyncio.CancelledError(), True, 0.0, ("deadline", "running")),
    (GeneratorExit(), False, -1.0, ("deadline", "queued")),
    (DomainError(ErrorReason.BUDGET_BUSY, "busy"), False, None, ("rejected", "budget_busy")),
    (DomainError(ErrorReason.DEADLINE_EXCEEDED, "late"), False, 0.0, ("deadline", "queued")),
    (_Upstream(grpc.StatusCode.UNAVAILABLE), True, 10.0, ("worker_failed", "unavailable")),
    (Relayed(_Upstream(grpc.StatusCode.DEADLINE_EXCEEDED)), True, 0.0, ("deadline", "running")),
    (Relayed(_Upstream(grpc.StatusCode.INVALID_ARGUMENT)), False, None,
     ("rejected", "invalid_argument")),
    (RuntimeError("bug"), True, None, ("error", "RuntimeError")),
])
def test_each_exit_has_one_outcome(error, relaying, remaining, expected):
    assert classify(error, relaying, None, remaining) == expected


def test_a_relayed_finished_is_finished_whatever_follows():
    assert classify(asyncio.CancelledError(), True, "length", 0.0) == ("finished", "length")


def test_the_exit_counts_once_with_the_finished_event():
    counted = []
    outcome = RequestOutcome("generate", lambda: 5.0, lambda *args: counted.append(args))
    finished = types_pb2.Finished(finish_reason=types_pb2.EOS)
    with pytest.raises(asyncio.CancelledError), outcome:
        outcome.relaying = True
        outcome.finished(finished)
        raise asyncio.CancelledError
    outcome.__exit__(None, None, None)  # a second exit counts nothing
    assert counted == [("generate", "finished", "eos", finished)]


def test_a_finished_request_is_counted_before_its_finished_is_sent():
    # grpc resumes a generator handler (and so runs its exit) only when it asks for the
    # next item, after the caller may already hold the Finished and read the metrics.
    counted = []
    outcome = RequestOutcome("generate", lambda: 5.0, lambda *args: counted.append(args))
    with outcome:
        outcome.relaying = True
        outcome.finished(types_pb2.Finished(finish_reason=types_pb2.LENGTH))
        assert [args[:3] for args in counted] == [("generate", "finished", "length")]
    assert len(counted) == 1
