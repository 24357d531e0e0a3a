"""The routes that generate nothing: vLLM's /tokenize and /detokenize, /v1/models,
/health and /metrics."""

from __future__ import annotations

import grpc
import structlog
from fastapi import Request
from fastapi.responses import JSONResponse

from gateway.generation import json_body
from gateway.reply.errors import HttpError, from_grpc, from_param_error
from gateway.request import tokenize
from gateway.request.param_error import ParamError
from gateway.state import GatewayState

log = structlog.get_logger("ortserve.gateway")


async def tokenize_route(request: Request, state: GatewayState):
    # vLLM's shape; counted by a worker of the model, as Generate would count it.
    parsed = _parsed(tokenize.tokenize_request, await json_body(request))
    target = state.target(request)
    await _call(state.upstream.resolve_adapter(parsed, target.metadata))
    answer = await _call(state.upstream.tokenize(parsed, target.metadata),
                         "messages" if parsed.WhichOneof("prompt") == "chat" else "prompt")
    return tokenize.tokenize_response(answer)


async def detokenize_route(request: Request, state: GatewayState):
    parsed = _parsed(tokenize.detokenize_request, await json_body(request))
    answer = await _call(state.upstream.detokenize(parsed, state.target(request).metadata),
                         "tokens")
    return tokenize.detokenize_response(answer)


async def models(request: Request, state: GatewayState):
    # Every model the scheduler's workers serve: the names a request's `model` takes.
    served = await _call(state.upstream.models(state.target(request).metadata))
    return {"object": "list", "data": _model_objects(served)}


async def model(request: Request, state: GatewayState, model_id: str):
    # One of /v1/models' objects (the openai and anthropic SDKs' models.retrieve). A name
    # loaded since the cached listing (a LoRA adapter, a new worker) is asked for again
    # before it is called unknown.
    metadata = state.target(request).metadata
    for fresh in (False, True):
        objects = _model_objects(await _call(state.upstream.models(metadata, fresh=fresh)))
        for found in objects:
            if found["id"] == model_id:
                return found
    names = ", ".join(repr(found["id"]) for found in objects) or "none (no worker registered)"
    raise HttpError(404, f"model {model_id!r} is not served here: the models served are "
                    f"{names}; retrieve one of them (GET /v1/models lists them), or start a "
                    "worker with that model's folder (ortserve-worker --model-dir .../NAME: a "
                    "worker serves its folder's name)", "invalid_request_error",
                    "model_not_found", "model")


def _model_objects(served) -> list[dict]:
    """OpenAI's model objects: each served model, then each LoRA adapter with its base as
    `parent` (as vLLM lists --lora-modules)."""
    return [
        *({"id": m.model, "object": "model", "created": 0, "owned_by": "ortserve",
           "root": m.model, "parent": None,
           "ortserve": {"workers": m.workers, "context_length": m.context_length,
                        "capacity_bytes": m.capacity_bytes,
                        "available_bytes": m.available_bytes}}
          for m in served),
        *({"id": name, "object": "model", "created": 0, "owned_by": "ortserve",
           "root": name, "parent": m.model,
           "ortserve": {"adapter_of": m.model, "context_length": m.context_length}}
          for m in served for name in m.adapters)]


async def health(request: Request, state: GatewayState):
    # Ready means a request could be served now: the scheduler answers, has a
    # worker registered and is not draining. Its grpc.health status says exactly
    # that and needs no API key (the gateway holds none of its own).
    upstream = state.upstream
    body = {"scheduler": upstream.address, "tls": upstream.tls}
    if not await _call(upstream.ready()):
        return JSONResponse({**body, "status": "not_ready"}, status_code=503)
    return {**body, "status": "ok"}


async def prometheus_metrics(request: Request, state: GatewayState):
    # The gateway's own numbers (gateway/metrics.py); the scheduler's and the
    # workers' are on their --metrics-port. In front of one worker, its model-server
    # gauges too, read now: a picker must never route on a stale figure, so when the
    # scheduler does not answer they are left out (the picker then sees none).
    worker_id = state.config.model_server_worker_id
    if not worker_id:
        return state.metrics.response()
    try:
        budget = await state.upstream.budget()
    except grpc.RpcError as error:
        log.warning("model-server gauges left out: GetBudget failed",
                    code=error.code().name, details=error.details())
        budget = None
    return state.metrics.response(budget, worker_id)


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
