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
from starlette.exceptions import HTTPException as StarletteHTTPException

from ortserve import tracing
from ortserve.metrics import new_registry
from ortserve.request_rules import TENANT_METADATA
from ortserve.tls import channel_credentials
from ortserve.v1 import types_pb2

from . import anthropic_route, choices, errors, responses, responses_route, tokenize, tools
from .config import GatewayConfig
from .direct import DirectStream, Workers, open_direct
from .errors import HttpError, from_grpc, from_param_error
from .generation import Target
from .logprobs_json import ChoiceLogprobs
from .metrics import HttpMetrics, MetricsMiddleware
from .reasoning_split import ChoiceReasoning
from .response_store import ResponseStore
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
    stored = ResponseStore(config.responses_max, config.responses_ttl_s)
    errors.SCHEDULER["address"] = config.scheduler_address  # named when it cannot be reached

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        nonlocal upstream, workers
        credentials = channel_credentials(config.scheduler_cacert) if config.scheduler_cacert else None
        upstream = Upstream(config.scheduler_address, config.request_timeout_s,
                            config.models_cache_s, credentials)
        if config.direct_to_workers is not False:
            workers = Workers(channel_credentials(config.worker_tls_ca, config.worker_tls_cert,
                                                  config.worker_tls_key)
                              if config.worker_tls_ca else None,
                              relay_if_unreachable=config.direct_to_workers is None)
        yield
        if workers is not None:
            await workers.close()
        await upstream.close()

    app = FastAPI(title="ortserve gateway", lifespan=lifespan)
    app.state.tenant_header = config.tenant_header
    metrics = HttpMetrics(new_registry())
    app.add_middleware(MetricsMiddleware, metrics=metrics, routes=app.router.routes)
    tracing.instrument_fastapi(app)  # a no-op unless __main__ turned tracing on

    @app.exception_handler(HttpError)
    async def render(request: Request, error: HttpError) -> JSONResponse:
        return JSONResponse(error.body(), status_code=error.status, headers=error.headers())

    @app.exception_handler(StarletteHTTPException)
    async def not_routed(request: Request, error: StarletteHTTPException) -> JSONResponse:
        # Unknown routes and methods answer in OpenAI's error shape too, so an SDK
        # pointed at a wrong path says why instead of failing to parse HTML or FastAPI's.
        return JSONResponse(unrouted(request.method, request.url.path, error).body(),
                            status_code=error.status_code, headers=error.headers)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _generate("chat", request, upstream, workers, config.stream_interval_ms,
                               config.reasoning_parser)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate("completion", request, upstream, workers,
                               config.stream_interval_ms)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await responses_route.create(request, _target(request), stored,
                                            config.reasoning_parser)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str):
        return responses_route.get(stored, response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request):
        return responses_route.delete(stored, _target(request), response_id)

    @app.post("/v1/messages")
    async def create_message(request: Request):
        # Anthropic's SDKs send their key as x-api-key; errors answer in Anthropic's shape.
        return await anthropic_route.create(
            request, Target(upstream, workers, anthropic_route.passed_through(request),
                   config.stream_interval_ms),
            config.reasoning_parser)

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(request: Request):
        return await anthropic_route.count_tokens(
            request, Target(upstream, workers, anthropic_route.passed_through(request),
                   config.stream_interval_ms))

    def _target(request: Request) -> Target:
        return Target(upstream, workers, tuple(_passed_through(request)), config.stream_interval_ms)

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        # vLLM's shape; counted by a worker of the model, as Generate would count it.
        parsed = _parsed(tokenize.tokenize_request, await _json_body(request))
        answer = await _call(upstream.tokenize(parsed, _passed_through(request)),
                             "messages" if parsed.WhichOneof("prompt") == "chat" else "prompt")
        return tokenize.tokenize_response(answer)

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        parsed = _parsed(tokenize.detokenize_request, await _json_body(request))
        answer = await _call(upstream.detokenize(parsed, _passed_through(request)), "tokens")
        return tokenize.detokenize_response(answer)

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

    @app.get("/metrics")
    async def prometheus_metrics():
        # The gateway's own numbers (gateway/metrics.py); the scheduler's and the
        # workers' are on their --metrics-port.
        return metrics.response()

    return app


_ROUTES = ("POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, "
           "GET|DELETE /v1/responses/{id}, POST /v1/messages, POST /v1/messages/count_tokens, "
           "GET /v1/models, POST /tokenize, "
           "POST /detokenize, GET /health")


def unrouted(method: str, path: str, error: StarletteHTTPException) -> HttpError:
    """404 / 405 (and any other routing refusal) as an OpenAI error object."""
    if error.status_code == 404:
        return HttpError(404, f"Invalid URL ({method} {path}): the gateway serves {_ROUTES}",
                         "invalid_request_error", "unknown_url")
    if error.status_code == 405:
        allowed = (error.headers or {}).get("allow", "")
        return HttpError(405, f"{method} is not allowed on {path} (allowed: {allowed}); the "
                         f"gateway serves {_ROUTES}", "invalid_request_error",
                         "method_not_allowed")
    return HttpError(error.status_code, str(error.detail), "invalid_request_error",
                     f"http_{error.status_code}")


async def _call(awaitable, prompt_param: str = ""):
    """Await a non-streaming scheduler call; its failure becomes the mapped HttpError."""
    try:
        return await awaitable
    except grpc.RpcError as error:
        raise from_grpc(error, prompt_param) from None


def _parsed(parse, body: object):
    try:
        return parse(body)
    except ParamError as error:
        raise from_param_error(error) from None


async def _generate(kind: Kind, request: Request, upstream: Upstream, workers: Workers | None,
                    stream_interval_ms: int = 0, reasoning_parser: str = "auto"):
    parsed = replace(_parse(kind, await _json_body(request)), reasoning_mode=reasoning_parser)
    # NOTE: no local check of `model`: the scheduler resolves it against what its
    # workers serve now (an unknown one is its NOT_FOUND, a 404 here) and places
    # the request only on that model's workers.
    meta = responses.ResponseMeta.new(kind, parsed.model)
    metadata = _passed_through(request)
    # n choices: n Generate calls, each admitted on its own (gateway/choices.py).
    requests = [parsed.choice_request(i, meta.id if i == 0 else f"{meta.id}-{i}")
                for i in range(parsed.n)]
    for r in requests:  # the request's own, else the gateway's --stream-interval-ms
        r.stream_interval_ms = (parsed.stream_interval_ms if parsed.stream_interval_ms is not None
                                else stream_interval_ms)
    try:
        if workers is not None:  # the two-step path: the scheduler admits, the worker streams
            def opener(r):
                return open_direct(upstream.stub, workers, r, upstream.timeout_s, metadata,
                                   relay=lambda: upstream.open(r, metadata))
        else:
            def opener(r):
                return upstream.open(r, metadata)
        streams = await choices.open_all(opener, requests)
    except grpc.RpcError as error:
        raise from_grpc(error, _PROMPT_PARAM[kind], kind) from None
    except StreamBroken as error:
        raise HttpError(502, str(error), "server_error", "bad_upstream_stream") from None
    admissions = [s.admission for s in streams]
    adm = admissions[0]
    meta = replace(meta, model=adm.model or meta.model)  # the model that answers, as resolved
    headers = {**responses.choices_headers(admissions), "x-request-id": meta.id}
    log.info("admitted", request_id=meta.id, lease_id=adm.lease_id, worker_id=adm.worker_id,
             model=meta.model, decision=headers[responses.DECISION_HEADER],
             stream=parsed.stream, choices=len(streams))
    if parsed.stream:
        return EventSourceResponse(_sse(meta, parsed, streams), headers=headers, sep="\n",
                                   ping=15)
    body = await _collect_unless_disconnected(request, meta, parsed, streams)
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
    passed = [("authorization", auth)] if auth else []
    # --tenant-header: the proxy in front of the gateway says whose request this is; the
    # scheduler honours it only when its tenants file trusts this metadata (docs/tenants.md).
    header = getattr(request.app.state, "tenant_header", "")
    tenant = request.headers.get(header) if header else None
    if tenant:
        passed.append((TENANT_METADATA, tenant))
    return passed


def _logprobs(meta: responses.ResponseMeta, parsed: ParsedRequest, n: int
              ) -> list[ChoiceLogprobs | None]:
    return [ChoiceLogprobs(meta.kind) if parsed.logprobs else None for _ in range(n)]


async def _collect(meta: responses.ResponseMeta, parsed: ParsedRequest,
                   streams: list[OpenStream | DirectStream]) -> dict:
    texts: list[list[str]] = [[] for _ in streams]
    finished: list[types_pb2.Finished | None] = [None] * len(streams)
    logprobs = _logprobs(meta, parsed, len(streams))
    splits = [ChoiceReasoning.for_choice(meta.kind, s.admission, parsed.reasoning_mode)
              for s in streams]
    try:
        async for index, event in choices.merged(streams):
            kind = event.WhichOneof("event")
            if kind == "chunk":
                text = event.chunk.text
                if splits[index] is not None:
                    text = splits[index].feed(text, len(event.chunk.token_ids))[1]
                texts[index].append(text)
                if logprobs[index] is not None:
                    logprobs[index].add(event.chunk.logprobs)
            elif kind == "finished":
                finished[index] = event.finished
    except grpc.RpcError as error:
        raise from_grpc(error, _PROMPT_PARAM[meta.kind], meta.kind) from None
    except StreamBroken as error:
        raise HttpError(502, str(error), "server_error", "bad_upstream_stream") from None
    if any(f is None for f in finished):
        raise HttpError(502, "the stream ended without a Finished event", "server_error",
                        "bad_upstream_stream")
    for i, split in enumerate(splits):
        if split is not None:
            texts[i].append(split.close()[1])
    whole = ["".join(t) + _stop_text(parsed, f) for t, f in zip(texts, finished, strict=True)]
    return responses.choices_response(meta, [
        responses.Choice(whole[i], s.admission, finished[i],
                         logprobs[i].whole() if logprobs[i] is not None else None,
                         tools.ToolCallChoice(s.admission.tool_call_format).message(whole[i])
                         if parsed.tool_calls else None,
                         splits[i].reasoning if splits[i] is not None else None,
                         splits[i].tokens if splits[i] is not None else None)
        for i, s in enumerate(streams)], parsed.resolved)


def _reasoning_tokens(splits: list[ChoiceReasoning | None]) -> int | None:
    """The choices' reasoning tokens summed; None when no choice splits reasoning."""
    counted = [s.tokens for s in splits if s is not None]
    return sum(counted) if counted else None


def _stop_text(parsed: ParsedRequest, fin: types_pb2.Finished) -> str:
    """include_stop_str_in_output: the stop sequence that ended the output, which the
    worker leaves out of the text, put back at its end (vLLM's behaviour)."""
    if parsed.include_stop_str and fin.finish_reason == types_pb2.STOP_SEQUENCE:
        return fin.stop_sequence
    return ""


async def _collect_unless_disconnected(request: Request, meta: responses.ResponseMeta,
                                       parsed: ParsedRequest, streams: list[OpenStream | DirectStream]) -> dict:
    # NOTE: a non-streaming handler is not cancelled when its client goes away;
    # without this watch, an abandoned request would hold its lease to the end.
    collecting = asyncio.ensure_future(_collect(meta, parsed, streams))
    try:
        while True:
            done, _ = await asyncio.wait({collecting}, timeout=_DISCONNECT_POLL_S)
            if done:
                return collecting.result()
            if await request.is_disconnected():
                log.info("client disconnected", request_id=meta.id,
                         lease_id=streams[0].admission.lease_id)
                raise HttpError(499, "the client disconnected", "cancelled", "client_disconnected")
    finally:
        if not collecting.done():
            choices.cancel_all(streams)
            collecting.cancel()


async def _sse(meta: responses.ResponseMeta, parsed: ParsedRequest,
               streams: list[OpenStream | DirectStream]) -> AsyncIterator[dict]:
    usage = parsed.include_usage
    finished: list[types_pb2.Finished | None] = [None] * len(streams)
    logprobs = _logprobs(meta, parsed, len(streams))
    # Per choice, the chunk JSON from one template: per token only the text is encoded.
    text_json = [responses.text_chunk_encoder(meta, usage, i) for i in range(len(streams))]
    # Tools: each choice's text goes through its tool-call parser (name, then arguments).
    calls = [tools.ToolCallChoice(s.admission.tool_call_format) if parsed.tool_calls else None
             for s in streams]
    # continuous_usage_stats: every chunk carries its choice's usage so far (vLLM's shape).
    generated = [0] * len(streams)
    # A reasoning model's chat: its reasoning goes out as reasoning_content deltas.
    splits = [ChoiceReasoning.for_choice(meta.kind, s.admission, parsed.reasoning_mode)
              for s in streams]

    def out(chunk: dict, index: int) -> dict:
        if parsed.continuous_usage:
            prompt = streams[index].admission.prompt_tokens
            chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": generated[index],
                              "total_tokens": prompt + generated[index]}
        return _data(chunk)

    try:
        for index, stream in enumerate(streams):
            yield out(responses.first_chunk(meta, stream.admission, usage, index,
                                            parsed.resolved if index == 0 else None), index)
        async for index, event in choices.merged(streams):
            kind = event.WhichOneof("event")
            lp = logprobs[index]
            if kind == "chunk":
                generated[index] += len(event.chunk.token_ids)
                if lp is not None:
                    lp.add(event.chunk.logprobs)
                text = event.chunk.text
                if splits[index] is not None and text:
                    thought, text = splits[index].feed(text, len(event.chunk.token_ids))
                    if thought:
                        yield out(responses.delta_chunk(meta, {"reasoning_content": thought},
                                                        usage, index,
                                                        lp.take() if lp is not None else None),
                                  index)
                # An empty chunk is a character still incomplete: nothing to show yet
                # (its logprobs wait for the chunk that shows its text).
                if text and calls[index] is not None:
                    for chunk in _tool_chunks(meta, calls[index], text, usage,
                                              index, lp, emit=out):
                        yield chunk
                elif text:
                    if lp is None and not parsed.continuous_usage:
                        # Bytes go out as they are: the SSE line, without an event object per token.
                        yield b"data: " + text_json[index](text).encode() + b"\n\n"
                    else:
                        yield out(responses.text_chunk(meta, text, usage, index,
                                                       lp.take() if lp is not None else None),
                                  index)
            elif kind == "finished":
                finished[index] = event.finished
                generated[index] = event.finished.usage.generated_tokens
                stop_text = _stop_text(parsed, event.finished)
                if splits[index] is not None:
                    thought, rest = splits[index].close()
                    if thought:
                        yield out(responses.delta_chunk(meta, {"reasoning_content": thought},
                                                        usage, index), index)
                    stop_text = rest + stop_text
                called = False
                if calls[index] is not None:
                    for chunk in _tool_chunks(meta, calls[index], stop_text, usage, index, lp,
                                              True, emit=out):
                        yield chunk
                    called = calls[index].called
                elif stop_text:
                    yield out(responses.text_chunk(meta, stop_text, usage, index), index)
                yield out(responses.final_chunk(meta, event.finished, usage, index,
                                                lp.take() if lp is not None else None,
                                                called), index)
        if usage:
            yield _data(responses.usage_chunk(meta, finished, _reasoning_tokens(splits)))
        yield {"data": "[DONE]"}
    except grpc.RpcError as error:
        # The headers are gone already: a mid-stream failure is an error event,
        # which the openai clients raise as APIError.
        yield _data(from_grpc(error, _PROMPT_PARAM[meta.kind], meta.kind).body())
    except StreamBroken as error:
        yield _data(HttpError(502, str(error), "server_error", "bad_upstream_stream").body())
    finally:
        # The client went away (sse-starlette cancels us) or we failed: either
        # way the gRPC call must end, so the lease is freed now, not at the end.
        if any(f is None for f in finished):
            log.info("stream ended early", request_id=meta.id,
                     lease_id=streams[0].admission.lease_id)
            choices.cancel_all(streams)


def _tool_chunks(meta: responses.ResponseMeta, parser: tools.ToolCallChoice, text: str,
                 usage: bool, index: int, lp: ChoiceLogprobs | None, final: bool = False,
                 emit=None) -> list[dict]:
    """A choice's text as tool-call and content deltas; logprobs ride on the first chunk
    (text held back, e.g. a possible "<tool_call>", keeps them for the next). `emit`
    (chunk, index) -> SSE item; default: the chunk as it is."""
    out = []
    for delta in parser.deltas(text, final):
        chunk = responses.delta_chunk(meta, delta, usage, index,
                                      lp.take() if lp is not None else None)
        out.append(emit(chunk, index) if emit is not None else _data(chunk))
    return out


def _data(obj: dict) -> dict:
    return {"data": json.dumps(obj, separators=(",", ":"))}
