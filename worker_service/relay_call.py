"""Worker.Relay: a caller's requests on one call, their events sent per engine step.

A Worker.Generate call per request costs a gRPC message per token and request,
paid in Python on both ends (~100 us each on the worker's event loop and the
caller's). On one Relay call a caller (the scheduler's relay, the
gateway's two-step path: ortserve/rpc/relay_client.py) starts and cancels all of
its requests to this worker, and every event that is ready when the
call's writer runs (an engine step's tokens for all of them) leaves as one
RelayFrames message.

Each request runs exactly as a Generate call would (the servicer's own
Generate, under its lease's lifecycle): the same events in the same order,
serialized to the same bytes; a failure ends that request alone, with the
status Generate would end with. A cancel from the caller, the call's end
(the scheduler went away) or the worker stopping cancels the requests still
running, which frees their KV and releases their leases as a cancelled
Generate call does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from ortserve.process import tracing
from ortserve.rpc.error_path import parse_request, status_bytes
from ortserve.status.errors import DomainError, ErrorReason
from ortserve.v1 import types_pb2, worker_pb2

METHOD = "/ortserve.v1.Worker/Relay"

# A RelayFrames message stays under this many bytes (the frames beyond go in the next):
# gRPC refuses a message over 4 MiB by default, and one refused message would end the
# call for every request on it. A frame this big alone (none is) still goes alone.
MAX_MESSAGE_BYTES = 1 << 20

Generate = Callable[[worker_pb2.WorkerGenerateRequest], AsyncIterator[types_pb2.GenerateEvent]]


@dataclass
class SentCounts:
    """What this worker's Relay calls sent, over its life (its metrics read it)."""

    messages: int = 0  # RelayFrames messages
    frames: int = 0  # the frames in them (a request's event, end or failure each)


SENT = SentCounts()


class RelayCall:
    """One Relay call: its requests' tasks and the frames waiting to leave."""

    def __init__(self, generate: Generate) -> None:
        self._generate = generate
        self._tasks: dict[int, asyncio.Task] = {}
        self._frames: list[worker_pb2.RelayFrame] = []
        self._ready = asyncio.Event()
        self._reading = True  # the caller may still start requests
        self._ending = False  # the worker drains: end the call once its requests are done

    def end_when_idle(self) -> None:
        """The worker is draining: end the call once the requests on it are done."""
        self._ending = True
        self._ready.set()

    async def serve(self, requests: AsyncIterator[bytes]) -> AsyncIterator[worker_pb2.RelayFrames]:
        """The call's answer: every frame ready at one pass of the loop, as one message."""
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                if not self._frames:
                    if self._tasks or (self._reading and not self._ending):
                        self._ready.clear()
                        await self._ready.wait()
                        continue
                    if reader.done():
                        reader.result()  # a request that did not parse ends the call, named
                    return
                frames = self._take()
                SENT.messages += 1
                SENT.frames += len(frames)
                yield worker_pb2.RelayFrames(frames=frames)
        finally:
            reader.cancel()
            running = list(self._tasks.values())
            for task in running:
                task.cancel()  # the caller is gone: each request frees its KV and lease
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(reader, *running, return_exceptions=True)

    def _take(self) -> list[worker_pb2.RelayFrame]:
        """The waiting frames, in order, up to MAX_MESSAGE_BYTES (at least one)."""
        frames = self._frames
        size = count = 0
        for frame in frames:
            size += len(frame.event) + len(frame.status) + 16  # + stream id and tags
            if size > MAX_MESSAGE_BYTES and count:
                break
            count += 1
        if count == len(frames):
            self._frames = []
            return frames
        taken = frames[:count]
        del frames[:count]
        return taken

    async def _read(self, requests: AsyncIterator[bytes]) -> None:
        try:
            async for raw in requests:
                request = parse_request(worker_pb2.RelayRequest, raw)
                stream_id = request.stream_id
                if request.WhichOneof("action") == "start":
                    if stream_id in self._tasks:
                        self._push(worker_pb2.RelayFrame(stream_id=stream_id, status=status_bytes(
                            DomainError(ErrorReason.INVALID_REQUEST,
                                        f"stream_id {stream_id} is already running on this Relay "
                                        "call; number each request anew", field="stream_id"),
                            METHOD)))
                        continue
                    task = asyncio.create_task(self._serve_one(stream_id, request.start,
                                                               dict(request.trace_context)))
                    # NOTE: a callback, not the coroutine's finally: a task cancelled before
                    # it first runs never runs its body (its lease was never claimed).
                    task.add_done_callback(lambda _, stream_id=stream_id: self._forget(stream_id))
                    self._tasks[stream_id] = task
                elif request.cancel:
                    task = self._tasks.get(stream_id)
                    if task is not None:
                        task.cancel()
        finally:
            self._reading = False
            self._ready.set()

    async def _serve_one(self, stream_id: int, request: worker_pb2.WorkerGenerateRequest,
                         trace_context: dict[str, str]) -> None:
        try:
            # The request's spans (claim, prefill, decode) under a Generate span of its own,
            # in its caller's trace: what a Generate call of its own would record.
            with tracing.span_from(trace_context, "/ortserve.v1.Worker/Generate"):
                async with contextlib.aclosing(self._generate(request)) as events:
                    async for event in events:
                        self._push(worker_pb2.RelayFrame(stream_id=stream_id,
                                                         event=event.SerializeToString()))
            self._push(worker_pb2.RelayFrame(stream_id=stream_id, end=True))
        except asyncio.CancelledError:
            pass  # cancelled by the caller, who expects nothing more for it
        except Exception as error:  # noqa: BLE001 - mapped as Generate's error path maps it
            self._push(worker_pb2.RelayFrame(stream_id=stream_id,
                                             status=status_bytes(error, METHOD)))

    def _forget(self, stream_id: int) -> None:
        self._tasks.pop(stream_id, None)
        self._ready.set()

    def _push(self, frame: worker_pb2.RelayFrame) -> None:
        self._frames.append(frame)
        self._ready.set()
