"""The KV-cache byte-budget ledger: the scheduler's pure core (no grpc, no protobuf).

Every worker reports its `capacity_bytes`, `bytes_per_token`, allocation
granularity and context length. An admission reserves the worst case,
`(prompt_tokens + max_new_tokens) x bytes_per_token` rounded up to whole
blocks, so an admitted sequence can always run to completion. When that does
not fit, the ledger caps `max_new_tokens` to the most that fits, computing and
reserving it under one lock hold (reserve-at-most); it never reads the free
bytes in one step and reserves in another, and never reserves less than the
admitted ceiling needs.

Running out of budget is a returned value (an `Admission` with a `Rejection`),
not an exception; misuse (bad geometry, negative counts) raises ValueError.
"""

from __future__ import annotations

import enum
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from ortserve import kv_math
from ortserve.units import human_bytes, tokens


class Decision(enum.Enum):
    ADMITTED = "admitted"
    CAPPED = "capped"
    REJECTED = "rejected"


class Cause(enum.Enum):
    """Why a request was rejected; each maps to its own gRPC status code."""

    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # INVALID_ARGUMENT
    EXCEEDS_CAPACITY = "exceeds_capacity"  # FAILED_PRECONDITION
    BUDGET_BUSY = "budget_busy"  # RESOURCE_EXHAUSTED + RetryInfo
    NO_WORKER = "no_worker"  # UNAVAILABLE


@dataclass(frozen=True)
class WorkerGeometry:
    """What a worker reports about itself at registration."""

    worker_id: str
    address: str
    model: str
    context_length: int
    bytes_per_token: int
    capacity_bytes: int
    block_tokens: int = 1
    execution_provider: str = ""

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("worker_id must not be empty")
        for name in ("context_length", "bytes_per_token", "block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {self.capacity_bytes}")

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.bytes_per_token

    def bytes_for(self, n_tokens: int) -> int:
        """Bytes a sequence of `n_tokens` holds: whole blocks, rounded up."""
        return kv_math.bytes_for(n_tokens, self.bytes_per_token, self.block_tokens)

    def tokens_within(self, n_bytes: int) -> int:
        """The most tokens whose reservation fits in `n_bytes`."""
        return kv_math.tokens_within(n_bytes, self.bytes_per_token, self.block_tokens)


@dataclass(frozen=True)
class AdmissionRequest:
    """The numbers admission needs; the servicer counts the prompt first."""

    request_id: str
    prompt_tokens: int
    max_new_tokens: int | None = None  # None: the remaining context window
    min_new_tokens: int = 0
    strict: bool = False  # cap policy STRICT: reject rather than cap

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 when set, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must not exceed "
                f"max_new_tokens ({self.max_new_tokens})"
            )

    @property
    def floor_new_tokens(self) -> int:
        """The fewest new tokens worth admitting: min_new_tokens, and at least one."""
        return max(self.min_new_tokens, 1)


@dataclass(frozen=True)
class BudgetCap:
    """How and why max_new_tokens was reduced; travels with the lease."""

    requested_max_new_tokens: int
    admitted_max_new_tokens: int
    requested_was_unset: bool
    requested_bytes: int
    admitted_bytes: int
    available_bytes: int
    capacity_bytes: int
    bytes_per_token: int
    prompt_tokens: int
    worker_id: str
    reason: str


@dataclass(frozen=True)
class Lease:
    """Bytes of one worker's budget held for one request."""

    lease_id: str
    worker_id: str
    request_id: str
    prompt_tokens: int
    max_new_tokens: int
    reserved_bytes: int
    budget_cap: BudgetCap | None = None
    created_at: float = 0.0
    claimed: bool = False
    claimed_at: float = 0.0


@dataclass(frozen=True)
class Rejection:
    cause: Cause
    message: str
    remedy: str
    prompt_tokens: int
    min_new_tokens: int
    requested_max_new_tokens: int = 0
    admissible_max_new_tokens: int = 0
    context_length: int = 0
    needed_bytes: int = 0
    available_bytes: int = 0
    capacity_bytes: int = 0
    bytes_per_token: int = 0
    cap_refused: bool = False
    retry_after_s: float = 0.0


@dataclass(frozen=True)
class Admission:
    decision: Decision
    request_id: str
    prompt_tokens: int
    max_new_tokens: int = 0
    reserved_bytes: int = 0
    worker: WorkerGeometry | None = None
    lease: Lease | None = None  # None when rejected or dry_run
    budget_cap: BudgetCap | None = None
    rejection: Rejection | None = None
    dry_run: bool = False


@dataclass(frozen=True)
class WorkerSnapshot:
    geometry: WorkerGeometry
    reserved_bytes: int
    heartbeat_age_s: float
    leases: tuple[Lease, ...]

    @property
    def available_bytes(self) -> int:
        return self.geometry.capacity_bytes - self.reserved_bytes


@dataclass
class _Worker:
    geometry: WorkerGeometry
    last_heartbeat: float
    leases: dict[str, Lease] = field(default_factory=dict)
    reserved_bytes: int = 0

    @property
    def available_bytes(self) -> int:
        return self.geometry.capacity_bytes - self.reserved_bytes


@dataclass(frozen=True)
class _Option:
    """One worker's answer to a request, computed under the lock."""

    worker: _Worker
    requested_max_new_tokens: int
    admissible_max_new_tokens: int  # the most that fits now, <= requested
    fits_whole: bool


def _new_lease_id() -> str:
    return uuid.uuid4().hex


class Ledger:
    """Every worker's KV budget and every lease. Thread-safe: one lock."""

    def __init__(
        self,
        lease_ttl_s: float = 10.0,
        claim_ttl_s: float = 60.0,
        retry_after_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        new_lease_id: Callable[[], str] = _new_lease_id,
    ) -> None:
        self.lease_ttl_s = lease_ttl_s  # a worker silent this long is gone, leases too
        self.claim_ttl_s = claim_ttl_s  # a lease no worker claimed this long is dropped
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._new_lease_id = new_lease_id
        self._lock = threading.Lock()
        self._workers: dict[str, _Worker] = {}
        self._lease_owner: dict[str, str] = {}  # lease_id -> worker_id

    # -- workers -------------------------------------------------------------

    def register(self, geometry: WorkerGeometry, live_leases: Iterable[Lease] = ()) -> list[str]:
        """Add or re-register a worker; returns the ids of leases it could not restore.

        The worker's lease set becomes what it reports live plus leases admitted
        for it that it has not claimed yet (their requests may still arrive).
        Claimed leases it no longer reports are gone with it. A lease that would
        push reserved past capacity is refused, so the invariant holds even if
        the worker comes back smaller.
        """
        now = self._clock()
        refused: list[str] = []
        with self._lock:
            old = self._workers.pop(geometry.worker_id, None)
            worker = _Worker(geometry=geometry, last_heartbeat=now)
            candidates = [replace(lease, worker_id=geometry.worker_id, claimed=True,
                                  claimed_at=lease.claimed_at or now)
                          for lease in live_leases]
            if old is not None:
                reported = {lease.lease_id for lease in candidates}
                candidates += [lease for lease in old.leases.values()
                               if not lease.claimed and lease.lease_id not in reported]
                for lease_id in old.leases:
                    self._lease_owner.pop(lease_id, None)
            for lease in candidates:
                owner = self._lease_owner.get(lease.lease_id)
                if owner is not None or worker.reserved_bytes + lease.reserved_bytes > geometry.capacity_bytes:
                    refused.append(lease.lease_id)
                    continue
                self._hold(worker, replace(lease, created_at=lease.created_at or now))
            self._workers[geometry.worker_id] = worker
        return refused

    def heartbeat(self, worker_id: str) -> bool:
        """Renew a worker and all its leases. False: unknown, it must register again."""
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return False
            worker.last_heartbeat = self._clock()
            return True

    def remove_worker(self, worker_id: str) -> int:
        """Forget a worker; its leases' bytes return. Returns the bytes freed."""
        with self._lock:
            worker = self._workers.pop(worker_id, None)
            if worker is None:
                return 0
            for lease_id in worker.leases:
                self._lease_owner.pop(lease_id, None)
            return worker.reserved_bytes

    def geometry(self, worker_id: str) -> WorkerGeometry | None:
        with self._lock:
            worker = self._workers.get(worker_id)
            return worker.geometry if worker else None

    # -- leases --------------------------------------------------------------

    def admit(self, request: AdmissionRequest, dry_run: bool = False) -> Admission:
        """Decide ADMITTED / CAPPED / REJECTED and, unless dry_run, reserve.

        The decision and the reservation happen under one lock hold.
        """
        with self._lock:
            self._expire_locked(self._clock())
            decision = self._decide_locked(request)
            if dry_run or decision.decision is Decision.REJECTED:
                return replace(decision, dry_run=dry_run)
            assert decision.worker is not None
            worker = self._workers[decision.worker.worker_id]
            lease = Lease(
                lease_id=self._new_lease_id(),
                worker_id=worker.geometry.worker_id,
                request_id=request.request_id,
                prompt_tokens=request.prompt_tokens,
                max_new_tokens=decision.max_new_tokens,
                reserved_bytes=decision.reserved_bytes,
                budget_cap=decision.budget_cap,
                created_at=self._clock(),
            )
            self._hold(worker, lease)
            return replace(decision, lease=lease)

    def release(self, lease_id: str) -> int:
        """Give a lease back. Idempotent: returns its bytes the first time, 0 after."""
        with self._lock:
            worker_id = self._lease_owner.pop(lease_id, None)
            if worker_id is None:
                return 0
            worker = self._workers[worker_id]
            lease = worker.leases.pop(lease_id)
            worker.reserved_bytes -= lease.reserved_bytes
            return lease.reserved_bytes

    def release_unclaimed(self, lease_id: str) -> int:
        """Release a lease only if no worker has claimed it (then the worker owns the release).

        The scheduler calls this on its own exits: a claimed lease is released by
        its worker after the KV buffer is really freed, so the ledger never
        offers bytes a worker still holds; worker death is covered by expiry.
        """
        with self._lock:
            worker_id = self._lease_owner.get(lease_id)
            if worker_id is None or self._workers[worker_id].leases[lease_id].claimed:
                return 0
        return self.release(lease_id)

    def reconcile(self, worker_id: str, live_lease_ids: Iterable[str], grace_s: float) -> list[Lease]:
        """Release claimed leases the worker no longer reports (claimed > grace_s ago)."""
        live = set(live_lease_ids)
        now = self._clock()
        with self._lock:
            worker = self._workers.get(worker_id)
            if worker is None:
                return []
            lost = [lease for lease in worker.leases.values()
                    if lease.claimed and lease.lease_id not in live
                    and now - lease.claimed_at > grace_s]
            for lease in lost:
                del worker.leases[lease.lease_id]
                del self._lease_owner[lease.lease_id]
                worker.reserved_bytes -= lease.reserved_bytes
            return lost

    def claim(self, lease_id: str, worker_id: str) -> Lease | None:
        """A worker takes up a lease handed to it; None if not live or not its own."""
        with self._lock:
            if self._lease_owner.get(lease_id) != worker_id:
                return None
            worker = self._workers[worker_id]
            lease = worker.leases[lease_id]
            if not lease.claimed:
                lease = replace(lease, claimed=True, claimed_at=self._clock())
                worker.leases[lease_id] = lease
            return lease

    def lease(self, lease_id: str) -> Lease | None:
        with self._lock:
            worker_id = self._lease_owner.get(lease_id)
            return self._workers[worker_id].leases[lease_id] if worker_id else None

    def expire(self) -> list[Lease]:
        """Drop silent workers (their leases with them) and unclaimed stale leases."""
        with self._lock:
            return self._expire_locked(self._clock())

    # -- reading -------------------------------------------------------------

    def snapshot(self) -> list[WorkerSnapshot]:
        now = self._clock()
        with self._lock:
            return [
                WorkerSnapshot(
                    geometry=w.geometry,
                    reserved_bytes=w.reserved_bytes,
                    heartbeat_age_s=now - w.last_heartbeat,
                    leases=tuple(w.leases.values()),
                )
                for w in sorted(self._workers.values(), key=lambda w: w.geometry.worker_id)
            ]

    def reserved_bytes(self) -> int:
        with self._lock:
            return sum(w.reserved_bytes for w in self._workers.values())

    # -- internals (lock held) ---------------------------------------------------

    def _hold(self, worker: _Worker, lease: Lease) -> None:
        worker.leases[lease.lease_id] = lease
        worker.reserved_bytes += lease.reserved_bytes
        self._lease_owner[lease.lease_id] = worker.geometry.worker_id
        # NOTE: the invariant this whole module exists for.
        assert worker.reserved_bytes <= worker.geometry.capacity_bytes

    def _expire_locked(self, now: float) -> list[Lease]:
        expired: list[Lease] = []
        for worker_id in list(self._workers):
            worker = self._workers[worker_id]
            if now - worker.last_heartbeat > self.lease_ttl_s:
                expired += worker.leases.values()
                for lease_id in worker.leases:
                    self._lease_owner.pop(lease_id, None)
                del self._workers[worker_id]
                continue
            for lease in list(worker.leases.values()):
                if not lease.claimed and now - lease.created_at > self.claim_ttl_s:
                    del worker.leases[lease.lease_id]
                    del self._lease_owner[lease.lease_id]
                    worker.reserved_bytes -= lease.reserved_bytes
                    expired.append(lease)
        return expired

    def _decide_locked(self, req: AdmissionRequest) -> Admission:
        workers = list(self._workers.values())
        if not workers:
            return self._reject(req, Cause.NO_WORKER)
        floor = req.floor_new_tokens
        in_context = [w for w in workers if self._fits_context(req, w.geometry)]
        if not in_context:
            return self._reject_context(req, max(workers, key=lambda w: w.geometry.context_length))
        options = [self._option(req, w) for w in in_context]
        whole = [o for o in options if o.fits_whole]
        if whole:
            # NOTE: spread whole fits over workers (most free bytes first): decode
            # speed per worker is the bottleneck, so balance beats packing here.
            best = max(whole, key=lambda o: (o.worker.available_bytes, -len(o.worker.leases),
                                             o.worker.geometry.worker_id))
            g = best.worker.geometry
            n_new = best.requested_max_new_tokens
            return Admission(
                decision=Decision.ADMITTED, request_id=req.request_id,
                prompt_tokens=req.prompt_tokens, max_new_tokens=n_new,
                reserved_bytes=g.bytes_for(req.prompt_tokens + n_new), worker=g,
            )
        # No worker takes it whole: the one with the largest cap.
        best = max(options, key=lambda o: (o.admissible_max_new_tokens, o.worker.available_bytes,
                                           o.worker.geometry.worker_id))
        idle_fit_whole = any(
            o.worker.geometry.bytes_for(req.prompt_tokens + o.requested_max_new_tokens)
            <= o.worker.geometry.capacity_bytes for o in options
        )
        if best.admissible_max_new_tokens >= floor and not req.strict:
            return self._capped(req, best)
        if best.admissible_max_new_tokens >= floor and req.strict:
            cause = Cause.BUDGET_BUSY if idle_fit_whole else Cause.EXCEEDS_CAPACITY
            return self._reject(req, cause, options, cap_refused=True)
        idle_fit_floor = any(
            o.worker.geometry.bytes_for(req.prompt_tokens + floor) <= o.worker.geometry.capacity_bytes
            for o in options
        )
        cause = Cause.BUDGET_BUSY if idle_fit_floor else Cause.EXCEEDS_CAPACITY
        return self._reject(req, cause, options)

    @staticmethod
    def _fits_context(req: AdmissionRequest, g: WorkerGeometry) -> bool:
        if req.prompt_tokens + req.floor_new_tokens > g.context_length:
            return False
        return req.max_new_tokens is None or req.prompt_tokens + req.max_new_tokens <= g.context_length

    @staticmethod
    def _option(req: AdmissionRequest, worker: _Worker) -> _Option:
        g = worker.geometry
        requested = (req.max_new_tokens if req.max_new_tokens is not None
                     else g.context_length - req.prompt_tokens)
        fit_new = g.tokens_within(worker.available_bytes) - req.prompt_tokens
        admissible = max(0, min(requested, fit_new))
        return _Option(worker, requested, admissible, fits_whole=admissible == requested)

    def _capped(self, req: AdmissionRequest, best: _Option) -> Admission:
        g = best.worker.geometry
        n_new = best.admissible_max_new_tokens
        requested = best.requested_max_new_tokens
        requested_bytes = g.bytes_for(req.prompt_tokens + requested)
        admitted_bytes = g.bytes_for(req.prompt_tokens + n_new)
        available = best.worker.available_bytes
        asked = ("max_new_tokens unset (the remaining context window: "
                 f"{tokens(requested)})" if req.max_new_tokens is None
                 else f"max_new_tokens {requested:,}")
        if g.bytes_for(req.prompt_tokens + requested) > g.capacity_bytes:
            why = (f"worker {g.worker_id}'s whole KV capacity is {human_bytes(g.capacity_bytes)}; "
                   f"raise its --kv-budget to at least {human_bytes(requested_bytes)} "
                   f"or ask for max_new_tokens <= {n_new:,}")
        else:
            why = (f"other requests hold {human_bytes(best.worker.reserved_bytes)} of worker "
                   f"{g.worker_id}'s {human_bytes(g.capacity_bytes)} now; retry later for the "
                   f"full ceiling, or set cap_policy STRICT to be refused instead")
        reason = (
            f"prompt {tokens(req.prompt_tokens)} + {asked} needs {human_bytes(requested_bytes)} "
            f"of KV at {g.bytes_per_token:,} B/token, but {human_bytes(available)} is free; "
            f"capped to max_new_tokens {n_new:,} ({human_bytes(admitted_bytes)}): {why}"
        )
        cap = BudgetCap(
            requested_max_new_tokens=requested, admitted_max_new_tokens=n_new,
            requested_was_unset=req.max_new_tokens is None, requested_bytes=requested_bytes,
            admitted_bytes=admitted_bytes, available_bytes=available,
            capacity_bytes=g.capacity_bytes, bytes_per_token=g.bytes_per_token,
            prompt_tokens=req.prompt_tokens, worker_id=g.worker_id, reason=reason,
        )
        return Admission(
            decision=Decision.CAPPED, request_id=req.request_id, prompt_tokens=req.prompt_tokens,
            max_new_tokens=n_new, reserved_bytes=admitted_bytes, worker=g, budget_cap=cap,
        )

    def _reject_context(self, req: AdmissionRequest, widest: _Worker) -> Admission:
        g = widest.geometry
        ctx = g.context_length
        if req.prompt_tokens + req.floor_new_tokens > ctx:
            message = (f"prompt is {tokens(req.prompt_tokens)} and min_new_tokens "
                       f"{req.min_new_tokens:,} (at least 1 new token) need "
                       f"{req.prompt_tokens + req.floor_new_tokens:,} positions, but the model's "
                       f"context window is {tokens(ctx)}")
            remedy = (f"shorten the prompt to at most {ctx - req.floor_new_tokens:,} tokens"
                      + (" or lower min_new_tokens" if req.min_new_tokens > 1 else ""))
        else:
            message = (f"prompt {tokens(req.prompt_tokens)} + max_new_tokens "
                       f"{req.max_new_tokens:,} = {req.prompt_tokens + (req.max_new_tokens or 0):,} "
                       f"positions exceed the model's context window of {tokens(ctx)}")
            remedy = (f"lower max_new_tokens to at most {ctx - req.prompt_tokens:,}, "
                      "or leave it unset to use the remaining context window")
        rejection = Rejection(
            cause=Cause.CONTEXT_LENGTH_EXCEEDED, message=message, remedy=remedy,
            prompt_tokens=req.prompt_tokens, min_new_tokens=req.min_new_tokens,
            requested_max_new_tokens=req.max_new_tokens or max(ctx - req.prompt_tokens, 0),
            context_length=ctx, bytes_per_token=g.bytes_per_token,
            capacity_bytes=g.capacity_bytes, available_bytes=widest.available_bytes,
        )
        return Admission(decision=Decision.REJECTED, request_id=req.request_id,
                         prompt_tokens=req.prompt_tokens, rejection=rejection)

    def _reject(self, req: AdmissionRequest, cause: Cause, options: Iterable[_Option] = (),
                cap_refused: bool = False) -> Admission:
        if cause is Cause.NO_WORKER:
            rejection = Rejection(
                cause=cause, prompt_tokens=req.prompt_tokens, min_new_tokens=req.min_new_tokens,
                message="no worker is registered and heartbeating with the scheduler",
                remedy="start a worker (ortserve-worker --scheduler HOST:PORT) or check that "
                       "workers can reach the scheduler",
                retry_after_s=self.retry_after_s,
            )
            return Admission(decision=Decision.REJECTED, request_id=req.request_id,
                             prompt_tokens=req.prompt_tokens, rejection=rejection)
        options = list(options)
        best = max(options, key=lambda o: (o.admissible_max_new_tokens, o.worker.available_bytes))
        biggest = max(options, key=lambda o: o.worker.geometry.capacity_bytes)
        g = best.worker.geometry
        floor = req.floor_new_tokens
        n_new = best.requested_max_new_tokens if cap_refused else floor
        needed = g.bytes_for(req.prompt_tokens + n_new)
        available = max(o.worker.available_bytes for o in options)
        capacity = biggest.worker.geometry.capacity_bytes
        what = (f"prompt {tokens(req.prompt_tokens)} + max_new_tokens {n_new:,} "
                "(cap policy STRICT refuses a smaller ceiling)" if cap_refused
                else f"prompt {tokens(req.prompt_tokens)} + min_new_tokens {n_new:,}")
        if cause is Cause.EXCEEDS_CAPACITY:
            message = (f"{what} need {human_bytes(needed)} of KV at {g.bytes_per_token:,} B/token, "
                       f"more than any worker's whole capacity (largest: "
                       f"{human_bytes(capacity)} on {biggest.worker.geometry.worker_id})")
            fit = biggest.worker.geometry.tokens_within(capacity) - req.prompt_tokens
            remedy = (f"raise the worker's --kv-budget to at least {human_bytes(needed)}"
                      + (f", or ask for max_new_tokens <= {fit:,}" if fit >= floor else
                         ", or shorten the prompt"))
            retry = 0.0
        else:
            message = (f"{what} need {human_bytes(needed)} of KV at {g.bytes_per_token:,} B/token; "
                       f"the most free on any worker now is {human_bytes(available)} "
                       f"(capacity {human_bytes(capacity)}): the budget is held by other requests")
            remedy = (f"retry in {self.retry_after_s:g} s"
                      + (f", or accept a cap (max_new_tokens <= {best.admissible_max_new_tokens:,} "
                         "fits now)" if cap_refused else "")
                      + ", or add workers")
            retry = self.retry_after_s
        rejection = Rejection(
            cause=cause, message=message, remedy=remedy, cap_refused=cap_refused,
            prompt_tokens=req.prompt_tokens, min_new_tokens=req.min_new_tokens,
            requested_max_new_tokens=best.requested_max_new_tokens,
            admissible_max_new_tokens=best.admissible_max_new_tokens,
            context_length=g.context_length, needed_bytes=needed, available_bytes=available,
            capacity_bytes=capacity, bytes_per_token=g.bytes_per_token, retry_after_s=retry,
        )
        return Admission(decision=Decision.REJECTED, request_id=req.request_id,
                         prompt_tokens=req.prompt_tokens, rejection=rejection)
