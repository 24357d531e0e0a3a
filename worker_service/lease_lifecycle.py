"""A lease's life on the worker: claim -> check -> submit -> events -> cancel/drain -> release.

No path bypasses admission: a sequence runs only under a lease the
scheduler's ledger holds for this worker. The release happens exactly once,
on every exit, and only after the engine has freed the sequence's KV, so the
ledger never offers bytes this worker still holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import grpc
import structlog

from ortserve.process import tracing
from ortserve.rpc.error_path import Relayed
from ortserve.rules import request_rules
from ortserve.status.errors import quoted
from ortserve.v1 import types_pb2
from worker_service.core.errors import (
    LeaseInUse,
    LeaseMismatch,
    LeaseNotRestored,
    NoLiveLease,
    SchedulerUnreachable,
)
from worker_service.core.prefill_budget import strictest_goal_ms
from worker_service.core.sequence import TERMINAL, Completed, Event, SequenceRequest, TokenDelta
from worker_service.engine.engine import Engine
from worker_service.engine.event_mailbox import EventMailbox, coalesced
from worker_service.scheduler_link import SchedulerLink
from worker_service.session_lease_table import SessionLeaseTable

log = structlog.get_logger("worker")

CANCEL_WAIT_S = 30.0  # a cancelled sequence leaves within one step; this bounds a stuck one


def check_against_lease(req: SequenceRequest, max_new_was_set: bool,
                        lease: types_pb2.Lease) -> SequenceRequest:
    """The request with the lease's ceiling and gap goal; raises LeaseMismatch when it is not
    the one admitted (the rule the scheduler's ClaimLease applies too:
    ortserve.rules.request_rules).

    The gap goal is the strictest of the request's own and the lease's (the scheduler's
    resolution, its --max-itl-ms for a request that set none): the prompt chunks beside
    this stream's decode are held to it (core/prefill_budget.py)."""
    request_rules.lease_match(lease.lease_id, req.prompt_tokens,
                              req.max_new_tokens if max_new_was_set else 0,
                              lease.prompt_tokens, lease.max_new_tokens)
    goal_ms = strictest_goal_ms((req.max_itl_ms, lease.max_itl_ms))
    if goal_ms != req.max_itl_ms:
        req = req.with_max_itl_ms(goal_ms)
    return req if max_new_was_set else req.with_max_new_tokens(lease.max_new_tokens)


def record_sequence_spans(req: SequenceRequest, done: Completed) -> None:
    """The sequence's time on the engine's thread as spans of the worker's Generate:
    `engine_queue` (arrival, claim included, to its first step), `prefill` (to its first
    token) and `decode` (to its last), timed by the sequence itself (core/sequence.py)."""
    if not tracing.enabled():
        return
    arrived_ns = tracing.wall_ns(req.arrived_at)
    prefill_ns = arrived_ns + int(done.queue_ms * 1e6)
    first_ns = arrived_ns + int(done.ttft_ms * 1e6)
    tracing.record("engine_queue", arrived_ns, prefill_ns)
    tracing.record("prefill", prefill_ns, first_ns, prompt_tokens=done.prompt_tokens,
                   reused_prompt_tokens=done.reused_prompt_tokens)
    tracing.record("decode", first_ns, first_ns + int(done.decode_ms * 1e6),
                   generated_tokens=done.generated_tokens,
                   finish_reason=done.finish_reason.value,
                   decode_tokens_per_s=round(done.decode_tokens_per_s, 1))
    tracing.annotate(**{"gen_ai.usage.input_tokens": done.prompt_tokens,
                        "gen_ai.usage.output_tokens": done.generated_tokens,
                        "gen_ai.response.finish_reasons": (done.finish_reason.value,)})


class LeaseStream:
    """One claimed lease's sequence: its events, and the exit that frees and releases."""

    def __init__(self, lifecycle: LeaseLifecycle, lease: types_pb2.Lease,
                 req: SequenceRequest, session_id: str = "", stream_interval_s: float = 0.0) -> None:
        self.lease = lease
        self.request = req
        # GenerateRequest.stream_interval_ms: the shortest time between two token chunks.
        self.stream_interval_s = stream_interval_s
        # A session turn keeps its lease: its exit shrinks it to what the session holds.
        self.session_id = session_id
        self._shrunk = False
        self._lifecycle = lifecycle
        self._queued: list[Event] = []  # arrived, not yet read (the loop's thread only)
        self._wake: asyncio.Future | None = None  # the reader waiting for _queued
        self._holding = False  # the reader holds tokens for the interval: only an end wakes it
        self._handle = None
        self._ended = False  # the engine's terminal event for this sequence has been read
        # ... or has arrived (its KV is freed before it is sent): a reader cancelled while
        # it held a taken batch never reads the terminal event that batch carried.
        self._engine_done = False
        # How it ended, for the release (ReleaseRequest.outcome, cause, finished): the
        # servicer sets it as the events go out; a stream closed before that was left.
        self.ended_as: tuple[str, str] = ("cancelled", "")
        self.finished: types_pb2.Finished | None = None
        self.log = log.bind(lease_id=lease.lease_id, worker_id=lifecycle.worker_id,
                            request_id=req.request_id)

    def _submit(self, engine: Engine) -> None:
        post, arrived = self._lifecycle.mailbox().post, self._arrived
        self._handle = engine.submit(self.request, lambda event: post(arrived, event),
                                     session_id=self.session_id, checked=True)  # open checked it

    def _arrived(self, event: Event) -> None:
        if isinstance(event, TERMINAL):
            self._engine_done = True
        self._queued.append(event)
        if self._wake is not None and not self._wake.done() and (
                not self._holding or isinstance(event, TERMINAL)):
            self._wake.set_result(None)

    async def _take(self, timeout_s: float | None = None) -> list[Event]:
        """Everything queued now (waiting for at least one event, up to `timeout_s`)."""
        if not self._queued:
            self._wake = asyncio.get_running_loop().create_future()
            try:
                await (self._wake if timeout_s is None else asyncio.wait_for(self._wake, max(timeout_s, 0.0)))
            finally:
                self._wake = None
        taken, self._queued = self._queued, []
        return taken

    async def _hold(self, until_s: float) -> None:
        """Let tokens gather until `until_s` (loop time); the sequence's end cuts it short."""
        loop = asyncio.get_running_loop()
        if any(isinstance(e, TERMINAL) for e in self._queued) or until_s <= loop.time():
            return
        self._holding = True
        self._wake = loop.create_future()
        handle = loop.call_at(until_s, lambda wake=self._wake: wake.done() or wake.set_result(None))
        try:
            await self._wake
        finally:
            handle.cancel()
            self._wake = None
            self._holding = False

    async def events(self) -> AsyncIterator[Event]:
        """The engine's events, up to and including the terminal one; the tokens that
        queued up while the reader was busy come as one TokenDelta (coalesced).

        With a stream interval, a token chunk leaves at most once per interval: after
        one is sent, the next waits out the interval, gathering tokens meanwhile. The
        first chunk is never held (TTFT unchanged), nor the end.
        """
        interval_s = self.stream_interval_s
        next_chunk_s = 0.0  # loop time before which no token chunk leaves (after the first)
        while not self._ended:
            if interval_s and next_chunk_s:
                await self._hold(next_chunk_s)
            for event in coalesced(await self._take()):
                self._ended = isinstance(event, TERMINAL)
                if self._ended and isinstance(event, Completed):
                    record_sequence_spans(self.request, event)
                if interval_s and type(event) is TokenDelta:
                    next_chunk_s = asyncio.get_running_loop().time() + interval_s
                yield event
                if self._ended:
                    return

    async def close(self) -> None:
        """Cancel if still running, wait until the KV is freed, then release the lease once."""
        try:
            if self._handle is not None and not self._ended:
                if self._engine_done:
                    # NOTE: not a drain: the terminal event may sit in a batch the cancelled
                    # reader took and dropped; waiting for it held the lease for 30 s.
                    self._ended = True
                else:
                    self._handle.cancel()
                    await self._drain()
        finally:
            self._lifecycle._live.pop(self.lease.lease_id, None)
            if self.session_id:
                await self._lifecycle.sessions.end_turn(self)
            else:
                outcome, cause = self.ended_as
                freed = await self._lifecycle.link.release(self.lease.lease_id, outcome, cause,
                                                           self.finished)
                self.log.info("lease released", freed_bytes=freed)

    async def shrink(self) -> None:
        """A session turn ended (the engine already shrank its charge): shrink the lease to
        what the session holds, once. The servicer calls it before Finished goes out."""
        if self._shrunk or not self._ended:
            return  # not ended: close() drains first, then shrinks
        self._shrunk = True
        await self._lifecycle.sessions.shrink_to_held(self.session_id, self.lease.lease_id, self.log)

    async def _drain(self) -> None:
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                if any(isinstance(e, TERMINAL) for e in await self._take(deadline - time.monotonic())):
                    self._ended = True
                    return
        self.log.error("engine did not end a cancelled sequence in time", wait_s=CANCEL_WAIT_S)


class LeaseLifecycle:
    """The worker's live leases and the one way a sequence starts."""

    def __init__(self, worker_id: str, engine: Engine, link: SchedulerLink) -> None:
        self.worker_id = worker_id
        self.engine = engine
        self.link = link
        self._live: dict[str, types_pb2.Lease] = {}  # claimed, sequence submitted
        self._busy: set[str] = set()  # lease ids being opened or served
        # The open sessions' leases, kept across turns (session_lease_table.py).
        self.sessions = SessionLeaseTable(engine, link)
        self._mailbox: EventMailbox | None = None

    def mailbox(self) -> EventMailbox:
        """The engine -> event loop hand-off, made on the serving loop (the first submit's)."""
        if self._mailbox is None:
            self._mailbox = EventMailbox(asyncio.get_running_loop())
        return self._mailbox

    def stop_unrestored(self, lease_ids: list[str]) -> list[str]:
        """After a registration: stop the running sequences whose leases the ledger refused
        to restore (their KV would be held uncharged); their streams end LEASE_NOT_FOUND and
        free the KV. Sessions' leases go through WorkerSessions.drop. Returns those stopped."""
        stopped = []
        for lease_id in lease_ids:
            if lease_id in self._live and self.engine.stop_sequence(
                    lease_id, LeaseNotRestored(lease_id, self.worker_id)):
                stopped.append(lease_id)
        return stopped

    def busy(self, lease_id: str) -> bool:
        """Whether a sequence is being opened or served under `lease_id` now (a session's
        lease: a turn is opening, running or shrinking)."""
        return lease_id in self._busy

    def live_leases(self) -> list[types_pb2.Lease]:
        """Leases this worker holds bytes for: running sequences and open sessions (the
        heartbeat reports them; a claimed lease it left out would be released)."""
        live = dict(self._live)
        for lease in self.sessions.leases.values():
            live.setdefault(lease.lease_id, lease)
        return list(live.values())

    @contextlib.asynccontextmanager
    async def open(self, lease_id: str, req: SequenceRequest, max_new_was_set: bool,
                   session_id: str = "", stream_interval_ms: int = 0) -> AsyncIterator[LeaseStream]:
        """Claim the lease, check the request against it and start the sequence.

        Raises before anything is held when the model cannot serve the request
        (Engine.check), the lease is not live (NoLiveLease) or the request does not
        match it (LeaseMismatch; the lease stays usable).
        With `session_id`, a turn of that open session under its lease;
        `stream_interval_ms`: the request's shortest time between token chunks.
        """
        if session_id:
            self.sessions.check_turn(session_id, lease_id, lease_id in self._busy)
        if lease_id in self._busy:
            raise LeaseInUse(lease_id)
        # The model's rules (vocabulary, context window), once, before the lease is
        # touched: a refused request leaves it usable. The lease's ceiling below only
        # lowers max_new_tokens or sets the one admitted within this model's window.
        self.engine.check(req)
        self._busy.add(lease_id)  # before any await: a second call on this lease is refused
        try:
            lease = await self._claim(lease_id, req, max_new_was_set)
            try:
                req = check_against_lease(req, max_new_was_set, lease)
            except LeaseMismatch:
                if session_id:
                    raise  # the session keeps its lease
                # The ledger checks the numbers before claiming; an older scheduler does
                # not, and then the claimed lease must go back rather than linger.
                await self.link.release(lease.lease_id)
                raise
            stream = LeaseStream(self, lease, req, session_id, stream_interval_ms / 1e3)
            if session_id:
                self.sessions.leases[session_id] = lease
            self._live[lease.lease_id] = lease
            try:
                stream._submit(self.engine)
                stream.log.info("sequence started", prompt_tokens=req.prompt_tokens,
                                max_new_tokens=req.max_new_tokens,
                                capped=lease.HasField("budget_cap"))
                yield stream
            finally:
                await stream.close()
        finally:
            self._busy.discard(lease_id)

    async def _claim(self, lease_id: str, req: SequenceRequest,
                     max_new_was_set: bool) -> types_pb2.Lease:
        try:
            # The scheduler's ClaimLease call (a grpc client span) is this span's child.
            with tracing.span("claim", lease_id=lease_id, prompt_tokens=req.prompt_tokens):
                return await self.link.claim(lease_id, req.prompt_tokens,
                                             req.max_new_tokens if max_new_was_set else 0)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                # The ledger refused the numbers without claiming: the lease stays usable.
                # Its status (reason LEASE_MISMATCH, the field, the numbers) goes on as is.
                raise Relayed(error, f"worker {self.worker_id}: {error.details()}") from error
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise NoLiveLease(lease_id, self.worker_id, error.details() or "") from error
            raise SchedulerUnreachable(
                f"worker {self.worker_id} could not check lease {quoted(lease_id)} with the "
                f"scheduler at {self.link.address} ({error.code().name}: {error.details()}); "
                "retry shortly") from error
