"""The FastAPI app: the router built from the route table (routes.py), the channels
opened and closed with it, and one renderer for errors. Each API's handler is in
gateway/apis/<api>/route.py, every one over generation.py; handlers raise HttpError."""

from __future__ import annotations

from contextlib import asynccontextmanager

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.apis.responses.store import ResponseStore
from gateway.config import GatewayConfig
from gateway.direct import Workers
from gateway.metrics import HttpMetrics, MetricsMiddleware
from gateway.reply import errors
from gateway.reply.errors import HttpError
from gateway.request_metrics import GenAiHistograms, Reporting
from gateway.routes import ROUTES, Route, served
from gateway.state import GatewayState
from gateway.upstream import Upstream
from ortserve.process import tracing
from ortserve.process.metrics import new_registry
from ortserve.rpc.tls import channel_credentials

log = structlog.get_logger("ortserve.gateway")


def build_app(config: GatewayConfig) -> FastAPI:
    metrics = HttpMetrics(new_registry())
    # The GenAI semantic-convention histograms beside the gateway's own, one registry.
    state = GatewayState(config, ResponseStore(config.responses_max, config.responses_ttl_s),
                         metrics, Reporting(config.per_request_metrics,
                                            GenAiHistograms(metrics.registry)))
    errors.SCHEDULER["address"] = config.scheduler_address  # named when it cannot be reached

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # NOTE: the grpc.aio channel is bound to the event loop that creates it, so
        # it is opened here (on uvicorn's loop), not in build_app.
        credentials = channel_credentials(config.scheduler_cacert) if config.scheduler_cacert else None
        state.upstream = Upstream(config.scheduler_address, config.request_timeout_s,
                                  config.models_cache_s, credentials)
        if config.direct_to_workers is not False:
            state.workers = Workers(channel_credentials(config.worker_tls_ca,
                                                        config.worker_tls_cert,
                                                        config.worker_tls_key)
                                    if config.worker_tls_ca else None,
                                    relay_if_unreachable=config.direct_to_workers is None)
        yield
        if state.workers is not None:
            await state.workers.close()
        await state.upstream.close()

    app = FastAPI(title="ortserve gateway", lifespan=lifespan)
    app.state.tenant_header = config.tenant_header
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

    for route in ROUTES:
        app.add_api_route(route.path, _endpoint(route, state), methods=[route.method],
                          name=f"{route.method} {route.path}")
    return app


def _endpoint(route: Route, state: GatewayState):
    async def endpoint(request: Request):
        return await route.handler(request, state)
    return endpoint


def unrouted(method: str, path: str, error: StarletteHTTPException) -> HttpError:
    """404 / 405 (and any other routing refusal) as an OpenAI error object."""
    if error.status_code == 404:
        return HttpError(404, f"Invalid URL ({method} {path}): the gateway serves {served()}",
                         "invalid_request_error", "unknown_url")
    if error.status_code == 405:
        allowed = (error.headers or {}).get("allow", "")
        return HttpError(405, f"{method} is not allowed on {path} (allowed: {allowed}); the "
                         f"gateway serves {served()}", "invalid_request_error",
                         "method_not_allowed")
    return HttpError(error.status_code, str(error.detail), "invalid_request_error",
                     f"http_{error.status_code}")
