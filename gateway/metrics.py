"""The gateway's own Prometheus metrics, served at /metrics on its HTTP port.

One pure ASGI middleware counts every HTTP request by route, method and status,
times it to its last byte (a streamed answer's whole stream) and keeps the
in-flight gauge. The route is the path template (/v1/chat/completions), never
the raw path, so a scan of random URLs adds one series ("unmatched"), not one
per URL. The names the scheduler's metrics mirror are in docs/operations/operations.md.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ortserve.process import model_server_gauges
from ortserve.process.metrics import REQUEST_SECONDS_BUCKETS
from ortserve.v1 import scheduler_pb2

UNMATCHED = "unmatched"


class HttpMetrics:
    """The gateway's request counter, latency histogram and in-flight gauge."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "ortserve_gateway_requests", "HTTP requests by route template, method and status",
            ["route", "method", "status"], registry=registry)
        self.duration_seconds = Histogram(
            "ortserve_gateway_request_duration_seconds",
            "From a request's arrival to its response's last byte (a stream's end)",
            ["route", "method"], buckets=REQUEST_SECONDS_BUCKETS, registry=registry)
        self.in_flight = Gauge(
            "ortserve_gateway_requests_in_flight", "HTTP requests being answered now (open "
            "streams included)", ["route"], registry=registry)

    def response(self, budget: scheduler_pb2.Budget | None = None,
                 worker_id: str = "") -> Response:
        """The /metrics answer: this registry in the text exposition format, then, with a
        `budget` (GetBudget, read for this scrape), `worker_id`'s model-server gauges."""
        body = generate_latest(self.registry)
        if budget is not None:
            body += generate_latest(_Families(model_server_gauges.families(
                budget, worker_id, now_s=time.time())))
        return Response(body, media_type=CONTENT_TYPE_LATEST)


class _Families:
    """A collection of families rendered once (generate_latest takes anything with collect)."""

    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self):
        return self._families


class MetricsMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware, which buffers nothing but breaks cancellation
    of streamed responses): sees the status as it is sent and the end as the app returns."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics, routes: list[BaseRoute]) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = routes  # the app's router's list: routes added later are seen too

    def _route(self, scope: Scope) -> str:
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is not Match.NONE:  # PARTIAL: the path matched, the method did not (405)
                return getattr(route, "path", UNMATCHED)
        return UNMATCHED

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route, method = self._route(scope), scope["method"]
        status = 500  # what the server answers if the app raises before a response starts
        started = time.perf_counter()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        in_flight = self.metrics.in_flight.labels(route)
        in_flight.inc()
        try:
            await self.app(scope, receive, sending)
        finally:
            in_flight.dec()
            self.metrics.requests.labels(route, method, str(status)).inc()
            self.metrics.duration_seconds.labels(route, method).observe(
                time.perf_counter() - started)
