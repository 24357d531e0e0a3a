"""build_server: the scheduler's grpc.aio server with health, reflection and lease expiry."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health_pb2

from ortserve.error_path import register_service
from ortserve.metrics import new_registry
from ortserve.metrics import serve as serve_metrics
from ortserve.serving import add_health_and_reflection, set_serving
from ortserve.v1 import scheduler_pb2

from .admission_queue import AdmissionQueue
from .budget import Ledger
from .config import SchedulerConfig
from .errors import STATUS_OF_REASON
from .metrics import SchedulerMetrics
from .queue_waiter import QueueWaiter
from .servicer import SchedulerServicer, log_decided, log_expired
from .worker_clients import WorkerClients

log = structlog.get_logger("scheduler")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]
SERVICE_NAME = SERVICE.full_name


@dataclass
class SchedulerServer:
    server: grpc.aio.Server
    port: int
    ledger: Ledger
    queue: AdmissionQueue
    _expiry: asyncio.Task
    _workers: WorkerClients
    health: object = None
    metrics_port: int | None = None
    _stop_metrics: object = None

    async def stop(self, grace_s: float = 2.0) -> None:
        """NOT_SERVING, refuse new calls, let relayed streams finish within grace_s."""
        self._expiry.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._expiry
        if self.health is not None:
            await set_serving(self.health, [SERVICE_NAME], False)
        await self.server.stop(grace_s)
        await self._workers.close()
        if self._stop_metrics is not None:
            self._stop_metrics()


async def _maintain_forever(ledger: Ledger, waiter: QueueWaiter, health, metrics,
                            interval_s: float) -> None:
    """Expire silent workers and stale leases; keep readiness true to the ledger."""
    ready = None
    while True:
        log_expired(ledger.expire(), metrics)
        waiter.kick()  # expired leases free bytes; waits may have run out
        # Readiness: the Scheduler service is SERVING only with a worker to place on
        # (the overall "" status stays SERVING: the process is alive).
        now_ready = any(not w.draining for w in ledger.snapshot())
        if now_ready != ready:
            await health.set(SERVICE_NAME, SERVING if now_ready else NOT_SERVING)
            ready = now_ready
        await asyncio.sleep(interval_s)


async def build_server(config: SchedulerConfig, ledger: Ledger | None = None) -> SchedulerServer:
    """Create, bind and start the scheduler. Port 0 picks a free one (see .port)."""
    ledger = ledger or Ledger(lease_ttl_s=config.lease_ttl_s, claim_ttl_s=config.claim_ttl_s,
                              retry_after_s=config.retry_after_s)
    queue = AdmissionQueue(ledger, max_length=config.max_queue_length,
                           max_wait_s=config.max_queue_wait_s, retry_after_s=config.retry_after_s)
    waiter = QueueWaiter(queue, time.monotonic, on_decided=log_decided)
    metrics = stop_metrics = metrics_port = None
    if config.metrics_port is not None:
        registry = new_registry()
        metrics = SchedulerMetrics(registry, ledger, queue)
        metrics_port, stop_metrics = serve_metrics(registry, config.host, config.metrics_port)
        log.info("metrics serving", address=f"{config.host}:{metrics_port}", path="/metrics")
    workers = WorkerClients()
    server = grpc.aio.server()
    register_service(server, SERVICE, SchedulerServicer(config, ledger, workers, waiter, metrics),
                     STATUS_OF_REASON)
    health = add_health_and_reflection(server, [SERVICE_NAME])
    port = server.add_insecure_port(f"{config.host}:{config.port}")
    if port == 0:
        raise OSError(f"could not bind {config.host}:{config.port}: is the port in use? "
                      "pick another with --port")
    await server.start()
    await set_serving(health, [], True)
    await health.set(SERVICE_NAME, NOT_SERVING)
    expiry = asyncio.create_task(_maintain_forever(ledger, waiter, health, metrics,
                                                   config.expiry_interval_s))
    log.info("scheduler serving", address=f"{config.host}:{port}", lease_ttl_s=config.lease_ttl_s,
             max_queue_length=config.max_queue_length, max_queue_wait_s=config.max_queue_wait_s)
    return SchedulerServer(server=server, port=port, ledger=ledger, queue=queue, _expiry=expiry,
                           _workers=workers, health=health, metrics_port=metrics_port,
                           _stop_metrics=stop_metrics)
