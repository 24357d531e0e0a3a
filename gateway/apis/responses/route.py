"""POST /v1/responses (and GET / DELETE of a stored one): the handler.

Where a response runs:
- `store: false`: a plain Generate of the whole conversation, as chat's.
- `store: true` (OpenAI's default), a first response: a plain Generate too, asking its
  worker to keep the prompt and answer in its prefix cache for the store's TTL
  (GenerateRequest.keep_prefix_s): cache bytes, evicted under pressure, never an idle
  session charged per one-shot call. A follow-up (`previous_response_id`) of it opens a
  session with the whole conversation, which copies the kept blocks in (its usage's
  cached_tokens; after an eviction it prefills them again: slower, the same answer).
- A follow-up whose response is its session's latest, with the same model,
  instructions and tools, is the next turn of that session (docs/features/sessions.md):
  only the new input is sent and prefilled, the rest of the KV is the session's.
  Any other follow-up (a fork, a session expired or lost) opens a new session
  with the whole conversation. A worker that keeps no sessions (`--kv-layout
  static`) answers as `store: false` would, and `ortserve.session` says why.
The session's lease is the scheduler's like any other: charged while the
session holds KV, reclaimable (swapped out) when idle and an admission needs
the bytes, closed at the scheduler's --session-ttl-s or when the store
forgets the response that could continue it (gateway/apis/responses/store.py).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace

import grpc
import structlog
from fastapi import Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from gateway import generation
from gateway.apis.responses import input_items
from gateway.apis.responses import reply as openai_responses_reply
from gateway.apis.responses import request as openai_responses
from gateway.apis.responses.reply import OutputItems, ResponsesReplyMeta
from gateway.apis.responses.request import ResponsesRequest
from gateway.apis.responses.store import ResponseStore, Stored
from gateway.generation import Reader, Stream, Target
from gateway.reply.errors import HttpError, from_grpc, from_param_error
from gateway.reply.ortserve_numbers import admission_headers
from gateway.reply.output_parts import Collected, OutputParser
from gateway.request.param_error import ParamError
from gateway.request.translate import ParsedRequest
from gateway.request_metrics import NOT_REPORTED, Reporting, body_metrics
from gateway.upstream import StreamBroken
from ortserve.rules import request_rules
from ortserve.v1 import types_pb2

log = structlog.get_logger("ortserve.gateway")
# A session turn that met its session gone: the conversation goes to a new session.
_SESSION_GONE = {"SESSION_NOT_FOUND", "SESSION_WORKER_LOST", "SESSION_BUSY"}
_CLOSING: set[asyncio.Task] = set()


@dataclass
class Run:
    """One response's generation: its stream and what keeps it."""

    stream: Stream
    session_id: str = ""  # "": not kept
    new_session: bool = False  # opened for this response (closed if it fails)
    turn: int = 0  # the session's turn this is (1-based)
    session_note: dict | None = None  # the `ortserve.session` object when not kept
    settled: bool = False
    request: ResponsesRequest | None = None  # what was asked (set by the handler)
    tools_key: str = ""
    history: list[dict] = field(default_factory=list)  # the stored conversation before it


def call_prefix(session_id: str) -> str:
    """Call ids shown for a session's calls: the session's own `call_<turn>_<index>` with a
    tag of the session, so ids stay unique in a conversation that moved to a new session."""
    return f"call_{session_id[-8:]}_"


def _internal_ids(req: types_pb2.GenerateRequest, session_id: str) -> None:
    """The ids a client sends back (`call_<tag>_<turn>_<index>`) as the session knows them."""
    prefix = call_prefix(session_id)
    for message in req.chat.messages:
        if message.tool_call_id.startswith(prefix):
            message.tool_call_id = "call_" + message.tool_call_id[len(prefix):]
        for call in message.tool_calls:
            if call.id.startswith(prefix):
                call.id = "call_" + call.id[len(prefix):]


async def create(request: Request, target: Target, store: ResponseStore,
                 reasoning_mode: str = "auto", reporting: Reporting = NOT_REPORTED):
    """`reasoning_mode`: the gateway's --reasoning-parser (reasoning items split as chat's
    reasoning_content is, when the Admission names the model's reasoning format);
    `reporting`: the per-request `metrics` and the GenAI histograms, as chat's."""
    rr = _parse(await generation.json_body(request))
    clock = reporting.clock("responses", rr.model)  # the histograms count from the arrival
    with_metrics = reporting.asks(request.headers)
    prior = None
    if rr.previous_response_id:
        try:
            prior = await store.get(rr.previous_response_id, target)
        except grpc.RpcError as error:
            raise openai_responses.renamed(from_grpc(error, "messages", "responses")) from None
        if prior is None:
            raise HttpError(400, f"previous_response_id: no stored response "
                            f"{rr.previous_response_id!r} (never stored with store: true, "
                            f"deleted, or forgotten: responses live {store.ttl_s:g} s, at most "
                            f"{store.max_responses:,}); send the whole conversation as input",
                            "invalid_request_error", "previous_response_not_found",
                            "previous_response_id")
    history = prior.conversation if prior else []
    try:
        parsed = replace(rr.chat(history), reasoning_mode=reasoning_mode)
    except ParamError as error:
        raise from_param_error(error) from None
    meta = ResponsesReplyMeta(openai_responses_reply.new_id("resp"), rr, rr.model)
    try:  # `model` naming a LoRA adapter: its base with it (a session opens on the base)
        await target.upstream.resolve_adapter(parsed.generate, target.metadata)
    except grpc.RpcError as error:
        raise openai_responses.renamed(from_grpc(error, "messages", "responses")) from None
    run = await _open(target, store, rr, parsed, prior, meta.id)
    run.request, run.history, run.tools_key = rr, history, tools_key(parsed)
    adm = run.stream.admission
    meta.model = parsed.generate.adapter or adm.model or meta.model  # an adapter: its name
    run.stream = generation.TimedStream(run.stream, clock, meta.model)
    headers = {**admission_headers(adm), "x-request-id": meta.id}
    log.info("admitted", request_id=meta.id, lease_id=adm.lease_id, worker_id=adm.worker_id,
             model=meta.model, api="responses", session_id=run.session_id,
             stream=rr.stream)
    parser = OutputParser.for_stream(parsed, adm, _call_ids(run) if run.session_id else None)
    if rr.stream:
        return EventSourceResponse(_events(meta, parsed, run, Reader(parser), store, target,
                                           with_metrics),
                                   headers=headers, sep="\n", ping=15)
    try:
        pieces, fin = await generation.unless_disconnected(
            request, generation.read_all(run.stream, reader := Reader(parser)),
            run.stream.cancel, meta.id)
    except grpc.RpcError as error:
        _abandon(store, target, run)
        raise openai_responses.renamed(from_grpc(error, "messages", "responses")) from None
    except StreamBroken as error:
        _abandon(store, target, run)
        raise HttpError(502, str(error), "server_error", "bad_upstream_stream") from None
    except BaseException:
        _abandon(store, target, run)
        raise
    items = OutputItems()
    items.add(pieces)
    status, incomplete = openai_responses_reply.status_of(fin)
    items.close(status)
    body = _final(meta, parsed, run, items.items, fin, reader)
    await _settle(store, target, run, body, pieces, fin)
    if with_metrics:  # vLLM's per-request metrics, in the answer (not in what is stored)
        body = {**body, "metrics": body_metrics(adm, fin)}
    return JSONResponse(body, headers=headers)


def _parse(body: object) -> ResponsesRequest:
    try:
        return openai_responses.parse(body)
    except ParamError as error:
        raise from_param_error(error) from None


def _call_ids(run: Run):
    prefix = call_prefix(run.session_id)
    return lambda index: f"{prefix}{run.turn}_{index}"


async def _open(target: Target, store: ResponseStore, rr: ResponsesRequest,
                parsed: ParsedRequest, prior: Stored | None, request_id: str) -> Run:
    """Start the response where it runs (see the module's doc); raises the mapped HttpError."""
    request = generation.generate_request(target, parsed, 0, request_id)
    try:
        if not rr.store:
            return Run(await generation.open_generate(target, request),
                       session_note={"kept": False, "reason": "store is false"})
        if prior is None:
            # One-shot until a follow-up comes: its prompt and answer wait in the prefix
            # cache (cache bytes), not in a session charged until its TTL.
            request.keep_prefix_s = min(store.ttl_s, request_rules.MAX_KEEP_PREFIX_S)
            return Run(await generation.open_generate(target, request), session_note={
                "kept": False, "prefix_kept_s": request.keep_prefix_s,
                "reason": "a first stored response keeps its prompt and answer in the prefix "
                          "cache; a follow-up (previous_response_id) opens a session on them"})
        session = (await store.claim(prior, target)
                   if prior and _continues(prior, rr, parsed) else "")
        if session:
            turn = types_pb2.GenerateRequest()
            turn.CopyFrom(request)
            # Only the new input: the session holds the rest of the conversation.
            del turn.chat.messages[:len(turn.chat.messages) - len(rr.input_messages)]
            _internal_ids(turn, session)
            try:
                stream = await generation.open_turn(target, session, turn)
            except grpc.RpcError as error:
                gone = generation.reason_of(error) in _SESSION_GONE
                _close_all(target, await store.turn_ended(session, not gone, target))
                if not gone:
                    raise
            else:
                return Run(stream, session, False, prior.turns + 1)
        # A follow-up: its conversation may start with the blocks a first response kept,
        # its answer's included (the K/V a session would have held).
        request.continues_kept_answer = True
        return await _open_new_session(target, request, request.model, request_id)
    except grpc.RpcError as error:
        raise openai_responses.renamed(from_grpc(error, "messages", "responses")) from None
    except StreamBroken as error:
        raise HttpError(502, str(error), "server_error", "bad_upstream_stream") from None


def tools_key(parsed: ParsedRequest) -> str:
    """The tools the template is told of (none with tool_choice "none"): a session keeps its
    first turn's for its life, so only a turn offering the same continues it."""
    return b"".join(t.SerializeToString(deterministic=True)
                    for t in parsed.generate.chat.tools).hex()


def _continues(prior: Stored, rr: ResponsesRequest, parsed: ParsedRequest) -> bool:
    return (prior.model == rr.model and prior.instructions == rr.instructions
            and prior.tools_key == tools_key(parsed))


async def _open_new_session(target: Target, request: types_pb2.GenerateRequest, model: str,
                            request_id: str) -> Run:
    try:
        info = await generation.open_session(target, model, request_id, request.adapter)
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.INVALID_ARGUMENT:
            raise
        # The worker keeps no sessions (its KV layout): served as store: false, and said.
        return Run(await generation.open_generate(target, request),
                   session_note={"kept": False, "reason": error.details() or ""})
    try:
        stream = await generation.open_turn(target, info.session_id, request)
    except BaseException:
        _close_all(target, [info.session_id])
        raise
    return Run(stream, info.session_id, True, 1)


def _session_dict(run: Run, fin: types_pb2.Finished | None) -> dict | None:
    if not run.session_id:
        return run.session_note
    out = {"kept": True, "id": run.session_id, "turn": run.turn}
    if fin is not None:
        out["reused_prompt_tokens"] = fin.usage.reused_prompt_tokens
    if fin is not None and fin.HasField("session"):
        s = fin.session
        out.update(held_tokens=s.held_tokens, reserved_bytes=s.reserved_bytes,
                   lease_id=s.lease_id, worker_id=s.worker_id)
    return out


def _final(meta: ResponsesReplyMeta, parsed: ParsedRequest, run: Run, output: list[dict],
           fin: types_pb2.Finished, reader: Reader) -> dict:
    status, incomplete = openai_responses_reply.status_of(fin)
    return openai_responses_reply.response_object(
        meta, status, output, openai_responses_reply.usage_dict(fin.usage, reader.reasoning_tokens),
        incomplete, openai_responses_reply.ortserve_extension(run.stream.admission, fin,
                                                        _session_dict(run, fin),
                                                        parsed.resolved))


async def _settle(store: ResponseStore, target: Target, run: Run, body: dict | None,
                  pieces: list | None = None, fin: types_pb2.Finished | None = None) -> None:
    """The response ended (`body`: it finished; None: it failed or was abandoned). A
    finished stored response is put in the store (awaited: a follow-up sent on its answer
    finds it, from any gateway process); a session nothing can continue is closed."""
    if run.settled:
        return
    run.settled = True
    closing: list[str] = []
    rr = run.request
    try:
        if body is not None and rr.store:
            # First the new head, then the turn's end: the session is never without one between.
            collected = Collected()
            collected.add(pieces or [])
            closing += await store.put(Stored(
                body["id"], body["model"], rr.instructions, run.tools_key,
                run.history + rr.input_messages + [collected.chat_message()], body,
                run.session_id, fin.session.turns if fin is not None and fin.HasField("session")
                else run.turn, input_items.items_of(rr.body.get("input"))), target)
        if run.session_id and not run.new_session:
            closing += await store.turn_ended(run.session_id, body is not None, target)
        elif run.session_id and body is None:
            closing.append(run.session_id)
    except grpc.RpcError as error:
        # The answer stands (its output is made); only its storing failed: said, and its
        # session closed, since no stored response can continue it.
        log.error("stored response not kept", response_id=body["id"] if body else None,
                  session_id=run.session_id, code=error.code().name, detail=error.details())
        if body is not None:
            body.setdefault("ortserve", {})["stored"] = False
        closing += [run.session_id] if run.session_id else []
    _close_all(target, closing)


def _abandon(store: ResponseStore, target: Target, run: Run) -> None:
    """_settle for a response that failed or was abandoned, from a path that must not wait
    (a cancelled task's cleanup): run as its own task."""
    if not run.settled:
        task = asyncio.ensure_future(_settle(store, target, run, None))
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)


def _close_all(target: Target, session_ids: list[str]) -> None:
    for session_id in session_ids:
        task = asyncio.ensure_future(generation.close_session(target.upstream, session_id,
                                                              target.metadata))
        _CLOSING.add(task)  # a task nobody holds may be collected mid-way
        task.add_done_callback(_CLOSING.discard)


async def _events(meta: ResponsesReplyMeta, parsed: ParsedRequest, run: Run, reader: Reader,
                  store: ResponseStore, target: Target, with_metrics: bool = False
                  ) -> AsyncIterator[dict]:
    items = OutputItems()
    adm = run.stream.admission
    started = openai_responses_reply.response_object(
        meta, "in_progress", [], ortserve=openai_responses_reply.ortserve_extension(
            adm, None, _session_dict(run, None), parsed.resolved))
    pieces: list = []
    try:
        yield _sse(items.event("response.created", response=started))
        yield _sse(items.event("response.in_progress", response=started))
        async for event in run.stream.events():
            kind = event.WhichOneof("event")
            if kind == "chunk":
                new = reader.chunk(event.chunk)
            elif kind == "finished":
                new = reader.end(event.finished)
            else:
                continue
            pieces += new
            for out in items.add(new):
                yield _sse(out)
            if kind == "finished":
                fin = event.finished
                status, _ = openai_responses_reply.status_of(fin)
                for out in items.close(status):
                    yield _sse(out)
                body = _final(meta, parsed, run, items.items, fin, reader)
                await _settle(store, target, run, body, pieces, fin)
                if with_metrics:  # on the last event's response, as on chat's last chunk
                    body = {**body, "metrics": body_metrics(adm, fin)}
                yield _sse(items.event(f"response.{status}", response=body))
                return
        raise StreamBroken("the stream ended without a Finished event")
    except grpc.RpcError as error:
        # The headers are gone already: a failure mid-way is an error event, then
        # response.failed (the openai clients yield both).
        failure = openai_responses.renamed(from_grpc(error, "messages", "responses"))
        yield _sse(items.event("error", code=failure.code, message=failure.message,
                               param=failure.param))
        yield _sse(items.event("response.failed", response=openai_responses_reply.response_object(
            meta, "failed", items.items, error={"code": failure.code,
                                                "message": failure.message})))
    except StreamBroken as error:
        yield _sse(items.event("error", code="bad_upstream_stream", message=str(error),
                               param=None))
    finally:
        if not run.settled:
            # The client went away (sse-starlette cancels us) or the call failed: the gRPC
            # call ends now, so the lease is freed now; a session turn cut short is closed.
            log.info("stream ended early", request_id=meta.id, lease_id=adm.lease_id)
            run.stream.cancel()
            _abandon(store, target, run)


def _sse(event: dict) -> dict:
    return {"event": event["type"], "data": json.dumps(event, separators=(",", ":"))}


# -- stored responses -------------------------------------------------------------


async def _stored(store: ResponseStore, target: Target, response_id: str):
    """The stored response, or the 404 (or the store's own error, in the Responses' words)."""
    try:
        stored = await store.get(response_id, target)
    except grpc.RpcError as error:
        raise openai_responses.renamed(from_grpc(error, "messages", "responses")) from None
    if stored is None:
        raise _not_found(store, response_id)
    return stored


async def get(store: ResponseStore, target: Target, response_id: str) -> dict:
    stored = await _stored(store, target, response_id)
    return stored.body


async def list_input_items(store: ResponseStore, target: Target, response_id: str,
                           query: Mapping[str, str]) -> dict:
    stored = await _stored(store, target, response_id)
    try:
        return input_items.page(stored.input_items, query)
    except ParamError as error:
        raise from_param_error(error) from None


async def cancel(store: ResponseStore, target: Target, response_id: str) -> dict:
    # OpenAI cancels only a background response, and ortserve runs none (background is
    # refused): a stored response is finished, so this is a 400 saying how to stop one.
    await _stored(store, target, response_id)  # a missing one is a 404 first
    raise HttpError(400, f"response {response_id!r} cannot be cancelled: only a response "
                    "created with background: true can be, and ortserve runs none in the "
                    "background (each runs while its request is open, and a stored one has "
                    "finished); to stop one while it runs, close its request or stream",
                    "invalid_request_error", "not_background")


async def delete(store: ResponseStore, target: Target, response_id: str) -> dict:
    try:
        found, closing = await store.delete(response_id, target)
    except grpc.RpcError as error:
        raise openai_responses.renamed(from_grpc(error, "messages", "responses")) from None
    if not found:
        raise _not_found(store, response_id)
    _close_all(target, closing)
    return {"id": response_id, "object": "response.deleted", "deleted": True}


def _not_found(store: ResponseStore, response_id: str) -> HttpError:
    return HttpError(404, f"no stored response {response_id!r} (never stored, deleted, or "
                     f"forgotten: responses live {store.ttl_s:g} s, at most "
                     f"{store.max_responses:,})", "invalid_request_error", "not_found")
