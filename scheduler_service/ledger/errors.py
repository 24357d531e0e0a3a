"""The DomainErrors the ledger and its worker-facing RPCs raise: misuse, never a full budget.

Running out of budget is a returned Rejection (its text in sentences.py);
these are the refusals of a wrong call. Each names the cause, the numbers and a
next step; caller strings (lease ids, worker ids, addresses) are echoed
clipped, never whole (a model name too). The queue's one error (its deadline passing) is beside
its Ticket in queue.py.
"""

from __future__ import annotations

from ortserve.status.errors import DomainError, ErrorReason, InvalidField, quoted
from ortserve.status.units import human_bytes


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


def _names(served: list[str]) -> str:
    return ", ".join(quoted(name) for name in served)


def model_not_found(requested: str, served: list[str]) -> DomainError:
    """The request names a model no registered worker serves (NOT_FOUND)."""
    return DomainError(
        ErrorReason.MODEL_NOT_FOUND,
        f"model {quoted(requested)} is not served here: the {len(served)} model(s) the "
        f"registered workers serve are {_names(served)}; set model to one of them (GetBudget's "
        "models, the gateway's /v1/models), or start a worker with that model's folder "
        "(ortserve-worker --model-dir .../NAME: a worker serves its folder's name)",
        metadata={"model": requested, "served_models": ",".join(served),
                  "served_model_count": len(served)})


def adapter_not_found(adapter: str, model: str, served: dict[str, list[str]]) -> DomainError:
    """The request names a LoRA adapter no registered worker of its model serves (NOT_FOUND,
    as an unserved model: to the caller an adapter is a model name)."""
    listed = "; ".join(f"{quoted(m)}: {_names(names) if names else 'none'}"
                       for m, names in sorted(served.items()))
    return DomainError(
        ErrorReason.MODEL_NOT_FOUND,
        f"adapter {quoted(adapter)} of model {quoted(model)} is not served here: the adapters "
        f"the registered workers serve, per model, are {listed}; name one of them (GetBudget's "
        "models[].adapters, the gateway's /v1/models), leave adapter empty for the base, or "
        "load it (Scheduler.LoadAdapter, or the worker's --lora NAME=PATH)",
        field="adapter",
        metadata={"adapter": adapter, "model": model,
                  "served_adapters": ",".join(served.get(model, []))})


def adapter_no_room(worker_id: str, adapter: str, adapter_bytes: int, capacity_bytes: int,
                    reserved_bytes: int, what: str) -> DomainError:
    """Loading an adapter would shrink a worker's capacity below what its KV holds now."""
    return DomainError(
        ErrorReason.ADAPTER_NO_ROOM,
        f"adapter {quoted(adapter)} needs {human_bytes(adapter_bytes)} ({adapter_bytes:,} bytes) "
        f"of worker {quoted(worker_id)}'s {human_bytes(capacity_bytes)} capacity, but "
        f"{what} holds {human_bytes(reserved_bytes)} ({reserved_bytes:,} bytes): only "
        f"{human_bytes(max(capacity_bytes - reserved_bytes, 0))} is free; retry when requests "
        "finish, unload another adapter, or raise the worker's --kv-capacity",
        metadata={"worker_id": worker_id, "adapter": adapter, "adapter_bytes": adapter_bytes,
                  "capacity_bytes": capacity_bytes, "reserved_bytes": reserved_bytes})


def model_unnamed(served: list[str]) -> InvalidField:
    """The request names no model and the workers serve several (INVALID_ARGUMENT, `model`)."""
    return InvalidField(
        "model", f"empty, but the registered workers serve {len(served)} models: "
        f"{_names(served)}; set model to one of them (an empty model is accepted only while "
        "the workers serve exactly one)",
        served_models=",".join(served), served_model_count=len(served))
