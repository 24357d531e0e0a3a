"""A session's life on the worker: open (claim its lease) -> turns -> swap out -> close (release).

One lease per session, claimed once at open and reported live in every
heartbeat while the session is open. The order of every step keeps the
ledger honest (DESIGN.md, "The budget"): the worker frees KV first and only
then shrinks or releases the lease, so the scheduler never offers bytes this
worker still holds. Turns go through LeaseLifecycle.open (lease_lifecycle.py)
with the session's id.
"""

from __future__ import annotations

import time

import grpc
import structlog

from ortserve.errors import quoted
from ortserve.v1 import types_pb2
from worker_service.core.errors import InvalidRequest, NoLiveLease, SchedulerUnreachable
from worker_service.lease_lifecycle import LeaseLifecycle
from worker_service.runtime.session_kv import (
    SessionBusy,
    SessionInfo,
    SessionNotFound,
    SessionState,
)

log = structlog.get_logger("worker")

_STATE = {
    SessionState.EMPTY: types_pb2.SESSION_EMPTY,
    SessionState.BUSY: types_pb2.SESSION_BUSY,
    SessionState.RESIDENT: types_pb2.SESSION_RESIDENT,
    SessionState.SWAPPED: types_pb2.SESSION_SWAPPED,
}


class WorkerSessions:
    """The worker's session RPCs, over the engine's session table and the scheduler link."""

    def __init__(self, leases: LeaseLifecycle, address: str) -> None:
        self.leases = leases
        self.address = address
        self._opened_at: dict[str, float] = {}

    def _lease(self, session_id: str) -> types_pb2.Lease:
        if not session_id:
            raise InvalidRequest("session_id", "session_id is empty: use the id OpenSession gave")
        lease = self.leases.session_leases.get(session_id)
        if lease is None:
            raise SessionNotFound(session_id)
        return lease

    def _idle(self, session_id: str, doing: str) -> types_pb2.Lease:
        lease = self._lease(session_id)
        if lease.lease_id in self.leases._busy:
            raise SessionBusy(session_id, doing)  # a turn is opening, running or shrinking
        return lease

    def info_pb(self, session_id: str, info: SessionInfo | None = None) -> types_pb2.SessionInfo:
        lease = self._lease(session_id)
        info = info or self.leases.engine.session_info(session_id)
        pb = types_pb2.SessionInfo(
            session_id=session_id, worker_id=self.leases.worker_id, worker_address=self.address,
            state=_STATE[info.state], held_tokens=info.held_tokens, held_bytes=info.charged_bytes,
            swapped_bytes=info.swapped_bytes, turns=info.turns, lease_id=lease.lease_id,
            turn_in_flight=lease.lease_id in self.leases._busy,
            idle_s=time.monotonic() - self._opened_at.get(session_id, time.monotonic()))
        if lease.HasField("budget_cap"):
            pb.last_budget_cap.CopyFrom(lease.budget_cap)
        return pb

    async def open(self, session_id: str, lease_id: str) -> types_pb2.SessionInfo:
        """Claim the session's (0-byte) lease and open an empty session in the engine."""
        if not session_id or not lease_id:
            raise InvalidRequest("session_id" if not session_id else "lease_id",
                                 "OpenSession needs the session id and its lease id")
        if session_id in self.leases.session_leases:
            return self.info_pb(session_id)  # a retried open
        # The engine first (it refuses a layout without sessions): a claimed lease must
        # never be left behind by a failed open.
        self.leases.engine.open_session(session_id)
        try:
            lease = await self.leases.link.claim(lease_id)
        except grpc.aio.AioRpcError as error:
            self.leases.engine.close_session(session_id)
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise NoLiveLease(lease_id, self.leases.worker_id, error.details() or "") from error
            raise SchedulerUnreachable(f"worker {self.leases.worker_id} could not claim session "
                                       f"lease {quoted(lease_id)}: {error.details()}") from error
        self.leases.session_leases[session_id] = lease
        self._opened_at[session_id] = time.monotonic()
        log.info("session opened", session_id=session_id, lease_id=lease_id,
                 worker_id=self.leases.worker_id)
        return self.info_pb(session_id)

    def turn_ended(self, session_id: str) -> None:
        self._opened_at[session_id] = time.monotonic()  # idle_s counts from here

    async def swap_out(self, session_id: str) -> types_pb2.SessionInfo:
        """Free the session's KV charge (copy kept in host memory or dropped), then shrink."""
        lease = self._idle(session_id, "swapping it out")
        freed = self.leases.engine.swap_out_session(session_id)
        await self.leases.link.shrink(lease.lease_id, 0)
        info = self.leases.engine.session_info(session_id)
        log.info("session swapped out", session_id=session_id, lease_id=lease.lease_id,
                 freed_bytes=freed, state=info.state.value, swapped_bytes=info.swapped_bytes)
        return self.info_pb(session_id, info)

    async def drop_all(self) -> None:
        """Before re-registering: the scheduler no longer knows these sessions (it restarted,
        or declared them lost with this worker), so nobody can use or close them. Free them,
        and leave their leases out of the registration; a session mid-turn goes at its end."""
        for session_id, lease in list(self.leases.session_leases.items()):
            if lease.lease_id in self.leases._busy:
                self.leases.orphaned.add(session_id)
                continue
            freed = self.leases.engine.close_session(session_id)
            del self.leases.session_leases[session_id]
            self._opened_at.pop(session_id, None)
            log.warning("session dropped: the scheduler forgot this worker", session_id=session_id,
                        lease_id=lease.lease_id, freed_bytes=freed)

    async def close(self, session_id: str) -> types_pb2.SessionInfo:
        """Free everything the session holds, then release its lease once."""
        lease = self._idle(session_id, "closing it")
        pb = self.info_pb(session_id)
        freed = self.leases.engine.close_session(session_id)
        del self.leases.session_leases[session_id]
        self._opened_at.pop(session_id, None)
        released = await self.leases.link.release(lease.lease_id)
        log.info("session closed", session_id=session_id, lease_id=lease.lease_id,
                 freed_bytes=freed, released_bytes=released)
        pb.state, pb.held_tokens, pb.held_bytes, pb.swapped_bytes = types_pb2.SESSION_EMPTY, 0, 0, 0
        return pb
