"""ortserve.rpc.error_path through a real channel: every failure becomes a precise, bounded status."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.rpc import error_path
from ortserve.status import rich_status
from ortserve.status.errors import DomainError, ErrorReason, InvalidField, quoted
from ortserve.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests.aio_thread import LoopThread

WORKER = worker_pb2.DESCRIPTOR.services_by_name["Worker"]


class Upstream(worker_pb2_grpc.WorkerServicer):
    """Info always fails with a rich status, for Relayed to pass on."""

    async def Info(self, request, context):
        raise DomainError(ErrorReason.LEASE_NOT_FOUND, "upstream says no",
                          metadata={"lease_id": "L"})


class Faulty(worker_pb2_grpc.WorkerServicer):
    def __init__(self, upstream: worker_pb2_grpc.WorkerStub) -> None:
        self.upstream = upstream

    async def Tokenize(self, request, context):
        req = request.request
        if req.text == "boom":
            raise RuntimeError("a bug")
        if req.text == "relay":
            try:
                await self.upstream.Info(worker_pb2.InfoRequest(), timeout=5)
            except grpc.aio.AioRpcError as error:
                raise error_path.Relayed(error, "relayed: " + error.details()) from None
        if req.text == "busy":
            raise DomainError(ErrorReason.BUDGET_BUSY, "busy", metadata={"needed_bytes": 7},
                              retry_after_s=1.5, details=[types_pb2.Rejection(message="busy")])
        raise InvalidField("request_id", f"{quoted(req.request_id)} is too long")

    async def Generate(self, request, context):
        yield types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(token_ids=[1]))
        raise InvalidField("request.stop[0]", "too long")


@pytest.fixture()
def stub():
    loop = LoopThread()

    async def start():
        up = grpc.aio.server()
        error_path.register_service(up, WORKER, Upstream())
        up_port = up.add_insecure_port("127.0.0.1:0")
        await up.start()
        up_channel = grpc.aio.insecure_channel(f"127.0.0.1:{up_port}")
        server = grpc.aio.server()
        error_path.register_service(server, WORKER, Faulty(worker_pb2_grpc.WorkerStub(up_channel)))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return up, server, port, up_channel

    up, server, port, up_channel = loop.run(start())
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield worker_pb2_grpc.WorkerStub(channel), channel
    channel.close()
    loop.run(up_channel.close())
    loop.run(server.stop(0))
    loop.run(up.stop(0))
    loop.close()


def tokenize(stub, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        stub.Tokenize(worker_pb2.TokenizeRequest(request=types_pb2.GenerateRequest(**kw)), timeout=5)
    return err.value


def test_domain_error_maps_through_the_table_with_error_info_retry_and_extra_details(stub):
    error = tokenize(stub[0], text="busy")
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and error.details() == "busy"
    details = rich_status.details_of(error)
    info = rich_status.unpack(details, error_details_pb2.ErrorInfo)
    assert info.reason == "BUDGET_BUSY" and info.metadata["needed_bytes"] == "7"
    assert rich_status.unpack(details, error_details_pb2.RetryInfo).retry_delay.ToMilliseconds() == 1_500
    assert rich_status.unpack(details, types_pb2.Rejection).message == "busy"


def test_unexpected_exception_is_internal_never_unknown(stub):
    error = tokenize(stub[0], text="boom")
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "RuntimeError: a bug" in error.details() and "report" in error.details()


def test_upstream_status_is_relayed_with_its_details_and_our_message(stub):
    error = tokenize(stub[0], text="relay")
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "relayed: upstream says no"
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    assert info.reason == "LEASE_NOT_FOUND" and info.metadata["lease_id"] == "L"


def test_invalid_utf8_is_invalid_argument_naming_the_nested_field(stub):
    request = worker_pb2.TokenizeRequest(request=types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(
        messages=[types_pb2.ChatMessage(role="user", content="ok"),
                  types_pb2.ChatMessage(role="user", content="XX")])))
    raw = request.SerializeToString().replace(b"XX", b"\xff\xfe")
    call = stub[1].unary_unary("/ortserve.v1.Worker/Tokenize")
    with pytest.raises(grpc.RpcError) as err:
        call(raw, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = error_path.bad_request_of(err.value)
    assert bad.field_violations[0].field == "request.chat.messages[1].content"
    assert "UTF-8" in err.value.details()


def test_garbage_bytes_are_invalid_argument_not_unknown(stub):
    call = stub[1].unary_unary("/ortserve.v1.Worker/Tokenize")
    with pytest.raises(grpc.RpcError) as err:
        call(b"\xff\xff\xff\xff", timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "ortserve.v1.TokenizeRequest" in err.value.details()


def test_a_huge_echoed_value_is_clipped_and_stays_within_metadata_limits(stub):
    error = tokenize(stub[0], text="x", request_id="r" * 5_000)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # not UNAVAILABLE "metadata size"
    assert len(error.details()) < 300 and "5,000 chars" in error.details()


def test_a_streaming_method_fails_through_the_same_path_after_yielding(stub):
    events = stub[0].Generate(worker_pb2.WorkerGenerateRequest(lease_id="l"), timeout=5)
    assert next(events).chunk.token_ids == [1]
    with pytest.raises(grpc.RpcError) as err:
        next(events)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_path.bad_request_of(err.value).field_violations[0].field == "request.stop[0]"
