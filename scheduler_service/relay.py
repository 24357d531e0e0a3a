"""One relay for Scheduler.Generate and SessionTurn: the worker's stream passed on to
the caller, the timings composed once, every exit clean.

Generate (servicer.py) and SessionTurn (sessions/turn.py) differ only in what
they do around a stream (a one-shot lease released if no worker claimed it; a
session's conversation remembered at Finished): they hand that in as a Leg's
callbacks, and this module does the rest, once. Everything runs on the
server's event loop; the wait in the admission queue before it is queue_wait.py's.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ortserve.rpc.error_path import (
    STATUS_DETAILS_KEY,
    Relayed,
    is_worker_failure,
    not_reached,
    reason_of,
    worker_failure,
)
from ortserve.rpc.relay_frames import ADMISSION_TAG, CHUNK_TAG, chunk_tokens
from ortserve.rpc.worker_leg import (
    compose_timings,
    failure_message,
    lease_lost,
    worker_failed_message,
)
from ortserve.status.errors import ErrorReason, clip
from ortserve.v1 import types_pb2, worker_pb2
from scheduler_service import convert
from scheduler_service.ledger.types import AdmissionDecision
from scheduler_service.worker_clients import RelayingWorkerStub


@dataclass
class RelayedCounts:
    """What this scheduler relayed, over its life (its metrics read it): token chunks sent on
    to callers and the tokens in them."""

    messages: int = 0
    tokens: int = 0


RELAYED = RelayedCounts()

# -- the worker's stream ------------------------------------------------------------


@dataclass(frozen=True)
class Leg:
    """One admitted stream's worker side, and what its caller adds around the relay."""

    worker_id: str
    address: str
    stub: RelayingWorkerStub
    request: worker_pb2.WorkerGenerateRequest
    bound: Any  # the structlog logger bound to the request, lease and worker
    # The caller's bookkeeping on the worker's Finished, after the timings are
    # composed and before it is sent on (it may fill in more of it).
    on_finished: Callable[[types_pb2.Finished], None]
    on_chunk: Callable[[types_pb2.TokenChunk], None] | None = None
    # Run last on every exit, after the worker call is cancelled; its argument
    # says the worker was called and sent no Finished (the stream ended early).
    on_exit: Callable[[bool], Awaitable[None]] | None = None
    # The next step for a caller whose worker died mid-stream (UNAVAILABLE);
    # None: the worker's failure passes on named by the worker only.
    if_worker_dies: str | None = None


# A second placement for a request whose worker could not be reached: its Admission
# and Leg on another worker, or None where none takes it (the first failure stands).
Replace = Callable[[], Awaitable[tuple[AdmissionDecision, Leg] | None]]


class _Unreached(Exception):
    """The worker failed before it sent anything: the failure as it would pass on."""

    def __init__(self, failure: Exception) -> None:
        super().__init__(str(failure))
        self.failure = failure


def unreached(error: grpc.aio.AioRpcError, frames: int) -> bool:
    """Whether a worker call failed before the worker answered at all: no frame came and
    the transport said UNAVAILABLE with no status details of the worker's own (connection
    refused, its port closed). Such a request never started: it may be placed again."""
    return frames == 0 and not_reached(error)


async def relay(admission: AdmissionDecision, leg: Leg, arrived_s: float,
                time_remaining: Callable[[], float | None],
                replace: Replace | None = None,
                on_unreached: Callable[[Leg], None] = lambda leg: None,
                ) -> AsyncIterator[types_pb2.GenerateEvent | bytes]:
    """Our Admission first (its BudgetCap before any token), then the worker's stream.

    The worker's own Admission is dropped (the caller has ours), its Finished
    gets the timings from `arrived_s` (perf_counter) and the caller's
    bookkeeping, its failure our message. Token chunks pass on as the bytes the
    worker sent (the server's stream serializer sends bytes unchanged): parsed
    only for a leg that reads them (on_chunk). The worker call is cancelled on
    every exit, so a client's cancel reaches the worker at once.

    With `replace` (a request not pinned to its worker), our Admission waits for the
    worker's first frame: a worker that cannot be reached (`unreached`) is reported to
    `on_unreached`, its leg exits (its on_exit releases what it held, once) and the
    request is placed once more through `replace`; the caller sees only the Admission
    of the worker that serves it.
    """
    # aclosing: a caller's exit runs the leg's exit (the worker call cancelled, the lease
    # released) at once, not when the inner generator is collected.
    try:
        async with contextlib.aclosing(_relay_leg(
                admission, leg, arrived_s, time_remaining,
                defer=replace is not None, replaceable=replace is not None)) as items:
            async for item in items:
                yield item
        return
    except _Unreached as first:
        on_unreached(leg)
        second = await replace() if replace is not None else None
        if second is None:
            raise first.failure from None
        leg.bound.info("placed again after the worker could not be reached",
                       worker_id=second[1].worker_id)
    admission, leg = second
    async with contextlib.aclosing(_relay_leg(admission, leg, arrived_s, time_remaining,
                                              defer=True, replaceable=False)) as items:
        async for item in items:
            yield item


async def _relay_leg(admission: AdmissionDecision, leg: Leg, arrived_s: float,
                     time_remaining: Callable[[], float | None], defer: bool, replaceable: bool,
                     ) -> AsyncIterator[types_pb2.GenerateEvent | bytes]:
    """One worker's stream; `defer`: our Admission goes just before its first frame;
    `replaceable`: a worker not reached raises _Unreached (after the leg's exit ran)."""
    call = None
    finished = False
    relayed_tokens = 0
    frames = 0
    ours = types_pb2.GenerateEvent(admission=convert.admission_to_pb(admission))
    try:
        if not defer:
            yield ours
        call = leg.stub.Generate(leg.request, timeout=time_remaining())
        relay_offset_ms = (time.perf_counter() - arrived_s) * 1e3
        async for frame in call:
            frames += 1
            if frames == 1 and defer:
                yield ours
            tag = frame[0] if frame else 0
            if tag == CHUNK_TAG:
                tokens = chunk_tokens(frame)
                relayed_tokens += tokens
                RELAYED.messages += 1
                RELAYED.tokens += tokens
                if leg.on_chunk is not None:
                    leg.on_chunk(types_pb2.GenerateEvent.FromString(frame).chunk)
                yield frame
            elif tag == ADMISSION_TAG:
                continue  # the client already has ours, first
            else:
                event = types_pb2.GenerateEvent.FromString(frame)
                if event.WhichOneof("event") == "finished":
                    compose_timings(event.finished.timings, arrived_s, relay_offset_ms)
                    leg.on_finished(event.finished)
                    finished = True
                yield event
        if frames == 0 and defer:
            yield ours  # a stream with nothing in it: the caller still learns its admission
    except grpc.aio.AioRpcError as error:
        leg.bound.warning("worker call failed", code=error.code().name,
                          details=clip(error.details(), 300))
        failure = _failure(leg, error, relayed_tokens)
        if replaceable and unreached(error, frames):
            raise _Unreached(failure) from None
        raise failure from None
    finally:
        if call is not None and not call.done():
            call.cancel()  # propagates a client cancel to the worker
        if leg.on_exit is not None:
            await leg.on_exit(call is not None and not finished)


def _failure(leg: Leg, error: grpc.aio.AioRpcError, relayed_tokens: int) -> Exception:
    """A failed worker call as it passes on: WORKER_FAILED where the worker failed."""
    # NOTE: the lease of a relayed request is ours; a worker that finds it gone took
    # the request only after its lease expired (it stopped answering past the lease
    # TTL): the worker failing, not the caller's lease to admit again.
    lost = relayed_tokens == 0 and reason_of(error) == ErrorReason.LEASE_NOT_FOUND.value
    if relayed_tokens and reason_of(error) == ErrorReason.LEASE_NOT_FOUND.value:
        # Mid-stream: the worker re-registered and the ledger did not take the lease back
        # (LeaseNotRestored). The request was sound: LEASE_LOST, retryable, as the two-step
        # path answers it (ortserve.rpc.worker_leg.lease_lost), never the caller's NOT_FOUND.
        status = lease_lost(error, types_pb2.Admission(
            lease_id=leg.request.lease_id, worker_id=leg.worker_id, worker_address=leg.address),
            relayed_tokens)
        relayed = Relayed(error, status.details())
        relayed.code = status.code()
        relayed.status_bin = dict(status.trailing_metadata())[STATUS_DETAILS_KEY]
        return relayed
    if leg.if_worker_dies is not None and (is_worker_failure(error) or lost):
        why = ("its lease expired before the worker took the request (the worker did not "
               "answer for longer than the lease TTL)" if lost else clip(error.details(), 300))
        return worker_failure(
            error, worker_failed_message(leg.worker_id, leg.address, relayed_tokens, why,
                                         leg.if_worker_dies),
            leg.worker_id, leg.address, relayed_tokens)
    return Relayed(error, failure_message(leg.worker_id, leg.address, error, relayed_tokens, None))

