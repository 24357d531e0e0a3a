"""The calling end of Worker.Relay: one call per worker carries every request sent to it.

Used by the scheduler's relay and by the gateway's two-step path
(--direct-to-workers): each asks for a worker's stream as it would ask Worker.Generate
(`RelayClient.generate(request, timeout)`) and gets a `RelayedStream`: the
same frames, as bytes, in the same order; the same failure, as the same
grpc.aio.AioRpcError (code, message, details); `cancel()` and `done()` as a
call has them. Underneath, the requests to one worker share one Relay call:
the worker sends one message per step for all of them instead of one per
token and request (worker_service/relay_call.py).

A stream's frames wait in its own list until its reader takes them; chunks that
queued up while the reader was busy (its own client reads slowly) leave as one
chunk, so a slow reader gets fewer, larger messages and never holds up the
others. What waits is bounded by the request's max_new_tokens.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import structlog

from ortserve.process import tracing
from ortserve.rpc.error_path import error_of_status
from ortserve.rpc.relay_frames import CHUNK_TAG, merge_chunks
from ortserve.v1 import worker_pb2

log = structlog.get_logger("relay_call")


class RelayedStream:
    """One request's events from a shared Relay call, read like a Generate call's."""

    def __init__(self, owner: RelayClient, stream_id: int,
                 request: worker_pb2.WorkerGenerateRequest) -> None:
        self._owner = owner
        self.stream_id = stream_id
        self._request = request  # kept for a worker without Relay (see _fall_back)
        self._delivered = False
        self._call = None  # that worker's own Generate call, once fallen back
        self._call_frames = None  # and its frames
        self._frames: list[bytes] = []
        self._wake: asyncio.Future | None = None
        self._ended = False
        self._error: grpc.aio.AioRpcError | None = None
        self._cancelled = False
        self._timer: asyncio.TimerHandle | None = None

    def expire_in(self, timeout_s: float) -> None:
        """The caller's deadline: past it the request is cancelled and fails
        DEADLINE_EXCEEDED, as a Generate call with that timeout would."""
        self._timer = asyncio.get_running_loop().call_later(timeout_s, self._expire)

    def _expire(self) -> None:
        if not self.done():
            self.cancel()
            self._error = grpc.aio.AioRpcError(grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(),
                                               grpc.aio.Metadata(), "Deadline Exceeded")
            self._wakeup()

    # -- what the Relay call's reader delivers ----------------------------------------

    def deliver(self, frame: worker_pb2.RelayFrame) -> None:
        self._delivered = True
        kind = frame.WhichOneof("frame")
        if kind == "event":
            self._frames.append(frame.event)
        elif kind == "end":
            self._ended = True
        else:
            self._error = error_of_status(frame.status)
        self._wakeup()

    def fail(self, error: grpc.aio.AioRpcError) -> None:
        if not self._ended and self._error is None:
            self._error = error
            self._wakeup()

    def _wakeup(self) -> None:
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    # -- what relay.py reads -----------------------------------------------------------

    def done(self) -> bool:
        if self._call is not None:
            return self._call.done()
        return self._ended or self._error is not None or self._cancelled

    def cancel(self) -> None:
        """The caller gave up: the worker cancels the request (its KV and lease freed)."""
        if self._call is not None:
            self._call.cancel()
        elif not self.done():
            self._cancelled = True
            self._owner.cancel(self.stream_id)
        if self._timer is not None:
            self._timer.cancel()

    def __aiter__(self) -> RelayedStream:
        return self

    async def __anext__(self) -> bytes:
        if self._call is not None:
            return await self._call_frames.__anext__()
        while not self._frames:
            if (self._error is not None and not self._delivered
                    and self._error.code() == grpc.StatusCode.UNIMPLEMENTED):
                return await self._fall_back()
            if self._error is not None or self._ended or self._cancelled:
                self._owner.forget(self.stream_id)
                if self._timer is not None:
                    self._timer.cancel()
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await self._wake
            finally:
                self._wake = None
        frames = self._frames
        if len(frames) == 1:
            return frames.pop()
        if frames[0][0] == CHUNK_TAG and frames[1][0] == CHUNK_TAG:
            # Chunks that queued up while our client was slow leave as one chunk.
            count = 2
            while count < len(frames) and frames[count][0] == CHUNK_TAG:
                count += 1
            merged = merge_chunks(frames[:count])
            if merged is not None:
                del frames[:count]
                return merged
        return frames.pop(0)

    async def _fall_back(self):
        """The worker has no Relay (an older version during a rolling upgrade): this request
        goes as a Generate call of its own, as will the next ones to that worker."""
        self._owner.unsupported = True
        remaining = None  # the caller's deadline passes to the call
        if self._timer is not None:
            remaining = max(self._timer.when() - asyncio.get_running_loop().time(), 0.0)
            self._timer.cancel()
        self._call = self._owner.fallback(self._request, timeout=remaining)
        self._call_frames = self._call.__aiter__()
        return await self._call_frames.__anext__()


def generate_call(channel: grpc.aio.Channel):
    """Worker.Generate on `channel`, its events as the bytes they came in (a call per
    request: --relay-calls per-request, and the fall-back for a worker without Relay)."""
    return channel.unary_stream(
        "/ortserve.v1.Worker/Generate",
        request_serializer=worker_pb2.WorkerGenerateRequest.SerializeToString,
        response_deserializer=None)  # None: the frame's bytes as they came


class RelayClient:
    """The Relay calls to one worker: at most one open at a time, opened on demand."""

    def __init__(self, channel: grpc.aio.Channel, address: str) -> None:
        self._address = address
        # A worker without Relay: each request is a Worker.Generate call of its own.
        self.fallback = generate_call(channel)
        self.unsupported = False
        self._method = channel.stream_stream(
            "/ortserve.v1.Worker/Relay",
            request_serializer=worker_pb2.RelayRequest.SerializeToString,
            response_deserializer=worker_pb2.RelayFrames.FromString)
        self._outbox: asyncio.Queue[worker_pb2.RelayRequest | None] | None = None
        self._streams: dict[int, RelayedStream] = {}
        self._next_id = 0
        self._reader: asyncio.Task | None = None
        self._writer: asyncio.Task | None = None

    def generate(self, request: worker_pb2.WorkerGenerateRequest,
                 timeout: float | None = None) -> RelayedStream:
        """Start `request` on the worker; its events come from the returned stream."""
        if self.unsupported:
            return self.fallback(request, timeout=timeout)
        if self._reader is None or self._reader.done():
            self._open()
        self._next_id += 1
        stream = RelayedStream(self, self._next_id, request)
        if timeout is not None:
            stream.expire_in(timeout)
        self._streams[stream.stream_id] = stream
        self._outbox.put_nowait(worker_pb2.RelayRequest(
            stream_id=stream.stream_id, start=request, trace_context=tracing.trace_context()))
        return stream

    def cancel(self, stream_id: int) -> None:
        if self._streams.pop(stream_id, None) is not None and self._outbox is not None:
            self._outbox.put_nowait(worker_pb2.RelayRequest(stream_id=stream_id, cancel=True))

    def forget(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)

    async def close(self) -> None:
        for task in (self._reader, self._writer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _open(self) -> None:
        outbox: asyncio.Queue = asyncio.Queue()
        self._outbox = outbox
        self._streams = {}
        # NOTE: written by a task of ours, not a request iterator: a request iterator's
        # failed write (the worker ended the call) turns the call's status into INTERNAL
        # "Internal error from Core", hiding the worker's own (UNIMPLEMENTED from a worker
        # without Relay, which must fall back).
        call = self._method()
        self._reader = asyncio.create_task(self._read(call, self._streams, outbox))
        self._writer = asyncio.create_task(_write(call, outbox))
        log.info("relay call opened", worker_address=self._address)

    async def _read(self, call, streams: dict[int, RelayedStream], outbox: asyncio.Queue) -> None:
        error = grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
            f"the worker at {self._address} ended its relay call (it is draining or stopping)")
        try:
            async for message in call:
                for frame in message.frames:
                    stream = streams.get(frame.stream_id)
                    if stream is not None:
                        stream.deliver(frame)
        except grpc.aio.AioRpcError as failure:
            error = failure
        except asyncio.CancelledError:
            call.cancel()
            raise
        finally:
            # Every request still on the call ends with the call's failure; the next
            # request to this worker opens a new call (generate sees this task done).
            outbox.put_nowait(None)  # ends the call's request iterator
            for stream in list(streams.values()):
                stream.fail(error)
            streams.clear()
            log.info("relay call ended", worker_address=self._address,
                     code=error.code().name, details=error.details())


async def _write(call, outbox: asyncio.Queue) -> None:
    """The call's requests: starts and cancels, in the order relay.py made them, until
    the call ends (None: the reader saw it end; a failed write: the worker ended it)."""
    with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
        # Nothing is written before the worker accepts the call (it sends its headers at
        # once): a worker without Relay has ended it by then, with UNIMPLEMENTED.
        await call.initial_metadata()
        while (request := await outbox.get()) is not None:
            if call.done():
                return
            await call.write(request)
