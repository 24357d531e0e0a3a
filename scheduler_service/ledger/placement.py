"""Placement and the decision: which worker, and ADMITTED / CAPPED / REJECTED (pure).

Also which leases a re-registering worker takes back. The ledger calls these
under its lock with its workers' state; nothing here reserves anything.
Balance over packing: a request that fits whole goes to a worker with a batch row
free (one whose rows are all taken would queue it behind a whole generation),
then to the one whose prefix cache holds the longest prefix of its prompt, then to
the one with the most free bytes; otherwise to the one where the cap is largest.
Only workers serving the request's model are ever considered (resolve_model names it).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, replace
from typing import Any

from ortserve.status.units import human_bytes
from scheduler_service.ledger import errors, sentences
from scheduler_service.ledger.types import (
    AdmissionDecision,
    AdmissionRequest,
    CapLimit,
    Cause,
    Decision,
    Expired,
    Lease,
    NewTokensCap,
    NewTokensSource,
    Rejection,
    TenantRoom,
    WorkerGeometry,
)


@dataclass(frozen=True)
class Option:
    """One worker's answer to a request, computed under the lock."""

    worker: Any  # the ledger's private per-worker state (geometry, available_bytes)
    requested_max_new_tokens: int
    admissible_max_new_tokens: int  # the most that fits now, <= requested
    fits_whole: bool
    source: NewTokensSource = NewTokensSource.REQUEST  # where `requested` came from


def resolve_model(requested: str, served: Collection[str]) -> str:
    """The model a request is answered by, from its `model` and the models workers serve.

    Its own name when served; the one served model when it names none. Raises
    MODEL_NOT_FOUND for a name no worker serves and INVALID_REQUEST (field
    `model`) for no name while several are served. With no worker at all the
    name is kept: admission answers NO_WORKER, which a retry can cure.
    """
    if not served:
        return requested
    names = sorted(served)
    if requested:
        if requested in served:
            return requested
        raise errors.model_not_found(requested, names)
    if len(names) == 1:
        return names[0]
    raise errors.model_unnamed(names)


def resolve_adapter(adapter: str, model: str, workers: Iterable) -> None:
    """Raise MODEL_NOT_FOUND when no registered worker of `model` serves LoRA adapter
    `adapter` ("": the base, always served), naming the adapters each model's workers
    serve. Draining workers count: one may still be the adapter's only home."""
    if not adapter:
        return
    served: dict[str, set[str]] = {}
    for w in workers:
        served.setdefault(w.geometry.model, set()).update(
            name for name, _ in w.geometry.adapters)
    if adapter not in served.get(model, set()) and served:
        raise errors.adapter_not_found(adapter, model, {m: sorted(a) for m, a in served.items()})


def serving(workers: Iterable, model: str) -> list:
    """The workers (ledger state or snapshots) serving `model`; every worker when it is empty."""
    return [w for w in workers if not model or w.geometry.model == model]


def decide(workers: list, req: AdmissionRequest, retry_after_s: float) -> AdmissionDecision:
    """ADMITTED, CAPPED or REJECTED for `req` over the (non-draining) workers' state now.

    NOTE: only the request's model's workers: another model's free bytes would
    serve it with the wrong weights.
    """
    # NOTE: a LoRA adapter's weights live only where it is loaded: another worker of
    # the base would answer NOT_FOUND (or worse, the base's output).
    workers = [w for w in serving(workers, req.model) if w.geometry.serves_adapter(req.adapter)]
    if not workers:
        return reject(req, Cause.NO_WORKER, retry_after_s=retry_after_s)
    floor = req.floor_new_tokens
    in_context = [w for w in workers if fits_context(req, w.geometry)]
    if not in_context:
        return reject_context(req, max(workers, key=lambda w: w.geometry.context_length))
    options = [option(req, w) for w in in_context]
    whole = [o for o in options if o.fits_whole]
    if whole:
        # NOTE: a free row first (where all are taken it waits a whole generation),
        # then the caller's preferred worker (an inference gateway's pick: its pod's
        # worker, docs/operations/inference-gateway.md), then a cached prefix (seconds of
        # prefill saved, docs/features/prefix-cache.md), then spread whole fits over workers (most free bytes first): decode speed
        # per worker is the bottleneck, so balance beats packing here.
        best = max(whole, key=lambda o: (
            has_free_row(o.worker),
            bool(req.preferred_worker) and o.worker.geometry.worker_id == req.preferred_worker,
            o.worker.prefix.cached_tokens(req, o.worker.geometry.block_tokens),
            o.worker.available_bytes, -len(o.worker.leases), o.worker.geometry.worker_id))
        g = best.worker.geometry
        n_new = best.requested_max_new_tokens
        return AdmissionDecision(
            decision=Decision.ADMITTED, request_id=req.request_id,
            prompt_tokens=req.prompt_tokens, max_new_tokens=n_new,
            reserved_bytes=g.bytes_for(req.prompt_tokens + n_new), worker=g,
            max_new_tokens_source=best.source,
        )
    # No worker takes it whole: the one with the largest cap.
    best = max(options, key=lambda o: (o.admissible_max_new_tokens, o.worker.available_bytes,
                                       o.worker.geometry.worker_id))
    idle_fit_whole = any(
        o.worker.geometry.bytes_for(req.prompt_tokens + o.requested_max_new_tokens)
        <= o.worker.geometry.capacity_bytes for o in options
    )
    if best.admissible_max_new_tokens >= floor and not req.strict:
        return capped(req, best)
    if best.admissible_max_new_tokens >= floor and req.strict:
        cause = Cause.BUDGET_BUSY if idle_fit_whole else Cause.EXCEEDS_CAPACITY
        return reject(req, cause, options, cap_refused=True, retry_after_s=retry_after_s)
    idle_fit_floor = any(
        o.worker.geometry.bytes_for(req.prompt_tokens + floor) <= o.worker.geometry.capacity_bytes
        for o in options
    )
    cause = Cause.BUDGET_BUSY if idle_fit_floor else Cause.EXCEEDS_CAPACITY
    return reject(req, cause, options, retry_after_s=retry_after_s)


def within_quota(pool: AdmissionDecision, limited: AdmissionDecision, req: AdmissionRequest,
                 room: TenantRoom, retry_after_s: float) -> AdmissionDecision:
    """The decision for a tenant's request: `pool`'s, unless its room in its quota binds.

    `limited` is the same decision over the workers as if each had at most the tenant's
    room free (never more than its own free bytes), so a reservation it grants fits both.
    Where that grants less than the pool would, the tenant's quota is what bound it:
    CAPPED to the room (the cap names the tenant and both numbers) or REJECTED
    TENANT_QUOTA (which waits in the queue when the quota can hold it at all).
    """
    if pool.decision is Decision.REJECTED:
        return pool  # the pool refuses it whatever the tenant holds: the pool's cause
    if limited.decision is not Decision.REJECTED:
        if limited.max_new_tokens >= pool.max_new_tokens:
            # The pool's choice of worker (rows, prefix cache) when its bytes fit the room too.
            return pool if pool.reserved_bytes <= room.room_bytes else limited
        cap = replace(limited.budget_cap, limit=CapLimit.TENANT_QUOTA, tenant=room.tenant,
                      tenant_quota_bytes=room.quota_bytes, tenant_reserved_bytes=room.reserved_bytes)
        return replace(limited, budget_cap=replace(cap, reason=sentences.cap_reason(cap)))
    r = limited.rejection
    g = pool.worker
    whole_fit_new = max(g.tokens_within(room.quota_bytes) - req.prompt_tokens, 0)
    rejection = replace(r, cause=Cause.TENANT_QUOTA, tenant=room.tenant,
                        tenant_quota_bytes=room.quota_bytes,
                        tenant_reserved_bytes=room.reserved_bytes,
                        tenant_quota_text=_quota_text(room),
                        available_bytes=min(r.available_bytes, room.room_bytes))
    if rejection.waits_for_tenant_room:
        rejection = replace(rejection, retry_after_s=retry_after_s)
    else:
        rejection = replace(rejection, retry_after_s=0.0,
                            admissible_max_new_tokens=min(whole_fit_new,
                                                          r.requested_max_new_tokens))
    return replace(limited, rejection=sentences.rendered(rejection))


def _quota_text(room: TenantRoom) -> str:
    if room.share is None:
        return human_bytes(room.quota_bytes)
    return (f"{room.share * 100:g} % of {human_bytes(room.capacity_bytes)} = "
            f"{human_bytes(room.quota_bytes)}")


def has_free_row(worker) -> bool:
    """Whether a sequence placed on `worker` now starts at once: fewer of its leases
    need a row (sessions' leases hold KV between turns, out of the batch; one whose turn
    runs takes a row) than it has rows. Unknown limits (0) count as free."""
    rows = worker.geometry.max_batch_rows
    if not rows:
        return True
    return sum(1 for lease in worker.leases.values() if lease.decoding) < rows


def decide_on(worker, req: AdmissionRequest, retry_after_s: float) -> AdmissionDecision:
    """ADMITTED, CAPPED or REJECTED for `req` on this one worker, whose context it fits.

    A session turn's decision on its own lease's worker: the ledger passes the
    worker as if that lease held nothing, since its bytes are its own to reuse.
    """
    o = option(req, worker)
    g = worker.geometry
    if o.fits_whole:
        n_new = o.requested_max_new_tokens
        return AdmissionDecision(
            decision=Decision.ADMITTED, request_id=req.request_id,
            prompt_tokens=req.prompt_tokens, max_new_tokens=n_new,
            reserved_bytes=g.bytes_for(req.prompt_tokens + n_new), worker=g,
            max_new_tokens_source=o.source,
        )
    fits_floor = o.admissible_max_new_tokens >= req.floor_new_tokens
    if fits_floor and not req.strict:
        return capped(req, o)
    whole = g.bytes_for(req.prompt_tokens + req.floor_new_tokens)
    cause = Cause.BUDGET_BUSY if whole <= g.capacity_bytes else Cause.EXCEEDS_CAPACITY
    return reject(req, cause, [o], cap_refused=req.strict and fits_floor,
                  retry_after_s=retry_after_s)

def restored(worker_id: str, live: Iterable[Lease], held: list[Lease],
             now: float) -> tuple[list[Lease], list[Expired]]:
    """The leases a (re-)registering worker takes back, and those gone with it.

    It takes what it reports `live` (claimed by it now) plus the leases `held`
    for it that it has not claimed yet (their requests may still arrive).
    Claimed leases it no longer reports are gone with it.
    """
    candidates = [replace(lease, worker_id=worker_id, claimed=True,
                          claimed_at=lease.claimed_at or now) for lease in live]
    reported = {lease.lease_id for lease in candidates}
    candidates += [lease for lease in held if not lease.claimed and lease.lease_id not in reported]
    gone = [Expired(lease, "worker re-registered without it", now - lease.created_at)
            for lease in held if lease.claimed and lease.lease_id not in reported]
    return candidates, gone

def fits_context(req: AdmissionRequest, g: WorkerGeometry) -> bool:
    if req.prompt_tokens + req.floor_new_tokens > g.context_length:
        return False
    return req.max_new_tokens is None or req.prompt_tokens + req.max_new_tokens <= g.context_length

def option(req: AdmissionRequest, worker) -> Option:
    g = worker.geometry
    requested, source = req.requested_new_tokens(g.context_length)
    fit_new = g.tokens_within(worker.available_bytes) - req.prompt_tokens
    admissible = max(0, min(requested, fit_new))
    return Option(worker, requested, admissible, fits_whole=admissible == requested,
                  source=source)

def capped(req: AdmissionRequest, best: Option) -> AdmissionDecision:
    g = best.worker.geometry
    n_new = best.admissible_max_new_tokens
    requested = best.requested_max_new_tokens
    admitted_bytes = g.bytes_for(req.prompt_tokens + n_new)
    cap = NewTokensCap(
        requested_max_new_tokens=requested, admitted_max_new_tokens=n_new,
        requested_was_unset=req.max_new_tokens is None,
        requested_bytes=g.bytes_for(req.prompt_tokens + requested),
        admitted_bytes=admitted_bytes, available_bytes=best.worker.available_bytes,
        capacity_bytes=g.capacity_bytes, bytes_per_token=g.bytes_per_token,
        prompt_tokens=req.prompt_tokens, worker_id=g.worker_id, requested_source=best.source,
    )
    cap = replace(cap, reason=sentences.cap_reason(cap))
    return AdmissionDecision(
        decision=Decision.CAPPED, request_id=req.request_id, prompt_tokens=req.prompt_tokens,
        max_new_tokens=n_new, reserved_bytes=admitted_bytes, worker=g, budget_cap=cap,
        max_new_tokens_source=best.source,
    )

def reject_context(req: AdmissionRequest, widest) -> AdmissionDecision:
    g = widest.geometry
    ctx = g.context_length
    rejection = sentences.rendered(Rejection(
        cause=Cause.CONTEXT_LENGTH_EXCEEDED,
        prompt_tokens=req.prompt_tokens, min_new_tokens=req.min_new_tokens,
        requested_max_new_tokens=req.requested_new_tokens(ctx)[0],
        context_length=ctx, bytes_per_token=g.bytes_per_token,
        capacity_bytes=g.capacity_bytes, available_bytes=widest.available_bytes,
    ))
    return AdmissionDecision(decision=Decision.REJECTED, request_id=req.request_id,
                     prompt_tokens=req.prompt_tokens, rejection=rejection)

def reject(req: AdmissionRequest, cause: Cause, options: Iterable[Option] = (),
           cap_refused: bool = False, retry_after_s: float = 0.0) -> AdmissionDecision:
    if cause is Cause.NO_WORKER:
        return no_worker_rejection(req.request_id, req.prompt_tokens, req.min_new_tokens,
                                   retry_after_s, model=req.model)
    options = list(options)
    best = max(options, key=lambda o: (o.admissible_max_new_tokens, o.worker.available_bytes))
    biggest = max(options, key=lambda o: o.worker.geometry.capacity_bytes).worker.geometry
    g = best.worker.geometry
    n_new = best.requested_max_new_tokens if cap_refused else req.floor_new_tokens
    rejection = sentences.rendered(Rejection(
        cause=cause, cap_refused=cap_refused,
        prompt_tokens=req.prompt_tokens, min_new_tokens=req.min_new_tokens,
        requested_max_new_tokens=best.requested_max_new_tokens,
        admissible_max_new_tokens=best.admissible_max_new_tokens,
        context_length=g.context_length, needed_bytes=g.bytes_for(req.prompt_tokens + n_new),
        available_bytes=max(o.worker.available_bytes for o in options),
        capacity_bytes=biggest.capacity_bytes, bytes_per_token=g.bytes_per_token,
        retry_after_s=retry_after_s if cause is Cause.BUDGET_BUSY else 0.0,
        largest_worker_id=biggest.worker_id,
        max_fit_new_tokens=max(biggest.tokens_within(biggest.capacity_bytes) - req.prompt_tokens, 0),
    ))
    return AdmissionDecision(decision=Decision.REJECTED, request_id=req.request_id,
                     prompt_tokens=req.prompt_tokens, rejection=rejection)


def no_worker_rejection(request_id: str, prompt_tokens: int, min_new_tokens: int,
                        retry_after_s: float, registered_workers: int = 0,
                        worker_error: str = "", model: str = "") -> AdmissionDecision:
    """NO_WORKER, the one shape for "no worker registered" and "none answered Tokenize"
    (`model`: the request's, when no worker of it is left).

    prompt_tokens 0 means unknown (a text prompt nobody could count): reported so, never guessed.
    """
    rejection = sentences.rendered(Rejection(
        cause=Cause.NO_WORKER, prompt_tokens=prompt_tokens, min_new_tokens=min_new_tokens,
        retry_after_s=retry_after_s, prompt_tokens_unknown=prompt_tokens == 0,
        registered_workers=registered_workers, worker_error=worker_error, model=model,
    ))
    return AdmissionDecision(decision=Decision.REJECTED, request_id=request_id,
                     prompt_tokens=prompt_tokens, rejection=rejection)
