"""build_server: the scheduler's grpc.aio server with health, reflection and lease expiry."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

import grpc
import structlog
from grpc_health.v1 import health_pb2

from ortserve.process import ports
from ortserve.process.metrics import new_registry
from ortserve.process.metrics import serve as serve_metrics
from ortserve.rpc import tls
from ortserve.rpc.auth import ApiKeyInterceptor
from ortserve.rpc.error_path import register_service
from ortserve.rpc.serving import add_health_and_reflection, new_server, set_serving
from ortserve.v1 import internal_pb2, scheduler_pb2
from scheduler_service.config import SchedulerConfig
from scheduler_service.decision_log import log_decided, log_expired
from scheduler_service.internal_servicer import SchedulerInternalServicer
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.ledger.queue import AdmissionQueue
from scheduler_service.ledger.time_budget import TimeGoals
from scheduler_service.metrics import SchedulerMetrics
from scheduler_service.queue_wait import QueueWaiter
from scheduler_service.servicer import SchedulerServicer
from scheduler_service.sessions.build import build_sessions
from scheduler_service.sessions.registry import SessionRegistry
from scheduler_service.worker_clients import WorkerClients

log = structlog.get_logger("scheduler")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"]
SERVICE_NAME = SERVICE.full_name
INTERNAL_SERVICE = internal_pb2.DESCRIPTOR.services_by_name["SchedulerInternal"]


@dataclass
class SchedulerServer:
    server: grpc.aio.Server
    port: int
    ledger: Ledger
    queue: AdmissionQueue
    _expiry: asyncio.Task
    _workers: WorkerClients
    _session_sweep: asyncio.Task | None = None
    internal_server: grpc.aio.Server | None = None
    internal_port: int = 0
    health: object = None
    metrics_port: int | None = None
    _stop_metrics: object = None
    kick: object = None  # serve the admission queue now (after a tenants reload)

    async def stop(self, grace_s: float = 2.0) -> None:
        """NOT_SERVING, refuse new calls, let relayed streams finish within grace_s."""
        for task in (self._expiry, self._session_sweep):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.health is not None:
            await set_serving(self.health, [SERVICE_NAME], False)
        await self.server.stop(grace_s)
        if self.internal_server is not None:
            # After the public port: relayed streams' workers still release their leases.
            await self.internal_server.stop(grace_s)
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
    ledger.set_tenants(config.tenants)
    ledger.time_goals = TimeGoals(config.max_itl_ms, config.max_ttft_ms)
    queue = AdmissionQueue(ledger, max_length=config.max_queue_length,
                           max_wait_s=config.max_queue_wait_s, retry_after_s=config.retry_after_s,
                           aging_s=config.queue_aging_s)
    waiter = QueueWaiter(queue, time.monotonic, on_decided=log_decided)
    metrics = stop_metrics = metrics_port = None
    if config.metrics_port is not None:
        registry = new_registry()
        metrics = SchedulerMetrics(registry, ledger, queue)
        metrics_port, stop_metrics = serve_metrics(registry, config.host, config.metrics_port)
        log.info("metrics serving", address=f"{config.host}:{metrics_port}", path="/metrics")
    files = config.tls
    files.check("ortserve-scheduler", need_ca=True)  # the internal port is mutual TLS
    workers = WorkerClients(tls.channel_credentials(files.ca, files.cert, files.key)
                            if files.enabled else None, shared_relay=config.relay_calls == "shared",
                            keepalive_s=config.worker_keepalive_s)
    if not config.api_keys.enabled and not tls.is_loopback(config.host):
        log.warning("NO API KEYS: anyone who reaches this port may generate and read the "
                    "ledger; give --api-keys-file (or ORTSERVE_SCHEDULER_API_KEYS)",
                    address=f"{config.host}:{config.port}")
    server = new_server([ApiKeyInterceptor(config.api_keys)])
    session_registry = SessionRegistry()  # the session RPCs' and registration's (restored)
    sessions = build_sessions(config, ledger, workers, waiter, registry=session_registry,
                              metrics=metrics)
    register_service(server, SERVICE,
                     SchedulerServicer(config, ledger, workers, waiter, sessions, metrics))
    health = add_health_and_reflection(server, [SERVICE_NAME])
    port = ports.bind_grpc(
        lambda: tls.bind(server, f"{config.host}:{config.port}", files, False, "public"),
        config.host, config.port, "--port")
    # NOTE: a server of its own, not a second port on the same one: a grpc server
    # serves every service on every port, and the point is that the public port
    # has no worker RPCs at all.
    internal = new_server()
    register_service(internal, INTERNAL_SERVICE,
                     SchedulerInternalServicer(config, ledger, workers, waiter.kick, metrics,
                                               sessions=session_registry))
    internal_port = ports.bind_grpc(
        lambda: tls.bind(internal, f"{config.host}:{config.internal_port}", files, True,
                         "internal"),
        config.host, config.internal_port, "--internal-port")
    await internal.start()
    await server.start()
    await set_serving(health, [], True)
    await health.set(SERVICE_NAME, NOT_SERVING)
    expiry = asyncio.create_task(_maintain_forever(ledger, waiter, health, metrics,
                                                   config.expiry_interval_s))
    session_sweep = asyncio.create_task(sessions.reclaimer.sweep_forever())
    log.info("scheduler serving", address=f"{config.host}:{port}",
             internal_address=f"{config.host}:{internal_port}", tls=files.enabled,
             api_keys=len(config.api_keys), lease_ttl_s=config.lease_ttl_s,
             max_queue_length=config.max_queue_length, max_queue_wait_s=config.max_queue_wait_s,
             tenants=len(config.tenants.tenants), tenants_file=config.tenants_file or None,
             default_max_new_tokens=config.default_max_new_tokens.describe())
    return SchedulerServer(server=server, port=port, ledger=ledger, queue=queue, _expiry=expiry,
                           _workers=workers, _session_sweep=session_sweep, internal_server=internal,
                           internal_port=internal_port, health=health, metrics_port=metrics_port,
                           _stop_metrics=stop_metrics, kick=waiter.kick)
