"""Sessions a registering worker reports (RegisterWorkerRequest.live_sessions) back into
the registry: protobuf in, registry out.

After a scheduler restart the registry is empty while the workers still hold their
sessions' KV. Each worker registers its sessions with their leases: the ledger takes
the leases back first (Ledger.register), then each session whose lease it holds for
that worker is open again here, with the conversation the worker kept (as of its last
finished turn), so the client's next turn reuses the KV. What is not restored (its
lease refused, or the session closed by a client meanwhile) the worker frees.
"""

from __future__ import annotations

import structlog

from ortserve.output import conversation
from ortserve.v1 import scheduler_pb2
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.ledger.types import Lease
from scheduler_service.sessions.registry import GONE, Session, SessionRegistry

log = structlog.get_logger("scheduler")


def restore_sessions(registry: SessionRegistry, ledger: Ledger,
                     request: scheduler_pb2.RegisterWorkerRequest) -> list[str]:
    """Reopen the worker's sessions; returns the ids of those not restored (to drop)."""
    dropped = []
    for live in request.live_sessions:
        lease = ledger.lease(live.lease_id)
        if lease is None or lease.worker_id != request.worker_id:
            dropped.append(live.session_id)  # its lease was refused (capacity): nothing holds it
            continue
        session = Session(session_id=live.session_id, worker_id=request.worker_id,
                          address=request.address, lease_id=live.lease_id, kind=live.kind,
                          messages=[conversation.message_of(m) for m in live.messages],
                          tools=tuple(conversation.tool_of(t) for t in live.tools),
                          token_ids=list(live.token_ids), turns=live.turns,
                          history_tokens=live.history_tokens, last_budget_cap=lease.budget_cap)
        if not registry.restore(session):
            dropped.append(live.session_id)
            continue
        log.info("session restored from its worker", session_id=live.session_id,
                 worker_id=request.worker_id, lease_id=live.lease_id, turns=live.turns,
                 reserved_bytes=lease.reserved_bytes)
    return dropped


# Where a session saved to disk at its worker's clean stop is: with that worker's files.
ON_DISK = ("its KV is saved in that worker's --session-dir: the session is open again once "
           "the worker starts on that folder under the same --worker-id (retry then), or open "
           "a new session and send the conversation again")


def sessions_left_with(registry: SessionRegistry, worker_id: str,
                       dropped: list[Lease]) -> tuple[int, int]:
    """A worker deregistered (a clean stop) and its leases went with it: its idle sessions
    are lost until it registers them again (restore_sessions reopens them), each saying
    whether its KV waits on that worker's disk (its lease held disk bytes) or is gone.
    Returns (sessions on disk, sessions gone). A session whose turn is in flight is left to
    that turn's end, as when its worker's leases expire."""
    leases = {lease.lease_id: lease for lease in dropped}
    on_disk = gone = 0
    for session in registry.idle_on(worker_id):
        lease = leases.get(session.lease_id)
        if lease is None:
            continue
        saved = lease.disk_bytes > 0
        registry.mark_lost(session, "stopped (a clean stop)", ON_DISK if saved else GONE)
        on_disk, gone = on_disk + saved, gone + (not saved)
        log.info("session left with its worker", session_id=session.session_id,
                 worker_id=worker_id, on_disk=saved, disk_bytes=lease.disk_bytes)
    return on_disk, gone
