"""One generation for the Responses and Messages APIs: open it, read it, let it go.

The chat path's pieces, shared: a plain request opens as chat's does (through
the scheduler, or Admit then the worker with --direct-to-workers); a session
turn is Scheduler.SessionTurn (relayed by the scheduler: the session lives
there). Either way the Admission is in before any HTTP byte, so the status and
the cap headers follow from it, and a failure before it is the mapped error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc
import structlog
from fastapi import Request

from gateway.direct import DirectStream, Workers, open_direct
from gateway.reply.errors import HttpError
from gateway.reply.output_parts import OutputParser, Piece
from gateway.upstream import OpenStream, StreamBroken, Upstream
from ortserve.rpc.worker_leg import relabelled
from ortserve.status.call_errors import from_rpc_error
from ortserve.v1 import scheduler_pb2, types_pb2

log = structlog.get_logger("ortserve.gateway")
# How often a non-streaming handler checks that its client is still there.
DISCONNECT_POLL_S = 0.25
_CLOSE_TIMEOUT_S = 10.0
# How long a close waits for a cancelled turn to stop (it stops within a decode step).
_CLOSE_WAIT_S = 30.0
_TURN_PREFIX = "request."

Stream = OpenStream | DirectStream


@dataclass(frozen=True)
class Target:
    """Where a request's calls go, with the caller's key."""

    upstream: Upstream
    workers: Workers | None  # the direct path's channels (--direct-to-workers)
    metadata: tuple[tuple[str, str], ...]
    # The gateway's --stream-interval-ms, for requests that set none.
    stream_interval_ms: int = 0


async def json_body(request: Request) -> object:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HttpError(400, f"the request body is not JSON: {error}", "invalid_request_error",
                        "invalid_json") from None


async def open_generate(target: Target, request: types_pb2.GenerateRequest) -> Stream:
    """A plain Generate, admitted; raises grpc.RpcError or StreamBroken before any byte.
    Two-step where the worker is reachable, else relayed (as the chat routes open theirs)."""
    if not request.stream_interval_ms:
        request.stream_interval_ms = target.stream_interval_ms
    await target.upstream.resolve_adapter(request, target.metadata)
    if target.workers is not None:
        return await open_direct(target.upstream.stub, target.workers, request,
                                 target.upstream.timeout_s, target.metadata,
                                 relay=lambda: target.upstream.open(request, target.metadata))
    return await target.upstream.open(request, target.metadata)


async def open_session(target: Target, model: str, request_id: str,
                       adapter: str = "") -> types_pb2.SessionInfo:
    return await target.upstream.stub.OpenSession(
        scheduler_pb2.OpenSessionRequest(request_id=request_id, model=model, adapter=adapter),
        timeout=target.upstream.timeout_s, metadata=target.metadata)


async def open_turn(target: Target, session_id: str,
                    request: types_pb2.GenerateRequest) -> OpenStream:
    """A session turn, admitted (its Queued events waited out, as Upstream.open does)."""
    if not request.stream_interval_ms:
        request.stream_interval_ms = target.stream_interval_ms
    await target.upstream.resolve_adapter(request, target.metadata)
    call = target.upstream.stub.SessionTurn(
        scheduler_pb2.SessionTurnRequest(session_id=session_id, request=request),
        timeout=target.upstream.timeout_s, metadata=target.metadata)
    try:
        first = await call.read()
        while first is not grpc.aio.EOF and first.WhichOneof("event") == "queued":
            first = await call.read()
    except grpc.RpcError as error:
        call.cancel()
        # The turn's fields are SessionTurnRequest.request's: named as Generate's would be.
        raise relabelled(error, (error.details() or "").removeprefix(_TURN_PREFIX),
                         _TURN_PREFIX) from None
    except BaseException:
        call.cancel()
        raise
    if first is grpc.aio.EOF or first.WhichOneof("event") != "admission":
        call.cancel()
        raise StreamBroken("the scheduler's session turn did not start with an Admission")
    return OpenStream(call, first.admission)


async def close_session(upstream: Upstream, session_id: str,
                        metadata: tuple[tuple[str, str], ...]) -> None:
    """Close a session (the worker frees its KV, the lease is released once). A turn just
    cancelled may still be running there (SESSION_BUSY until the worker has stopped it):
    the close is tried again until it ends. A failure is logged, not raised: the
    scheduler's idle TTL closes the session anyway."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _CLOSE_WAIT_S
    pause_s = 0.05
    while True:
        try:
            await upstream.stub.CloseSession(scheduler_pb2.SessionRequest(session_id=session_id),
                                             timeout=_CLOSE_TIMEOUT_S, metadata=metadata)
            return
        except grpc.RpcError as error:
            if reason_of(error) != "SESSION_BUSY" or loop.time() + pause_s > deadline:
                log.warning("session close failed", session_id=session_id,
                            code=error.code().name, detail=error.details())
                return
        await asyncio.sleep(pause_s)
        pause_s = min(pause_s * 2, 1.0)


def reason_of(error: grpc.RpcError) -> str:
    """The ErrorInfo reason of a failed call ("" when it has none)."""
    info = from_rpc_error(error).error_info()
    return info.reason if info else ""


class Reader:
    """A stream's chunks as pieces; the parser counts the tokens spent thinking."""

    def __init__(self, parser: OutputParser) -> None:
        self.parser = parser

    @property
    def reasoning_tokens(self) -> int:
        return self.parser.reasoning_tokens

    def chunk(self, chunk: types_pb2.TokenChunk) -> list[Piece]:
        if not chunk.text:
            return []  # a character still incomplete: nothing to show yet
        return self.parser.push(chunk.text, len(chunk.token_ids))

    def end(self, finished: types_pb2.Finished | None = None) -> list[Piece]:
        """The output ended (`finished`: its Finished event, whose usage may carry the
        worker's exact reasoning count)."""
        if finished is not None:
            self.parser.finished(finished.usage)
        return self.parser.push("", final=True)


async def read_all(stream: Stream, reader: Reader) -> tuple[list[Piece], types_pb2.Finished]:
    """Every event of an admitted stream, parsed; raises grpc.RpcError or StreamBroken."""
    pieces: list[Piece] = []
    async for event in stream.events():
        kind = event.WhichOneof("event")
        if kind == "chunk":
            pieces += reader.chunk(event.chunk)
        elif kind == "finished":
            return pieces + reader.end(event.finished), event.finished
    raise StreamBroken("the stream ended without a Finished event")


async def unless_disconnected(request: Request, work: Awaitable, cancel: Callable[[], None],
                              request_id: str):
    """Await `work` while the client is there; when it goes, `cancel()` (the gRPC call,
    so the lease is freed now, not at max_tokens) and answer 499."""
    # NOTE: a non-streaming handler is not cancelled when its client goes away.
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                log.info("client disconnected", request_id=request_id)
                raise HttpError(499, "the client disconnected", "cancelled", "client_disconnected")
    finally:
        if not task.done():
            cancel()
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
