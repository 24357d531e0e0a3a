"""What every route handler is given: the gateway's configuration and what it holds open
(the scheduler's channel, the workers' channels, the stored responses, the reporting)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from gateway.apis.responses.store import ResponseStore
from gateway.caller import passed_through
from gateway.config import GatewayConfig
from gateway.direct import Workers
from gateway.generation import Target
from gateway.metrics import HttpMetrics
from gateway.request_metrics import Reporting
from gateway.upstream import Upstream


@dataclass
class GatewayState:
    config: GatewayConfig
    stored: ResponseStore
    metrics: HttpMetrics
    reporting: Reporting
    # Opened in the app's lifespan, on uvicorn's loop (a grpc.aio channel is bound to the
    # loop that creates it).
    upstream: Upstream | None = None
    workers: Workers | None = None  # the direct path's channels (--direct-to-workers)

    def target(self, request: Request, api_key_header: str = "") -> Target:
        """Where this request's calls go, with the caller's key and tenant."""
        return Target(self.upstream, self.workers, passed_through(request, api_key_header),
                      self.config.stream_interval_ms, self.config.model_server_worker_id)
