"""The worker's open sessions' leases: which lease each session holds across its turns,
which sessions go when their running turn ends, and what a turn's end does to the lease.

A session's lease is claimed at OpenSession (session_lifecycle.py) and kept
across turns; each turn runs under it through LeaseLifecycle.open. When a turn
ends, the lease shrinks to what the session still holds; a session the
scheduler did not keep (orphaned while its turn ran) is freed, then its lease
released.
"""

from __future__ import annotations

from typing import Any, Protocol

from ortserve.status.errors import quoted
from ortserve.v1 import types_pb2
from worker_service.core.errors import LeaseMismatch
from worker_service.engine.engine import Engine
from worker_service.runtime.session_kv import SessionBusy, SessionNotFound
from worker_service.scheduler_link import SchedulerLink


class TurnStream(Protocol):
    """What a turn's end needs of its stream (lease_lifecycle.LeaseStream)."""

    session_id: str
    lease: types_pb2.Lease
    log: Any  # the stream's bound logger

    async def shrink(self) -> None: ...


class SessionLeaseTable:
    """Session id -> its lease, and the sessions to drop when their running turn ends."""

    def __init__(self, engine: Engine, link: SchedulerLink) -> None:
        self.engine = engine
        self.link = link
        # session id -> its lease: claimed at OpenSession, kept across turns (session_lifecycle).
        self.leases: dict[str, types_pb2.Lease] = {}
        self.orphaned: set[str] = set()  # sessions to drop when their running turn ends

    def check_turn(self, session_id: str, lease_id: str, busy: bool) -> None:
        """A turn of `session_id` under `lease_id` may start; raises SessionNotFound,
        LeaseMismatch (not the session's lease) or SessionBusy (`busy`: a turn holds it)."""
        session_lease = self.leases.get(session_id)
        if session_lease is None:
            raise SessionNotFound(session_id)
        if session_lease.lease_id != lease_id:
            raise LeaseMismatch("lease_id", f"lease {quoted(lease_id)} is not session "
                                f"{quoted(session_id)}'s lease", lease_id)
        if busy:
            raise SessionBusy(session_id)

    async def end_turn(self, stream: TurnStream) -> None:
        """A turn's stream closed (its KV freed): drop the session if the scheduler did not
        keep it, else shrink its lease to what the session holds."""
        if stream.session_id in self.orphaned:
            self.orphaned.discard(stream.session_id)
            self.leases.pop(stream.session_id, None)
            self.engine.close_session(stream.session_id)
            # Freed first; then its lease, if the ledger still holds it (0 if not).
            released = await self.link.release(stream.lease.lease_id)
            stream.log.warning("session dropped after its turn: the scheduler did not keep it",
                               released_bytes=released)
        else:
            await stream.shrink()

    async def shrink_to_held(self, session_id: str, lease_id: str, log) -> None:
        """Shrink the session's lease to what the engine's session holds now."""
        info = self.engine.session_info(session_id)
        held = info.held_tokens if info.charged_bytes else 0
        host_bytes, disk_bytes = self.engine.session_turns.tier_bytes().get(session_id, (0, 0))
        shrunk = await self.link.shrink(lease_id, held, host_bytes, disk_bytes)
        if shrunk is not None and session_id in self.leases:
            # What a re-registration reports: the bytes the ledger holds for it now.
            self.leases[session_id] = shrunk
        log.info("session lease shrunk", held_tokens=held, held_bytes=info.charged_bytes)
