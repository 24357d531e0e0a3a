"""The FastAPI app: routes only. translate/responses shape JSON, errors picks statuses,
upstream talks gRPC, apis/chat/stream streams or collects the answer; handlers raise
HttpError and one handler renders it."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager
from dataclasses import replace

import grpc
import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.apis.chat import n_choices as choices
from gateway.apis.chat import reply as responses
from gateway.apis.chat.stream import PROMPT_PARAM, collect_unless_disconnected, sse
from gateway.apis.messages import route as anthropic_route
from gateway.apis.responses import route as responses_route
from gateway.apis.responses.store import ResponseStore
from gateway.caller import passed_through
from gateway.config import GatewayConfig
from gateway.direct import Workers, open_direct
from gateway.generation import Target
from gateway.metrics import HttpMetrics, MetricsMiddleware
from gateway.reply import errors
from gateway.reply.errors import HttpError, from_grpc, from_param_error
from gateway.request import tokenize
from gateway.request.translate import Kind, ParamError, ParsedRequest, parse_request
from gateway.request_metrics import (
    NOT_REPORTED,
    REQUEST_HEADER,
    GenAiHistograms,
    Reporting,
    asked,
)
from gateway.upstream import StreamBroken, Upstream
from ortserve.process import tracing
from ortserve.process.metrics import new_registry
from ortserve.rpc.tls import channel_credentials

log = structlog.get_logger("ortserve.gateway")


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
    # The GenAI semantic-convention histograms beside the gateway's own, one registry.
    reporting = Reporting(config.per_request_metrics, GenAiHistograms(metrics.registry))
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
                               config.reasoning_parser, reporting, config.model_server_worker_id)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _generate("completion", request, upstream, workers,
                               config.stream_interval_ms, reporting=reporting,
                               prefer_worker=config.model_server_worker_id)

    @app.post("/v1/responses")
    async def create_response(request: Request):
        return await responses_route.create(request, _target(request), stored,
                                            config.reasoning_parser)

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request):
        return await responses_route.get(stored, _target(request), response_id)

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str, request: Request):
        return await responses_route.delete(stored, _target(request), response_id)

    @app.post("/v1/messages")
    async def create_message(request: Request):
        # Anthropic's SDKs send their key as x-api-key; errors answer in Anthropic's shape.
        return await anthropic_route.create(
            request, Target(upstream, workers, passed_through(request, "x-api-key"),
                   config.stream_interval_ms),
            config.reasoning_parser)

    @app.post("/v1/messages/count_tokens")
    async def count_message_tokens(request: Request):
        return await anthropic_route.count_tokens(
            request, Target(upstream, workers, passed_through(request, "x-api-key"),
                   config.stream_interval_ms))

    def _target(request: Request) -> Target:
        return Target(upstream, workers, passed_through(request), config.stream_interval_ms)

    @app.post("/tokenize")
    async def tokenize_route(request: Request):
        # vLLM's shape; counted by a worker of the model, as Generate would count it.
        parsed = _parsed(tokenize.tokenize_request, await _json_body(request))
        await _call(upstream.resolve_adapter(parsed, passed_through(request)))
        answer = await _call(upstream.tokenize(parsed, passed_through(request)),
                             "messages" if parsed.WhichOneof("prompt") == "chat" else "prompt")
        return tokenize.tokenize_response(answer)

    @app.post("/detokenize")
    async def detokenize_route(request: Request):
        parsed = _parsed(tokenize.detokenize_request, await _json_body(request))
        answer = await _call(upstream.detokenize(parsed, passed_through(request)), "tokens")
        return tokenize.detokenize_response(answer)

    @app.get("/v1/models")
    async def models(request: Request):
        # Every model the scheduler's workers serve: the names a request's `model` takes.
        served = await _call(upstream.models(passed_through(request)))
        # Each LoRA adapter too, its base as `parent` (as vLLM lists --lora-modules).
        return {"object": "list", "data": [
            *({"id": m.model, "object": "model", "created": 0, "owned_by": "ortserve",
               "root": m.model, "parent": None,
               "ortserve": {"workers": m.workers, "context_length": m.context_length,
                            "capacity_bytes": m.capacity_bytes,
                            "available_bytes": m.available_bytes}}
              for m in served),
            *({"id": name, "object": "model", "created": 0, "owned_by": "ortserve",
               "root": name, "parent": m.model,
               "ortserve": {"adapter_of": m.model, "context_length": m.context_length}}
              for m in served for name in m.adapters)]}

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
        # workers' are on their --metrics-port. In front of one worker, its model-server
        # gauges too, read now: a picker must never route on a stale figure, so when the
        # scheduler does not answer they are left out (the picker then sees none).
        if not config.model_server_worker_id:
            return metrics.response()
        try:
            budget = await upstream.budget()
        except grpc.RpcError as error:
            log.warning("model-server gauges left out: GetBudget failed",
                        code=error.code().name, details=error.details())
            budget = None
        return metrics.response(budget, config.model_server_worker_id)

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
                    stream_interval_ms: int = 0, reasoning_parser: str = "auto",
                    reporting: Reporting = NOT_REPORTED, prefer_worker: str = ""):
    parsed = replace(_parse(kind, await _json_body(request)), reasoning_mode=reasoning_parser)
    clock = reporting.clock(kind, parsed.model)  # the histograms count from the arrival
    body_metrics = asked(reporting.per_request_metrics, request.headers.get(REQUEST_HEADER))
    # NOTE: no local check of `model`: the scheduler resolves it against what its
    # workers serve now (an unknown one is its NOT_FOUND, a 404 here) and places
    # the request only on that model's workers.
    meta = responses.ChatReplyMeta.new(kind, parsed.model)
    metadata = passed_through(request)
    # n choices: n Generate calls, each admitted on its own (gateway/apis/chat/n_choices.py).
    requests = [parsed.choice_request(i, meta.id if i == 0 else f"{meta.id}-{i}")
                for i in range(parsed.n)]
    try:  # `model` naming a LoRA adapter: its base, with that adapter
        for r in requests:
            await upstream.resolve_adapter(r, metadata)
    except grpc.RpcError as error:
        raise from_grpc(error, PROMPT_PARAM[kind], kind) from None
    for r in requests:  # the request's own, else the gateway's --stream-interval-ms
        r.stream_interval_ms = (parsed.stream_interval_ms if parsed.stream_interval_ms is not None
                                else stream_interval_ms)
        # In front of one worker (--model-server-worker-id): the placement hint that makes
        # an endpoint picker's choice of this pod the worker that serves, when it fits.
        r.preferred_worker_id = prefer_worker
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
        raise from_grpc(error, PROMPT_PARAM[kind], kind) from None
    except StreamBroken as error:
        raise HttpError(502, str(error), "server_error", "bad_upstream_stream") from None
    admissions = [s.admission for s in streams]
    adm = admissions[0]
    # The model that answers, as resolved; under an adapter its name, as vLLM answers.
    meta = replace(meta, model=requests[0].adapter or adm.model or meta.model)
    headers = {**responses.choices_headers(admissions), "x-request-id": meta.id}
    log.info("admitted", request_id=meta.id, lease_id=adm.lease_id, worker_id=adm.worker_id,
             model=meta.model, decision=headers[responses.DECISION_HEADER],
             stream=parsed.stream, choices=len(streams))
    if parsed.stream:
        return EventSourceResponse(sse(meta, parsed, streams, clock, body_metrics),
                                   headers=headers, sep="\n", ping=15)
    body = await collect_unless_disconnected(request, meta, parsed, streams, clock, body_metrics)
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
