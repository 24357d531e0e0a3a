"""The admission queue: requests that cannot start now wait here (pure).

No grpc, no protobuf, no asyncio: the servicer awaits tickets through
`queue_waiter`. The queue holds no bytes: a waiting request reserves nothing
until the ledger admits it, so leaving the queue (cancel, timeout) frees
nothing and leaks nothing.

The policy, in order:

1. On arrival with an empty queue, the ledger decides as before: ADMITTED,
   CAPPED to what fits (the seed's rule, or the tenant's room), or REJECTED.
2. A request the ledger calls BUDGET_BUSY (its floor, or under STRICT and
   WAIT_FULL its whole reservation, fits a worker's whole capacity but not
   the free bytes now), or TENANT_QUOTA that its tenant's quota can hold,
   waits, unless the queue is full (QUEUE_FULL).
3. While anyone waits for the same model, a newcomer never goes ahead of them
   on arrival: it joins the queue and the next `pump` places it.
4. When bytes free up (release, expiry, a worker registering) `pump` serves
   each model's waiting requests in this order, with the ledger's one atomic
   decision each: first any that waited `aging_s` or more (by arrival); then
   the tenant whose leases hold the least per unit of weight (fair share), and
   within it the lowest `priority` (vLLM's convention: lower is sooner), then
   arrival. When the chosen one does not fit the pool, its model's line stops
   there (so a large or aged request is never starved by small ones behind it);
   when only its tenant's quota stops it, only that tenant's requests wait and
   the others go on. No preemption: an admitted request runs to completion.
5. When a request's wait runs out it gets one last attempt, wherever it
   stands (WAIT_FULL now accepts a cap): the one bounded exception to the
   order, at most once per request and only with bytes the others could not
   use. Otherwise it is refused with QUEUE_TIMEOUT (TENANT_QUOTA when its
   tenant's quota held it); a wait bounded by the call's own deadline ends as
   DEADLINE_EXCEEDED instead.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from scheduler_service.ledger import placement, sentences
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.ledger.rate import RateLimits
from scheduler_service.ledger.tickets import (  # noqa: F401 - re-exported: the queue's public face
    Bound,
    Mode,
    ModelQueueStats,
    Place,
    QueueStats,
    TenantQueueStats,
    Ticket,
    queue_deadline_exceeded,
)
from scheduler_service.ledger.types import (
    AdmissionDecision,
    AdmissionRequest,
    Cause,
    Decision,
    Rejection,
)

# Ledger causes that mean "could start later": the request keeps waiting.
_WAITABLE = (Cause.BUDGET_BUSY, Cause.NO_WORKER)


def _can_wait(rejection: Rejection) -> bool:
    """A newcomer's refusal that the queue can cure: the pool busy, or the tenant's room."""
    return (rejection.cause is Cause.BUDGET_BUSY or rejection.waits_for_tenant_room
            or rejection.waits_for_time)


class AdmissionQueue:
    """A bounded queue of tickets in front of a Ledger, served in the policy's order (module
    docstring). Thread-safe: one lock (taken before the ledger's)."""

    def __init__(self, ledger: Ledger, max_length: int = 256, max_wait_s: float = 30.0,
                 retry_after_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 aging_s: float = 10.0) -> None:
        if max_length < 0 or max_wait_s < 0 or aging_s < 0:
            raise ValueError(f"max_length ({max_length}), max_wait_s ({max_wait_s}) and aging_s "
                             f"({aging_s}) must be >= 0")
        self.ledger = ledger
        self.max_length = max_length
        self.max_wait_s = max_wait_s
        # A request waiting this long goes ahead of every priority and share (by arrival).
        self.aging_s = aging_s
        self.retry_after_s = retry_after_s
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: list[Ticket] = []
        self._rates = RateLimits()  # tenants' requests_per_s (one bucket each)
        self._seq = itertools.count()

    # -- arriving ------------------------------------------------------------------

    def submit(self, request: AdmissionRequest, mode: Mode = Mode.ALLOW,
               wait_s: float | None = None, deadline_s: float | None = None,
               lease_id: str = "") -> AdmissionDecision | Ticket:
        """Decide now (an Admission, reserved unless REJECTED) or wait (a Ticket).

        `wait_s` is the caller's own bound (None: the server's), `deadline_s`
        the time left on the call (None: no deadline). With `lease_id`, a session
        turn: it grows that lease on its own worker (Ledger.resize), in the same
        FIFO and under the same policy as a new request.
        """
        now = self._clock()
        with self._lock:
            tenant = self.ledger.tenants.get(request.tenant)
            if (wait_s_for_token := self._rates.take(tenant, now)) > 0:
                return self._rate_refusal(request, tenant, wait_s_for_token)
            line = self._line(request.model)
            waiting = bool(line)
            # The requests already in line come first: a wait for time counts them (time_budget).
            attempt = self._decide(self._effective(replace(request, queued_ahead=len(line)), mode),
                                   lease_id, dry_run=waiting)
            if (mode is Mode.WAIT_FULL and attempt.decision is Decision.REJECTED
                    and attempt.rejection.cause is Cause.EXCEEDS_CAPACITY):
                # Never whole on any worker: waiting for it is pointless, cap as ALLOW does.
                mode = Mode.ALLOW
                attempt = self._decide(request, lease_id, dry_run=waiting)
            if attempt.decision is Decision.REJECTED and not _can_wait(attempt.rejection):
                return attempt  # context, capacity, no worker, beyond its quota: waiting cannot help
            if not waiting and attempt.decision is not Decision.REJECTED:
                return attempt  # the empty-queue path: exactly the ledger's decision
            wait, bound = self._bound(mode, wait_s, deadline_s)
            needed = self._needed_bytes(request, mode, attempt)
            if wait <= 0:
                if attempt.decision is Decision.REJECTED:
                    return attempt
                return self._refusal(request, Cause.QUEUE_TIMEOUT, needed, mode,
                                     requests_ahead=len(line), waited_s=0.0, max_wait_s=0.0)
            if len(self._entries) >= self.max_length:
                return self._refusal(request, Cause.QUEUE_FULL, needed, mode)
            places = self._places_left(request.tenant)
            if places is not None and places <= 0:
                return self._refusal(request, Cause.QUEUE_FULL, needed, mode,
                                     tenant=request.tenant)
            ticket = Ticket(seq=next(self._seq), request=request, mode=mode, needed_bytes=needed,
                            enqueued_at=now, deadline=now + wait, bound=bound, lease_id=lease_id)
            self._entries.append(ticket)
            return ticket

    # -- serving -------------------------------------------------------------------

    def pump(self) -> list[Ticket]:
        """Serve each model's waiting requests in the policy's order while they fit, and end
        waits that ran out. Returns the tickets decided."""
        now = self._clock()
        done: list[Ticket] = []
        with self._lock:
            for ticket in [t for t in self._entries if now >= t.deadline]:
                self._entries.remove(ticket)
                self._time_out(ticket, now)
                done.append(ticket)
            blocked: set[str] = set()  # models whose next request does not fit the pool
            held_back: set[tuple[str, str]] = set()  # (model, tenant) at its quota
            while True:
                candidates = [t for t in self._entries if t.request.model not in blocked
                              and (t.request.model, t.request.tenant) not in held_back]
                if not candidates:
                    break
                order = self._order_key(now, self._held())
                head = min(candidates, key=order)
                attempt = self._attempt(head, final=False)
                if attempt.decision is Decision.REJECTED:
                    rejection = attempt.rejection
                    if rejection.waits_for_tenant_room:
                        held_back.add((head.request.model, head.request.tenant))
                        continue
                    if ((rejection.cause in _WAITABLE or rejection.waits_for_time)
                            and not (head.lease_id and rejection.cause is Cause.NO_WORKER)):
                        # It blocks its model's line (a session whose lease is gone never
                        # will fit, so it does not block).
                        blocked.add(head.request.model)
                        continue
                self._entries.remove(head)
                head.outcome = replace(attempt, queue_wait_s=now - head.enqueued_at)
                done.append(head)
        return done

    def cancel(self, ticket: Ticket) -> bool:
        """Take a ticket out of the queue. False when it had already left (see `ticket.outcome`)."""
        with self._lock:
            if ticket in self._entries:
                self._entries.remove(ticket)
                return True
            return False

    # -- reading -------------------------------------------------------------------

    def place(self, ticket: Ticket) -> Place | None:
        now = self._clock()
        with self._lock:
            if ticket not in self._entries:
                return None
            line = sorted(self._line(ticket.request.model),
                          key=self._order_key(now, self._held()))
            index = line.index(ticket)  # its place in its model's line, in serving order
            return Place(position=index + 1, requests_ahead=index,
                         bytes_ahead=sum(t.needed_bytes for t in line[:index]),
                         needed_bytes=ticket.needed_bytes, waited_s=now - ticket.enqueued_at,
                         max_wait_s=ticket.max_wait_s, queue_length=len(self._entries))

    def stats(self) -> QueueStats:
        now = self._clock()
        with self._lock:
            return QueueStats(
                length=len(self._entries),
                oldest_wait_s=now - self._entries[0].enqueued_at if self._entries else 0.0,
                waiting_bytes=sum(t.needed_bytes for t in self._entries),
                max_length=self.max_length, max_wait_s=self.max_wait_s)

    def tenant_stats(self) -> dict[tuple[str, str], TenantQueueStats]:
        """(tenant, model) -> its waiting requests."""
        with self._lock:
            stats: dict[tuple[str, str], TenantQueueStats] = {}
            for t in self._entries:
                key = (t.request.tenant, t.request.model)
                was = stats.get(key, TenantQueueStats())
                stats[key] = TenantQueueStats(was.length + 1, was.waiting_bytes + t.needed_bytes)
            return stats

    def model_stats(self, models: list[str]) -> dict[str, ModelQueueStats]:
        """model -> its waiting requests, for each of `models`. A request that named no model
        ("") waits for any worker, so it counts for every model."""
        with self._lock:
            stats = {}
            for model in models:
                line = [t for t in self._entries if t.request.model in (model, "")]
                adapters = tuple(sorted({t.request.adapter for t in line if t.request.adapter}))
                stats[model] = ModelQueueStats(len(line), adapters)
            return stats

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    # -- internals (lock held) -----------------------------------------------------

    def _line(self, model: str) -> list[Ticket]:
        """The waiting tickets for `model`, in arrival order: the line a request of it joins."""
        return [t for t in self._entries if t.request.model == model]

    def _held(self) -> dict[tuple[str, str], int]:
        """What each (tenant, model) holds, for the fair share; nothing to look up without tenants."""
        return self.ledger.tenant_reserved() if self.ledger.tenants.enabled else {}

    def _share_of_places(self, tenant: str) -> int:
        """The queue places kept for `tenant`: its weighted share of max_length. Calls charged
        to no tenant ("") share as one more tenant of weight 1."""
        table = self.ledger.tenants
        total = sum(t.weight for t in table.tenants.values()) + 1.0
        return max(1, math.floor(self.max_length * table.weight(tenant) / total))

    def _places_left(self, tenant: str) -> int | None:
        """Places `tenant` may still take (None: no tenants). Each tenant may always fill its
        own share; beyond it, only places no other tenant's unused share needs, so a tenant
        flooding the queue never turns another away with QUEUE_FULL."""
        table = self.ledger.tenants
        if not table.enabled:
            return None
        waiting: dict[str, int] = {}
        for t in self._entries:
            waiting[t.request.tenant] = waiting.get(t.request.tenant, 0) + 1
        own = self._share_of_places(tenant) - waiting.get(tenant, 0)
        kept = sum(max(0, self._share_of_places(other) - waiting.get(other, 0))
                   for other in [*table.tenants, ""] if other != tenant)
        return max(own, self.max_length - len(self._entries) - kept)

    def _order_key(self, now: float, held: dict[tuple[str, str], int]):
        """The serving order (lowest first): aged by arrival; then the tenant's held bytes
        per unit of weight, the priority, the arrival."""
        weight = self.ledger.tenants.weight

        def key(t: Ticket) -> tuple:
            if now - t.enqueued_at >= self.aging_s:
                return (0, 0.0, 0, t.seq)
            r = t.request
            return (1, held.get((r.tenant, r.model), 0) / weight(r.tenant), r.priority, t.seq)
        return key

    @staticmethod
    def _effective(request: AdmissionRequest, mode: Mode, final: bool = False) -> AdmissionRequest:
        if mode is Mode.WAIT_FULL:
            return replace(request, strict=not final)
        return replace(request, strict=mode is Mode.STRICT)

    def _decide(self, request: AdmissionRequest, lease_id: str,
                dry_run: bool = False) -> AdmissionDecision:
        if lease_id:
            return self.ledger.resize(lease_id, request, dry_run=dry_run)
        return self.ledger.admit(request, dry_run=dry_run)

    def _attempt(self, ticket: Ticket, final: bool) -> AdmissionDecision:
        # Its time in line is spent of its TTFT goal (time_budget.check counts it).
        request = replace(ticket.request, queue_waited_s=self._clock() - ticket.enqueued_at)
        attempt = self._decide(self._effective(request, ticket.mode, final), ticket.lease_id)
        if (ticket.mode is Mode.WAIT_FULL and attempt.decision is Decision.REJECTED
                and attempt.rejection.cause is Cause.EXCEEDS_CAPACITY):
            ticket.mode = Mode.ALLOW  # a worker left: whole is out of reach now
            attempt = self._decide(self._effective(request, ticket.mode), ticket.lease_id)
        return attempt

    def _time_out(self, ticket: Ticket, now: float) -> None:
        waited = now - ticket.enqueued_at
        if ticket.bound is Bound.DEADLINE and ticket.mode is not Mode.WAIT_FULL:
            ticket.deadline_exceeded = True  # the caller is gone: admitting now would be wasted
            return
        attempt = self._attempt(ticket, final=True)
        if attempt.decision is not Decision.REJECTED:
            ticket.outcome = replace(attempt, queue_wait_s=waited)
            return
        if attempt.rejection.cause not in _WAITABLE:
            # TENANT_QUOTA included: its own numbers say why better than a queue timeout.
            ticket.outcome = replace(attempt, queue_wait_s=waited)
            return
        ahead = [t for t in self._line(ticket.request.model) if t.seq < ticket.seq]
        ticket.outcome = replace(self._refusal(
            ticket.request, Cause.QUEUE_TIMEOUT, ticket.needed_bytes, ticket.mode,
            requests_ahead=len(ahead), waited_s=waited, max_wait_s=ticket.max_wait_s,
            bytes_ahead=sum(t.needed_bytes for t in ahead)),
            queue_wait_s=waited)

    def _bound(self, mode: Mode, wait_s: float | None, deadline_s: float | None) -> tuple[float, Bound]:
        bounds = [(self.max_wait_s, Bound.SERVER)]
        if wait_s is not None:
            bounds.append((wait_s, Bound.CALLER))
        if deadline_s is not None:
            # NOTE: WAIT_FULL stops waiting for the whole at half the deadline, so the
            # capped answer it then accepts still has time to run.
            bounds.append((deadline_s / 2 if mode is Mode.WAIT_FULL else deadline_s, Bound.DEADLINE))
        wait, bound = min(bounds, key=lambda b: b[0])
        return max(wait, 0.0), bound

    def _needed_bytes(self, request: AdmissionRequest, mode: Mode,
                      attempt: AdmissionDecision) -> int:
        """What the ticket waits for: ALLOW its floor; STRICT and WAIT_FULL the whole reservation."""
        if attempt.decision is not Decision.REJECTED:
            if mode is Mode.ALLOW:
                return attempt.worker.bytes_for(request.prompt_tokens + request.floor_new_tokens)
            return attempt.reserved_bytes
        rejection = attempt.rejection
        if mode is Mode.ALLOW or rejection.cap_refused:
            return rejection.needed_bytes  # the floor; or, cap refused, already the whole
        # Not even the floor fits now, so the ledger's BUDGET_BUSY names the floor's bytes;
        # this ticket waits for the whole. The whole is the floor of the same request asked
        # whole (min_new_tokens = the resolved ceiling): the ledger's own arithmetic, on the
        # worker it would choose.
        whole_new = rejection.requested_max_new_tokens
        whole = self.ledger.admit(replace(request, max_new_tokens=whole_new, min_new_tokens=whole_new,
                                          strict=True), dry_run=True)
        if whole.decision is not Decision.REJECTED:
            return whole.reserved_bytes  # bytes freed since the first look: the whole fits now
        return max(whole.rejection.needed_bytes, rejection.needed_bytes)

    @staticmethod
    def _rate_refusal(request: AdmissionRequest, tenant, wait_s: float) -> AdmissionDecision:
        rejection = sentences.rendered(Rejection(
            cause=Cause.TENANT_RATE, prompt_tokens=request.prompt_tokens,
            min_new_tokens=request.min_new_tokens, retry_after_s=wait_s, tenant=tenant.name,
            tenant_requests_per_s=tenant.requests_per_s, tenant_burst=tenant.burst))
        return AdmissionDecision(decision=Decision.REJECTED, request_id=request.request_id,
                         prompt_tokens=request.prompt_tokens, rejection=rejection,
                         tenant=request.tenant)

    def _refusal(self, request: AdmissionRequest, cause: Cause, needed: int, mode: Mode,
                 requests_ahead: int = 0, waited_s: float = 0.0, max_wait_s: float = 0.0,
                 bytes_ahead: int | None = None, tenant: str = "") -> AdmissionDecision:
        workers = placement.serving(self.ledger.snapshot(), request.model)
        widest = max(workers, key=lambda w: w.geometry.capacity_bytes, default=None)
        rejection = sentences.rendered(Rejection(
            cause=cause, prompt_tokens=request.prompt_tokens, min_new_tokens=request.min_new_tokens,
            requested_max_new_tokens=request.requested_new_tokens(
                widest.geometry.context_length if widest else 0)[0],
            cap_refused=mode is not Mode.ALLOW, needed_bytes=needed,
            available_bytes=max((w.available_bytes for w in workers), default=0),
            capacity_bytes=widest.geometry.capacity_bytes if widest else 0,
            bytes_per_token=widest.geometry.bytes_per_token if widest else 0,
            context_length=widest.geometry.context_length if widest else 0,
            retry_after_s=self.retry_after_s, queue_length=len(self._entries),
            max_queue_length=self.max_length, requests_ahead=requests_ahead,
            bytes_ahead=(sum(t.needed_bytes for t in self._entries) if bytes_ahead is None
                         else bytes_ahead),
            waited_s=waited_s, max_queue_wait_s=max_wait_s,
        ))
        if tenant:  # QUEUE_FULL for the tenant's share of the places, not the whole queue
            rejection = sentences.rendered(replace(
                rejection, tenant=tenant,
                queue_length=sum(1 for t in self._entries if t.request.tenant == tenant),
                max_queue_length=self._share_of_places(tenant)))
        return AdmissionDecision(decision=Decision.REJECTED, request_id=request.request_id,
                         prompt_tokens=request.prompt_tokens, rejection=rejection,
                         tenant=request.tenant)
