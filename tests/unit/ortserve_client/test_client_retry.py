"""The Python client's opt-in retry: honours RetryInfo, only before the Admission, never by default."""

from __future__ import annotations

import grpc
import pytest
from ortserve_client import Client, QueueFull, Retry
from ortserve_client.client import GenerationStream

from ortserve.status import rich_status
from ortserve.v1 import types_pb2


class FakeRpcError(grpc.RpcError):
    def __init__(self, retry_s: float) -> None:
        status = rich_status.to_grpc_status(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full",
            [types_pb2.Rejection(cause=types_pb2.QUEUE_FULL, queue_length=4),
             rich_status.retry_info(retry_s)])
        self._metadata = status.trailing_metadata

    def code(self):
        return grpc.StatusCode.RESOURCE_EXHAUSTED

    def details(self):
        return "queue full"

    def trailing_metadata(self):
        return self._metadata


def events(*items):
    for item in items:
        if isinstance(item, Exception):
            raise item
        yield item


ADMISSION = types_pb2.GenerateEvent(admission=types_pb2.Admission(decision=types_pb2.ADMITTED))
FINISHED = types_pb2.GenerateEvent(finished=types_pb2.Finished(finish_reason=types_pb2.LENGTH))


def test_a_refused_admission_is_retried_after_the_servers_retry_info(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("ortserve_client.client.time.sleep", slept.append)
    calls = iter([events(FakeRpcError(2.0)), events(ADMISSION, FINISHED)])
    stream = GenerationStream(lambda timeout_s: next(calls), retry=Retry(attempts=2, base_s=0.1))
    assert list(stream) == [] and stream.result.finish_reason == "LENGTH"
    assert stream.retries == 1 and slept == [2.0]  # RetryInfo's 2 s beats the 0.1 s backoff


def test_without_retry_or_after_the_admission_the_error_is_raised():
    stream = GenerationStream(lambda timeout_s: events(FakeRpcError(1.0)))
    with pytest.raises(QueueFull) as err:
        list(stream)
    assert err.value.retry_delay_s() == 1.0 and err.value.queue_length == 4
    stream = GenerationStream(lambda timeout_s: events(ADMISSION, FakeRpcError(1.0)),
                              retry=Retry(attempts=3))
    with pytest.raises(QueueFull):
        list(stream)
    assert stream.retries == 0


def test_no_retry_would_outlive_the_deadline(monkeypatch):
    monkeypatch.setattr("ortserve_client.client.time.sleep", lambda s: None)
    stream = GenerationStream(lambda timeout_s: events(FakeRpcError(60.0)), retry=Retry(attempts=3),
                              timeout_s=5.0)
    with pytest.raises(QueueFull):
        list(stream)
    assert stream.retries == 0


def test_the_client_has_no_retry_by_default():
    with Client("127.0.0.1:1") as client:
        assert client.retry is None
