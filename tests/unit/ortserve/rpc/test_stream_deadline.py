"""The two-step paths (the gateway's and the Python client's, Admit then the worker) tell the
scheduler the deadline their worker stream will have (AdmitRequest.stream_deadline_ms), so a
time cap fits max_new_tokens to it as a relayed Generate's gRPC deadline does
(docs/features/time-budget.md). Fake schedulers record the Admit; it answers REJECTED, so no
worker is called."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from ortserve_client.direct import DirectCall

from gateway.direct import Workers, open_direct
from ortserve.rpc.worker_leg import stream_deadline_ms
from ortserve.v1 import types_pb2

REFUSED = types_pb2.Admission(decision=types_pb2.REJECTED, rejection=types_pb2.Rejection(
    cause=types_pb2.TIME_BUSY, message="busy", remedy="retry"))


class _Admits:
    def __init__(self) -> None:
        self.asked = []  # (AdmitRequest, timeout)


class AsyncScheduler(_Admits):
    async def Admit(self, request, timeout=None, metadata=()):
        self.asked.append((request, timeout))
        return REFUSED


class _Future:
    def result(self):
        return REFUSED


class _AdmitCallable:
    def __init__(self, owner: _Admits) -> None:
        self._owner = owner

    def future(self, request, timeout=None, metadata=()):
        self._owner.asked.append((request, timeout))
        return _Future()


class BlockingScheduler(_Admits):
    def __init__(self) -> None:
        super().__init__()
        self.Admit = _AdmitCallable(self)


def test_the_gateway_names_its_request_timeout_as_the_stream_deadline():
    scheduler = AsyncScheduler()

    async def run():
        workers = Workers(None)
        try:
            await open_direct(scheduler, workers, types_pb2.GenerateRequest(text="Hi"), 90.0, ())
        finally:
            await workers.close()

    with pytest.raises(grpc.RpcError):
        asyncio.run(run())
    ((asked, timeout),) = scheduler.asked
    assert timeout == 90.0 and asked.stream_deadline_ms == 90_000


def test_the_client_names_what_is_left_of_its_deadline_and_none_without_one():
    for timeout_s, expected in ((30.0, range(29_000, 30_001)), (None, range(0, 1))):
        scheduler = BlockingScheduler()
        call = DirectCall(scheduler, lambda address: None, types_pb2.GenerateRequest(text="Hi"),
                          timeout_s, ())
        with pytest.raises(grpc.RpcError):
            list(call)
        ((asked, timeout),) = scheduler.asked
        assert asked.stream_deadline_ms in expected
        assert (timeout is None) == (timeout_s is None)


def test_stream_deadline_ms_is_whole_ms_within_the_field():
    assert stream_deadline_ms(None) == 0
    assert stream_deadline_ms(0.0) == 1  # a deadline already due is still one: not "none"
    assert stream_deadline_ms(1.5) == 1_500
    assert stream_deadline_ms(1e12) == 2**32 - 1
