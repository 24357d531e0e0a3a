"""One generation path for every API (chat and completions, Responses, Messages): the
request's body, the GenerateRequest as the gateway sends it, opening it, reading it,
watching for a client that goes away, and a failure as the mapped HTTP error.

A plain request opens through the scheduler, or Admit then the worker with
--direct-to-workers; a session turn is Scheduler.SessionTurn (relayed by the scheduler:
the session lives there). Either way the Admission is in before any HTTP byte, so the
status and the cap headers follow from it, and a failure before it is the mapped error.
Each API's route (gateway/apis/<api>/route.py) calls these by name; none has its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import grpc
import structlog
from fastapi import Request

from gateway.direct import DirectStream, Workers, open_direct
from gateway.reply.errors import HttpError, from_grpc
from gateway.reply.output_parts import OutputParser, Piece
from gateway.request.translate import ParsedRequest
from gateway.request_metrics import RequestClock
from gateway.upstream import OpenStream, StreamBroken, Upstream, admitted
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

# An admitted call: relayed by the scheduler, or the worker's own (the two-step path).
Opened = OpenStream | DirectStream


@dataclass(frozen=True)
class Target:
    """Where a request's calls go, with the caller's key."""

    upstream: Upstream
    workers: Workers | None  # the direct path's channels (--direct-to-workers)
    metadata: tuple[tuple[str, str], ...]  # the caller's key and tenant (gateway/caller.py)
    # The gateway's --stream-interval-ms, for requests that set none.
    stream_interval_ms: int = 0
    # --model-server-worker-id: the placement hint that makes an endpoint picker's choice
    # of this pod the worker that serves, when it fits (every API's requests carry it).
    prefer_worker: str = ""


async def json_body(request: Request) -> object:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HttpError(400, f"the request body is not JSON: {error}", "invalid_request_error",
                        "invalid_json") from None


def generate_request(target: Target, parsed: ParsedRequest, index: int,
                     request_id: str) -> types_pb2.GenerateRequest:
    """Choice `index` of `parsed` as the gateway sends it: the request's own stream interval
    (0: one event per token), else the gateway's; and the placement hint."""
    request = parsed.choice_request(index, request_id)
    request.stream_interval_ms = (parsed.stream_interval_ms
                                  if parsed.stream_interval_ms is not None
                                  else target.stream_interval_ms)
    request.preferred_worker_id = target.prefer_worker
    return request


def failure(error: grpc.RpcError | StreamBroken, prompt_param: str, route: str) -> HttpError:
    """A failed call as the HTTP error every API starts from: the scheduler's status through
    the one table (reply/errors.py), a stream that broke the protocol a 502."""
    if isinstance(error, StreamBroken):
        return HttpError(502, str(error), "server_error", "bad_upstream_stream")
    return from_grpc(error, prompt_param, route)


async def open_generate(target: Target, request: types_pb2.GenerateRequest) -> Opened:
    """A plain Generate, admitted; raises grpc.RpcError or StreamBroken before any byte.
    Two-step where the worker is reachable, else relayed by the scheduler. `model` naming
    a LoRA adapter runs on its base with that adapter."""
    await target.upstream.resolve_adapter(request, target.metadata)
    if target.workers is not None:
        return await open_direct(target.upstream.stub, target.workers, request,
                                 target.upstream.timeout_s, target.metadata,
                                 relay=lambda: target.upstream.open(request, target.metadata))
    return await target.upstream.open(request, target.metadata)


async def open_session(target: Target, model: str, request_id: str,
                       adapter: str = "") -> types_pb2.SessionInfo:
    return await target.upstream.stub.OpenSession(
        scheduler_pb2.OpenSessionRequest(request_id=request_id, model=model, adapter=adapter,
                                         preferred_worker_id=target.prefer_worker),
        timeout=target.upstream.timeout_s, metadata=target.metadata)


async def open_turn(target: Target, session_id: str,
                    request: types_pb2.GenerateRequest) -> OpenStream:
    """A session turn, admitted (its Queued events waited out, as Upstream.open does)."""
    await target.upstream.resolve_adapter(request, target.metadata)
    call = target.upstream.stub.SessionTurn(
        scheduler_pb2.SessionTurnRequest(session_id=session_id, request=request),
        timeout=target.upstream.timeout_s, metadata=target.metadata)
    try:
        return await admitted(call, "session turn")
    except grpc.RpcError as error:
        # The turn's fields are SessionTurnRequest.request's: named as Generate's would be.
        raise relabelled(error, (error.details() or "").removeprefix(_TURN_PREFIX),
                         _TURN_PREFIX) from None


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


class TimedStream:
    """An admitted stream whose first token and end its request's clock sees (the GenAI
    histograms, observed once per choice), for every API alike; a failure after the start
    is observed with its error type."""

    def __init__(self, stream: Opened, clock: RequestClock, model: str, index: int = 0) -> None:
        self.stream, self.admission = stream, stream.admission
        self._clock, self._model, self._index = clock, model, index

    async def events(self) -> AsyncIterator[types_pb2.GenerateEvent]:
        try:
            async for event in self.stream.events():
                kind = event.WhichOneof("event")
                if kind == "chunk" and event.chunk.token_ids:
                    self._clock.token(self._index)  # only the first one is timed
                elif kind == "finished":
                    self._clock.finished(self._index, self._model, event.finished)
                yield event
        except grpc.RpcError as error:  # gen_ai.server.request.duration with its error.type
            self._clock.failed(self._model, error.code().name.lower())
            raise

    def cancel(self) -> None:
        self.stream.cancel()


# What the routes read: an admitted call, timed or not.
Stream = Opened | TimedStream


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
