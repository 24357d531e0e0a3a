"""The DomainErrors the ledger and its worker-facing RPCs raise: misuse, never a full budget.

Running out of budget is a returned Rejection (its text in sentences.py);
these are the refusals of a wrong call. Each names the cause, the numbers and a
next step; caller strings (lease ids, worker ids, addresses) are echoed
clipped, never whole. The queue's one error (its deadline passing) is beside
its Ticket in queue.py.
"""

from __future__ import annotations

from ortserve.errors import DomainError, ErrorReason, quoted
from ortserve.units import human_bytes


def lease_claimed(lease_id: str, worker_id: str, reserved_bytes: int) -> DomainError:
    return DomainError(
        ErrorReason.LEASE_CLAIMED,
        f"lease {quoted(lease_id)} is being served by worker {quoted(worker_id)}, which holds its "
        f"{human_bytes(reserved_bytes)} of KV; only that worker releases it, once the buffer is "
        "freed: to stop the request, cancel its Generate stream (the worker then frees and "
        "releases the lease)",
        metadata={"lease_id": lease_id, "worker_id": worker_id, "reserved_bytes": reserved_bytes})


def lease_not_live(lease_id: str, worker_id: str, claim_ttl_s: float) -> DomainError:
    return DomainError(
        ErrorReason.LEASE_NOT_FOUND,
        f"lease {quoted(lease_id)} is not live for worker {quoted(worker_id)}: it was released, "
        f"expired (unclaimed for {claim_ttl_s:g} s, or its worker stopped heartbeating) or "
        "belongs to another worker; get a new lease from Scheduler.Admit, or call "
        "Scheduler.Generate", metadata={"lease_id": lease_id, "worker_id": worker_id})


def worker_id_in_use(worker_id: str, live_address: str, new_address: str,
                     heartbeat_age_s: float, lease_ttl_s: float) -> DomainError:
    return DomainError(
        ErrorReason.WORKER_ID_IN_USE,
        f"worker id {quoted(worker_id)} is in use by a live worker at {quoted(live_address)} "
        f"(last heartbeat {heartbeat_age_s:.1f} s ago); refusing the registration from "
        f"{quoted(new_address)}: start it with another --worker-id, or stop the other one "
        f"(its id frees {lease_ttl_s:g} s after its last heartbeat)",
        metadata={"worker_id": worker_id, "live_address": live_address,
                  "new_address": new_address, "heartbeat_age_s": round(heartbeat_age_s, 3)})
