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
from scheduler_service.sessions.registry import Session, SessionRegistry

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
