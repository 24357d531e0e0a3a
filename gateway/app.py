"""The FastAPI app: routes only. translate/responses shape JSON, errors picks statuses,
upstream talks gRPC; handlers raise HttpError and one handler renders it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace

import grpc
import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse

from ortserve.tls import channel_credentials

from . import responses
from .config import GatewayConfig
from .direct import DirectStream, Workers, open_direct
from .errors import HttpError, from_grpc, from_param_error
from .translate import Kind, ParamError, ParsedRequest, parse_request
from .upstream import OpenStream, StreamBroken, Upstream

log = structlog.get_logger("ortserve.gateway")
_PROMPT_PARAM = {"chat": "messages", "completion": "prompt"}
# How often a non-streaming handler checks that its client is still there.
_DISCONNECT_POLL_S = 0.25


def build_app(config: GatewayConfig) -> FastAPI:
    # NOTE: the grpc.aio channel is bound to the event loop that creates it, so
    # it is opened in the lifespan (on uvicorn's loop), not here.
    upstream: Upstream | None = None
    workers: Workers | None = None  # the direct path's channels (--direct-to-workers)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        nonlocal upstream, workers
        credentials = channel_credentials(config.scheduler_cacert) if config.scheduler_cacert else None
        upstream = Upstream(config.scheduler_address, config.request_timeout_s,
                            config.models_cache_s, credentials)
        if config.direct_to_workers:
            workers = Workers(channel_credentials(config.worker_tls_ca, config.worker_tls_cert,
                                                  config.worker_tls_key)
                              if config.worker_tls_ca else None)
        yield
        if workers is not None:
            await workers.close()
        await upstream.close()

    app = FastAPI(title="ortserve gateway", lifespan=lifespan)

    @app.exception_handler(HttpError)
    async def render(request: Request, error: HttpError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate("chat", request, upstream, workers, config.stream_interval_ms)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate("completion", request, upstream, workers,
                               config.stream_interval_ms)

    @app.get("/v1/models")
    async def models(request: Request):
        # Every model the scheduler's workers serve: the names a request's `model` takes.
        served = await _call(upstream.models(_passed_through(request)))
        return {"object": "list", "data": [
            {"id": m.model, "object": "model", "created": 0, "owned_by": "ortserve",
             "ortserve": {"workers": m.workers, "context_length": m.context_length,
                          "capacity_bytes": m.capacity_bytes,
                          "available_bytes": m.available_bytes}}
            for m in served]}

    @app.get("/health")
    async def health():
        # Ready means a request could be served now: the scheduler answers, has a
        # worker registered and is not draining. Its grpc.health status says exactly
        # that and needs no API key (the gateway holds none of its own).
        body = {"scheduler": upstream.address, "tls": upstream.tls}
        if not await _call(upstream.ready()):
            return JSONResponse({**body, "status": "not_ready"}, status_code=503)
        return {**body, "status": "ok"}

    return app


async def _call(awaitable):
    """Await a non-streaming scheduler call; its failure becomes the mapped HttpError."""
    try:
        return await awaitable
    except grpc.RpcError as error:
        raise from_grpc(error, "") from None


async def _generate(kind: Kind, request: Request, upstream: Upstream, workers: Workers | None,
                    stream_interval_ms: int = 0):
    parsed = _parse(kind, await _json_body(request))
    # NOTE: no local check of `model`: the scheduler resolves it against what its
    # workers serve now (an unknown one is its NOT_FOUND, a 404 here) and places
    # the request only on that model's workers.
    meta = responses.ResponseMeta.new(kind, parsed.model)
    parsed.generate.request_id = meta.id
    parsed.generate.stream_interval_ms = stream_interval_ms  # the gateway's --stream-interval-ms
    metadata = _passed_through(request)
    try:
        if workers is not None:  # the two-step path: the scheduler admits, the worker streams
            stream = await open_direct(upstream.stub, workers, parsed.generate,
                                       upstream.timeout_s, metadata)
        else:
            stream = await upstream.open(parsed.generate, metadata)
    except grpc.RpcError as error:
        raise from_grpc(error, _PROMPT_PARAM[kind]) from None
    except StreamBroken as error:
        raise HttpError(502, str(error), "server_error", "bad_upstream_stream") from None
    adm = stream.admission
    meta = replace(meta, model=adm.model or meta.model)  # the model that answers, as resolved
    log.info("admitted", request_id=meta.id, lease_id=adm.lease_id, worker_id=adm.worker_id,
             model=meta.model,
             decision=responses.admission_headers(adm)[responses.DECISION_HEADER],
             stream=parsed.stream)
    headers = {**responses.admission_headers(adm), "x-request-id": meta.id}
    if parsed.stream:
        return EventSourceResponse(_sse(meta, parsed, stream), headers=headers, sep="\n",
                                   ping=15)
    body = await _collect_unless_disconnected(request, meta, stream)
    return JSONResponse(body, headers=headers)


async def _json_body(request: Request) -> object:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise HttpError(400, f"the request body is not JSON: {error}", "invalid_request_error",
                        "invalid_json") from None


def _parse(kind: Kind, body: object) -> ParsedRequest:
    try:
        return parse_request(kind, body)
    except ParamError as error:
        raise from_param_error(error) from None


def _passed_through(request: Request) -> list[tuple[str, str]]:
    # API keys travel to the scheduler as gRPC metadata; the gateway holds no
    # keys of its own, so the scheduler stays the one place that checks them.
    auth = request.headers.get("authorization")
    return [("authorization", auth)] if auth else []


async def _collect(meta: responses.ResponseMeta, stream: OpenStream | DirectStream) -> dict:
    texts = []
    try:
        async for event in stream.events():
            if event.WhichOneof("event") == "chunk":
                texts.append(event.chunk.text)
            elif event.WhichOneof("event") == "finished":
                return responses.full_response(meta, "".join(texts), stream.admission,
                                               event.finished)
    except grpc.RpcError as error:
        raise from_grpc(error, _PROMPT_PARAM[meta.kind]) from None
    except StreamBroken as error:
        raise HttpError(502, str(error), "server_error", "bad_upstream_stream") from None
    raise HttpError(502, "the stream ended without a Finished event", "server_error",
                    "bad_upstream_stream")


async def _collect_unless_disconnected(request: Request, meta: responses.ResponseMeta,
                                       stream: OpenStream | DirectStream) -> dict:
    # NOTE: a non-streaming handler is not cancelled when its client goes away;
    # without this watch, an abandoned request would hold its lease to the end.
    collecting = asyncio.ensure_future(_collect(meta, stream))
    try:
        while True:
            done, _ = await asyncio.wait({collecting}, timeout=_DISCONNECT_POLL_S)
            if done:
                return collecting.result()
            if await request.is_disconnected():
                log.info("client disconnected", request_id=meta.id,
                         lease_id=stream.admission.lease_id)
                raise HttpError(499, "the client disconnected", "cancelled", "client_disconnected")
    finally:
        if not collecting.done():
            stream.cancel()
            collecting.cancel()


async def _sse(meta: responses.ResponseMeta, parsed: ParsedRequest,
               stream: OpenStream | DirectStream) -> AsyncIterator[dict]:
    usage = parsed.include_usage
    finished = False
    text_json = responses.text_chunk_encoder(meta, usage)
    try:
        yield _data(responses.first_chunk(meta, stream.admission, usage))
        async for event in stream.events():
            kind = event.WhichOneof("event")
            # An empty chunk is a character still incomplete: nothing to show yet.
            if kind == "chunk":
                if event.chunk.text:
                    # Bytes go out as they are: the SSE line, without an event object per token.
                    yield b"data: " + text_json(event.chunk.text).encode() + b"\n\n"
            elif kind == "finished":
                finished = True
                yield _data(responses.final_chunk(meta, event.finished, usage))
                if usage:
                    yield _data(responses.usage_chunk(meta, event.finished))
        yield {"data": "[DONE]"}
    except grpc.RpcError as error:
        # The headers are gone already: a mid-stream failure is an error event,
        # which the openai clients raise as APIError.
        yield _data(from_grpc(error, _PROMPT_PARAM[meta.kind]).body())
    except StreamBroken as error:
        yield _data(HttpError(502, str(error), "server_error", "bad_upstream_stream").body())
    finally:
        # The client went away (sse-starlette cancels us) or we failed: either
        # way the gRPC call must end, so the lease is freed now, not at the end.
        if not finished:
            log.info("stream ended early", request_id=meta.id, lease_id=stream.admission.lease_id)
            stream.cancel()


def _data(obj: dict) -> dict:
    return {"data": json.dumps(obj, separators=(",", ":"))}
