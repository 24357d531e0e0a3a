"""Worker.Relay's two ends without gRPC: the worker's RelayCall (frames gathered per loop
pass, a failure ends one request, a cancel reaches it, the end ends them all) and the
scheduler's chunk merging."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from ortserve.rpc.error_path import error_of_status
from ortserve.rpc.relay_frames import chunk_tokens, merge_chunks
from ortserve.status import rich_status
from ortserve.status.errors import DomainError, ErrorReason
from ortserve.v1 import types_pb2, worker_pb2
from worker_service.relay_call import RelayCall


def chunk(ids: list[int], text: str) -> types_pb2.GenerateEvent:
    return types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(token_ids=ids, text=text))


def start(stream_id: int, lease_id: str) -> bytes:
    return worker_pb2.RelayRequest(
        stream_id=stream_id, start=worker_pb2.WorkerGenerateRequest(lease_id=lease_id)
    ).SerializeToString()


def cancel(stream_id: int) -> bytes:
    return worker_pb2.RelayRequest(stream_id=stream_id, cancel=True).SerializeToString()


class Script:
    """A stand-in Generate per lease id: a `steps` list of events, one per tick."""

    def __init__(self) -> None:
        self.ticks = 0
        self._next: asyncio.Future | None = None
        self.closed: list[str] = []

    async def wait_tick(self, n: int) -> None:
        while self.ticks <= n:
            if self._next is None:
                self._next = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._next)  # one waiter cancelled leaves the rest waiting

    def advance(self) -> None:
        self.ticks += 1
        if self._next is not None:
            self._next.set_result(None)
            self._next = None

    async def generate(self, request: worker_pb2.WorkerGenerateRequest):
        lease = request.lease_id
        try:
            if lease == "bad":
                raise DomainError(ErrorReason.LEASE_NOT_FOUND, "lease bad is not live; admit again",
                                  metadata={"lease_id": "bad"})
            for n in range(3):
                await self.wait_tick(n)
                yield chunk([n], f"{lease}{n}")
            yield types_pb2.GenerateEvent(finished=types_pb2.Finished(
                finish_reason=types_pb2.LENGTH))
        finally:
            self.closed.append(lease)


async def feed(queue: asyncio.Queue):
    while (item := await queue.get()) is not None:
        yield item


def frames_of(messages: list[worker_pb2.RelayFrames], stream_id: int) -> list[str]:
    out = []
    for message in messages:
        for frame in message.frames:
            if frame.stream_id == stream_id:
                kind = frame.WhichOneof("frame")
                if kind == "event":
                    event = types_pb2.GenerateEvent.FromString(frame.event)
                    out.append(event.chunk.text or event.WhichOneof("event"))
                else:
                    out.append(kind)
    return out


async def run_call(script: Script, requests: list[bytes], ticks: int,
                   after_first_tick: list[bytes] = ()) -> tuple[list[worker_pb2.RelayFrames], RelayCall]:
    queue: asyncio.Queue = asyncio.Queue()
    for raw in requests:
        queue.put_nowait(raw)
    call = RelayCall(script.generate)
    messages: list[worker_pb2.RelayFrames] = []

    async def collect():
        async for message in call.serve(feed(queue)):
            messages.append(message)

    task = asyncio.create_task(collect())
    for n in range(ticks):
        await asyncio.sleep(0.01)
        script.advance()
        if n == 0 and after_first_tick:
            await asyncio.sleep(0.005)  # the first tick's events are out
            for raw in after_first_tick:
                queue.put_nowait(raw)
    await asyncio.sleep(0.05)
    queue.put_nowait(None)  # the caller is done writing: the call ends once all are done
    await asyncio.wait_for(task, 5)
    return messages, call


def test_requests_run_as_generate_would_and_a_steps_events_leave_as_one_message():
    script = Script()
    messages, _ = asyncio.run(run_call(script, [start(1, "a"), start(2, "b")], ticks=4))
    assert frames_of(messages, 1) == ["a0", "a1", "a2", "finished", "end"]
    assert frames_of(messages, 2) == ["b0", "b1", "b2", "finished", "end"]
    # Both requests' tokens of one tick went in one message, not one message each.
    assert any({f.stream_id for f in m.frames} == {1, 2} for m in messages)
    assert len(messages) < 10
    assert sorted(script.closed) == ["a", "b"]


def test_a_failure_ends_its_request_alone_with_generates_status_and_details():
    script = Script()
    messages, _ = asyncio.run(run_call(script, [start(1, "bad"), start(2, "b")], ticks=4))
    assert frames_of(messages, 1) == ["status"]
    assert frames_of(messages, 2)[-1] == "end"
    status = next(f.status for m in messages for f in m.frames if f.stream_id == 1 and f.status)
    error = error_of_status(status)
    assert error.code() == grpc.StatusCode.NOT_FOUND and "admit again" in error.details()
    parsed = status_pb2.Status.FromString(status)
    info = rich_status.unpack(list(parsed.details), error_details_pb2.ErrorInfo)
    assert info.reason == "LEASE_NOT_FOUND" and info.metadata["lease_id"] == "bad"


def test_a_cancel_closes_that_request_and_sends_nothing_more_for_it():
    script = Script()
    messages, _ = asyncio.run(run_call(script, [start(1, "a"), start(2, "b")], ticks=4,
                                       after_first_tick=[cancel(1)]))
    assert frames_of(messages, 1) == ["a0"]  # nothing after the cancel, not even an end
    assert frames_of(messages, 2) == ["b0", "b1", "b2", "finished", "end"]
    assert sorted(script.closed) == ["a", "b"]  # its generator closed (lease released there)


def test_a_cancel_before_the_request_ran_ends_the_call_cleanly():
    script = Script()
    messages, _ = asyncio.run(run_call(script, [start(1, "a"), cancel(1)], ticks=2))
    assert frames_of(messages, 1) == [] and script.closed == []  # never started: nothing held


def test_a_reused_stream_id_is_refused_naming_the_field_and_the_first_runs_on():
    script = Script()
    messages, _ = asyncio.run(run_call(script, [start(1, "a"), start(1, "b")], ticks=4))
    got = frames_of(messages, 1)
    assert got[0] == "status" and got[-1] == "end" and "a2" in got
    status = next(f.status for m in messages for f in m.frames if f.status)
    bad = rich_status.unpack(list(status_pb2.Status.FromString(status).details),
                             error_details_pb2.BadRequest)
    assert bad.field_violations[0].field == "stream_id"


def test_the_calls_end_cancels_every_request_still_running():
    script = Script()

    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()
        queue.put_nowait(start(1, "a"))
        call = RelayCall(script.generate)
        stream = call.serve(feed(queue))
        reader = asyncio.create_task(stream.__anext__())
        await asyncio.sleep(0.05)
        reader.cancel()  # the scheduler went away mid-request
        with pytest.raises(asyncio.CancelledError):
            await reader
        await stream.aclose()
        return script.closed

    assert asyncio.run(scenario()) == ["a"]


def test_draining_ends_an_idle_call():
    script = Script()

    async def scenario():
        queue: asyncio.Queue = asyncio.Queue()
        call = RelayCall(script.generate)
        messages = []

        async def collect():
            async for message in call.serve(feed(queue)):
                messages.append(message)

        task = asyncio.create_task(collect())
        await asyncio.sleep(0.02)
        call.end_when_idle()
        await asyncio.wait_for(task, 2)  # ended though the caller never stopped writing
        return messages

    assert asyncio.run(scenario()) == []


def test_merged_chunks_carry_the_ids_and_text_in_order():
    frames = [chunk([1, 300, 70000], "hé").SerializeToString(),
              chunk([5], "").SerializeToString(), chunk([], "llo").SerializeToString()]
    merged = merge_chunks(frames)
    event = types_pb2.GenerateEvent.FromString(merged)
    assert list(event.chunk.token_ids) == [1, 300, 70000, 5] and event.chunk.text == "héllo"
    assert chunk_tokens(merged) == 4


def test_chunks_with_logprobs_are_not_merged():
    with_logprobs = types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(
        token_ids=[5], logprobs=[types_pb2.TokenLogprob(token_id=5, logprob=-0.5)]))
    assert merge_chunks([chunk([1], "a").SerializeToString(),
                         with_logprobs.SerializeToString()]) is None


def test_a_message_stays_under_the_size_limit_and_keeps_the_order(monkeypatch):
    monkeypatch.setattr("worker_service.relay_call.MAX_MESSAGE_BYTES", 100)
    call = RelayCall(Script().generate)
    for n in range(10):
        call._push(worker_pb2.RelayFrame(stream_id=1, event=bytes([n]) * 30))
    sizes = []
    while call._frames:
        taken = call._take()
        sizes.append([f.event[0] for f in taken])
    assert sizes == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]  # 46 bytes a frame: two fit in 100, three do not
    call._push(worker_pb2.RelayFrame(stream_id=1, event=b"x" * 500))
    assert len(call._take()) == 1  # one frame beyond the limit still goes, alone
