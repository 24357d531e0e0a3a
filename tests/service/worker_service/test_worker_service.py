"""The worker's service through a real channel: a real grpc server on port 0, the tiny
model, and a stand-in for its scheduler link (the ledger's side is pinned by the
scheduler's tests and the end-to-end tests, which use the real scheduler)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.rpc.error_path import register_service
from ortserve.status import rich_status
from ortserve.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from tests.aio_thread import LoopThread
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.lease_lifecycle import LeaseLifecycle
from worker_service.server import SERVICE
from worker_service.servicer import WorkerServicer


class FakeLink:
    """Leases the test grants; records what was released and what the engine held then."""

    address = "fake-scheduler:0"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.leases: dict[str, types_pb2.Lease] = {}
        self.released: list[tuple[str, int]] = []  # (lease id, engine held bytes at release)
        self.ended: dict[str, tuple] = {}  # lease id -> (outcome, cause, Finished) it released with

    def grant(self, lease_id: str, prompt_tokens: int, max_new_tokens: int) -> None:
        self.leases[lease_id] = types_pb2.Lease(
            lease_id=lease_id, worker_id="w-test", prompt_tokens=prompt_tokens,
            max_new_tokens=max_new_tokens, claimed=True)

    async def claim(self, lease_id: str, prompt_tokens: int = 0, max_new_tokens: int = 0):
        lease = self.leases.get(lease_id)
        if lease is None:
            raise grpc.aio.AioRpcError(grpc.StatusCode.NOT_FOUND, grpc.aio.Metadata(),
                                       grpc.aio.Metadata(), details=f"lease {lease_id} not live")
        return lease

    async def release(self, lease_id: str, outcome: str = "", cause: str = "",
                      finished=None) -> int:
        self.released.append((lease_id, self.engine.held_bytes()))
        self.ended[lease_id] = (outcome, cause, finished)
        self.leases.pop(lease_id, None)
        return 1

    async def close(self) -> None:
        pass


@pytest.fixture(scope="module")
def worker(tiny_dir):
    loop = LoopThread()
    engine = Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2))
    link = FakeLink(engine)

    async def start():
        server = grpc.aio.server()
        servicer = WorkerServicer("w-test", "127.0.0.1:0", "cpu")
        servicer.leases = LeaseLifecycle("w-test", engine, link)
        register_service(server, SERVICE, servicer)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = loop.run(start())
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield worker_pb2_grpc.WorkerStub(channel), link, engine, channel
    channel.close()
    loop.run(server.stop(0))
    engine.close()
    loop.close()


def _request(lease_id: str, text: str = "Hello there", max_new: int | None = 4,
             request_id: str = "") -> worker_pb2.WorkerGenerateRequest:
    inner = types_pb2.GenerateRequest(request_id=request_id, text=text)
    if max_new is not None:
        inner.max_new_tokens = max_new
    return worker_pb2.WorkerGenerateRequest(lease_id=lease_id, request=inner)


def _prompt_tokens(engine: Engine, text: str = "Hello there") -> int:
    return len(engine.tokenizer.encode(text))


def test_generate_streams_admission_tokens_finished_and_releases_after_the_buffer_is_freed(worker):
    stub, link, engine, _ = worker
    link.grant("L-ok", _prompt_tokens(engine), 6)
    events = list(stub.Generate(_request("L-ok", max_new=None), timeout=30))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "admission" and kinds[-1] == "finished"
    assert events[-1].finished.usage.generated_tokens == 6  # the lease's ceiling, max_new unset
    assert ("L-ok", 0) in link.released
    # The release says how it ended: the scheduler counts a two-step request from it.
    outcome, cause, finished = link.ended["L-ok"]
    assert (outcome, cause) == ("finished", "") and finished == events[-1].finished


def test_no_live_lease_is_not_found_as_on_the_scheduler_and_holds_nothing(worker):
    stub, link, engine, _ = worker
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(_request("nobody-granted-this"), timeout=10))
    # The one status table: LEASE_NOT_FOUND is NOT_FOUND whichever service answers.
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    info = rich_status.unpack(rich_status.details_of(err.value), error_details_pb2.ErrorInfo)
    assert info.reason == "LEASE_NOT_FOUND"
    assert engine.held_bytes() == 0


@pytest.mark.parametrize(("lease_prompt_delta", "lease_max_new", "field"), [
    (1, 8, "prompt"), (0, 2, "max_new_tokens")])
def test_a_request_that_does_not_match_its_lease_is_failed_precondition(
        worker, lease_prompt_delta, lease_max_new, field):
    stub, link, engine, _ = worker
    link.grant("L-mismatch", _prompt_tokens(engine) + lease_prompt_delta, lease_max_new)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(_request("L-mismatch", max_new=4), timeout=10))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = rich_status.details_of(err.value)
    assert rich_status.unpack(details, error_details_pb2.ErrorInfo).reason == "LEASE_MISMATCH"
    assert rich_status.unpack(details, error_details_pb2.BadRequest).field_violations[0].field == field
    assert engine.held_bytes() == 0


@pytest.mark.parametrize(("inner", "field"), [
    (types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(
        messages=[types_pb2.ChatMessage(role="wizard", content="hi")])), "chat.messages[0].role"),
    (types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(messages=[
        types_pb2.ChatMessage(role="user", content="hi"),
        types_pb2.ChatMessage(role="r" * 20_000, content="x")])), "chat.messages[1].role"),
    (types_pb2.GenerateRequest(text="hi", sampling=types_pb2.SamplingParams(top_k=5)),
     "sampling.top_k"),
    (types_pb2.GenerateRequest(text="hi", stop=["ok", ""]), "stop[1]"),
    (types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=[1, 10**6])), "token_ids.ids[1]"),
    (types_pb2.GenerateRequest(), "prompt"),
])
def test_bad_fields_are_invalid_argument_naming_the_proto_path_and_touch_no_lease(
        worker, inner, field):
    stub, link, engine, _ = worker
    link.grant("L-bad", 2, 4)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(worker_pb2.WorkerGenerateRequest(lease_id="L-bad", request=inner),
                           timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = rich_status.unpack(rich_status.details_of(err.value), error_details_pb2.BadRequest)
    assert bad.field_violations[0].field == field
    assert len(err.value.details()) < 2_000  # a 20,000-char role is not echoed whole
    assert "L-bad" in link.leases  # refused before the lease was touched
    assert engine.held_bytes() == 0


def test_invalid_utf8_is_invalid_argument_naming_the_field(worker):
    _, link, _, channel = worker
    raw = _request("L-utf8", text="XXXX").SerializeToString().replace(b"XXXX", b"\xff\xfe\xff\xfe")
    call = channel.unary_stream("/ortserve.v1.Worker/Generate", request_serializer=None,
                                response_deserializer=types_pb2.GenerateEvent.FromString)
    with pytest.raises(grpc.RpcError) as err:
        list(call(raw, timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request.text" in err.value.details()


def test_a_huge_lease_id_gets_a_bounded_precise_error(worker):
    stub, _, _, _ = worker
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(_request("L" * 5_000), timeout=10))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND  # LEASE_NOT_FOUND, the one table
    assert len(err.value.details()) < 2_000


def test_same_request_id_on_two_leases_runs_both(worker):
    stub, link, engine, _ = worker
    n = _prompt_tokens(engine)
    link.grant("L-a", n, 8)
    link.grant("L-b", n, 8)
    results: dict[str, list] = {}

    def run(lease_id: str) -> None:
        results[lease_id] = list(stub.Generate(_request(lease_id, max_new=8, request_id="same"),
                                               timeout=30))

    threads = [threading.Thread(target=run, args=(lease,)) for lease in ("L-a", "L-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for lease in ("L-a", "L-b"):
        assert results[lease][-1].finished.usage.generated_tokens == 8


def test_cancel_frees_the_buffer_before_the_lease_is_released(worker):
    stub, link, engine, _ = worker
    link.grant("L-cancel", _prompt_tokens(engine), 1800)
    call = stub.Generate(_request("L-cancel", max_new=1800), timeout=60)
    seen = 0
    for event in call:
        seen += event.WhichOneof("event") == "chunk"
        if seen == 3:
            break
    assert engine.held_bytes() > 0
    call.cancel()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(lid == "L-cancel" for lid, _ in link.released):
        time.sleep(0.01)
    assert ("L-cancel", 0) in link.released  # released only once the KV was freed
    assert [lid for lid, _ in link.released].count("L-cancel") == 1
    assert link.ended["L-cancel"] == ("cancelled", "", None)


def test_a_second_stream_on_a_running_lease_is_refused_and_the_first_goes_on(worker):
    stub, link, engine, _ = worker
    link.grant("L-twice", _prompt_tokens(engine), 300)
    first = stub.Generate(_request("L-twice", max_new=300), timeout=60)
    assert next(first).WhichOneof("event") == "admission"
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(_request("L-twice", max_new=300), timeout=10))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert list(first)[-1].finished.usage.generated_tokens == 300


def test_the_model_rules_run_once_per_generate(worker, monkeypatch):
    stub, link, engine, _ = worker
    calls = []
    check = engine.check
    monkeypatch.setattr(engine, "check", lambda req: (calls.append(req), check(req)))
    link.grant("L-once", _prompt_tokens(engine), 3)
    events = list(stub.Generate(_request("L-once", max_new=None), timeout=30))
    assert events[-1].WhichOneof("event") == "finished"
    assert len(calls) == 1  # before the lease was claimed; submit does not run them again
