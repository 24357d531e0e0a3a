"""What the session parts share: their state (the ledger, the registry, the workers' stubs)
and their calls to a session's worker.

One SharedSessionState is held by the reclaimer (reclaim.py), the turn relay (turn.py) and
the RPC surface (rpcs.py); build.py makes the four and hands them to the servicer by name.
(Every session's, not one session's: worker_service's SessionState is one session's KV.)
"""

from __future__ import annotations

import grpc
import structlog

from ortserve.rpc.error_path import Relayed
from ortserve.status.errors import DomainError, clip
from ortserve.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from scheduler_service import convert
from scheduler_service.config import SchedulerConfig
from scheduler_service.decision_log import log_expired
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.sessions.registry import (
    Session,
    SessionRegistry,
    not_found,
    worker_lost,
)
from scheduler_service.tenant_of import caller_tenant
from scheduler_service.worker_clients import WorkerClients

log = structlog.get_logger("scheduler")


class SharedSessionState:
    """The session parts' state and their calls to a session's worker."""

    def __init__(self, config: SchedulerConfig, ledger: Ledger, workers: WorkerClients,
                 registry: SessionRegistry | None = None, metrics=None) -> None:
        self.config = config
        self.ledger = ledger
        self.workers = workers
        self.registry = registry if registry is not None else SessionRegistry()  # len() 0 is falsy
        self.metrics = metrics  # SchedulerMetrics when --metrics-port is set

    def worker(self, session: Session) -> worker_pb2_grpc.WorkerStub:
        return self.workers.stub(session.address)

    def owned(self, session_id: str, context) -> None:
        """A session answers only the tenant it is charged to (its lease's, which a
        restored lease keeps); to another tenant it does not exist (SESSION_NOT_FOUND,
        saying nothing of whose it is). Without tenants every caller is ""."""
        session = self.registry.get(session_id)  # SESSION_NOT_FOUND when not open
        lease = self.ledger.lease(session.lease_id)
        if lease is not None and lease.tenant != caller_tenant(self.ledger.tenants, context):
            raise not_found(session_id)

    def alive(self, session: Session) -> None:
        """The session's lease lives only while its worker does: gone means the worker died."""
        log_expired(self.ledger.expire(), self.metrics)  # expire() hands each lease once
        if self.ledger.lease(session.lease_id) is None:
            raise self.registry.mark_lost(session, "stopped heartbeating (its leases expired)")

    def info_pb(self, session: Session, worker: types_pb2.SessionInfo | None) -> types_pb2.SessionInfo:
        lease = self.ledger.lease(session.lease_id)
        geometry = self.ledger.geometry(session.worker_id)
        return convert.session_info_to_pb(
            session, worker, reserved_bytes=lease.reserved_bytes if lease else 0,
            model=geometry.model if geometry else "",  # its worker's: the one it is bound to
            idle_s=0.0 if session.turn_in_flight else self.registry.idle_s(session))

    async def call_worker(self, session: Session, method: str, why: str):
        try:
            return await getattr(self.worker(session), method)(
                worker_pb2.WorkerSessionRequest(session_id=session.session_id,
                                                lease_id=session.lease_id), timeout=10.0)
        except grpc.aio.AioRpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND):
                raise worker_lost(session, f"did not answer {why} ({error.code().name}: "
                                  f"{clip(error.details(), 200)})") from None
            raise Relayed(error, f"worker {session.worker_id}: {clip(error.details(), 600)}") from None

    async def close(self, session: Session) -> None:
        """The worker frees the KV, then releases the lease (once); then the session is gone."""
        try:
            await self.call_worker(session, "CloseSession", "CloseSession")
        except DomainError as error:
            # Unreachable: the lease goes when the worker's heartbeats stop reporting it.
            log.warning("session close: worker did not answer", session_id=session.session_id,
                        error=error.message)
        finally:
            self.registry.remove(session.session_id)
        log.info("session closed", session_id=session.session_id, lease_id=session.lease_id)
