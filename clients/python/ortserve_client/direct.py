"""The two-step path, the client's default: Scheduler.Admit, then Worker.Generate on the
worker's address.

The scheduler then relays no token: it admits (reserving the lease, deciding
the cap, queueing as Generate would) and the worker streams to the caller
directly, which costs the scheduler ~10x less CPU per token. What the caller
sees is what the relayed path gives: the Admission (with its BudgetCap) before
any token, the chunks, a Finished with the timings composed once from the
caller's start, the same exceptions (a REJECTED Admit becomes the status
Scheduler.Generate ends with; a worker's failure is re-labelled as the
scheduler's relay re-labels it). The lease is released on every exit that the
worker did not take over: a lease the worker never claimed (it was unreachable,
refused the request, the caller cancelled first) goes back with
Scheduler.Release and the Admit's lease secret; a claimed one is the worker's
to release, once its KV is freed (the ledger frees a lease once, whoever asks).

The caller must reach the workers' addresses (as they registered them); with
TLS, a worker's port is mutual TLS, so the caller needs a certificate the
cluster's CA signed (docs/operations/security.md). Where it cannot (a worker's address not
routable from the caller's network), the client's default (`Client(direct=None)`)
gives the lease back and has the scheduler relay the request instead
(`relay_if_unreachable`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from ortserve.rpc.worker_leg import (
    SERVER_BOUND_MS,
    StatusError,
    compose_timings,
    rejection_status,
    relabelled,
    stream_deadline_ms,
    worker_failure,
    worker_request,
)
from ortserve.v1 import scheduler_pb2, types_pb2, worker_pb2_grpc

_ADMIT_PREFIX = "request."  # Admit names fields under AdmitRequest.request; Generate does not


class DirectCall:
    """One two-step generation, iterated like Scheduler.Generate's call (GenerateEvents;
    failures raised as grpc.RpcError), with `cancel()`. Blocking; any thread may cancel."""

    def __init__(self, scheduler, worker_stub: Callable[[str], worker_pb2_grpc.WorkerStub],
                 request: types_pb2.GenerateRequest, timeout_s: float | None,
                 metadata, relay_if_unreachable: Callable[[str], bool] | None = None) -> None:
        self._scheduler = scheduler  # a SchedulerStub
        self._worker_stub = worker_stub  # address -> a WorkerStub on a cached channel
        # address -> whether this client can reach that worker; None: never relay instead.
        self._reachable = relay_if_unreachable
        self._relayed = None  # Scheduler.Generate's call, when the worker was unreachable
        self._request = request
        self._deadline = time.monotonic() + timeout_s if timeout_s is not None else None
        self._metadata = metadata
        self._lock = threading.Lock()
        self._admission: types_pb2.Admission | None = None
        self._admitting = None  # the Admit call's future, while it runs (a cancel ends it)
        self._call = None  # the Worker.Generate call, once started
        self._worker_took_it = False  # its Admission arrived: the worker claimed the lease
        self._finished = False
        self._settled = False  # released (or the worker's), once
        self._cancelled = False

    def _remaining(self) -> float | None:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def cancel(self) -> None:
        """End the call now: the worker's stream is cancelled (the worker frees its KV and
        releases the lease it claimed); a lease no worker claimed is released here."""
        with self._lock:
            self._cancelled = True
            call, admitting, relayed = self._call, self._admitting, self._relayed
        if admitting is not None:
            admitting.cancel()  # waiting in the admission queue: it leaves, holding nothing
        for running in (call, relayed):
            if running is not None:
                running.cancel()
        self._settle()

    def __iter__(self) -> Iterator[types_pb2.GenerateEvent]:
        started = time.perf_counter()
        try:
            admission = self._admit()
            if self._reachable is not None and not self._reachable(admission.worker_address):
                yield from self._relay()
                return
            yield types_pb2.GenerateEvent(admission=admission)
            yield from self._stream(admission, started)
        finally:
            with self._lock:
                call, relayed = self._call, self._relayed
            for running in (call, relayed):
                if running is not None and not self._finished:
                    running.cancel()  # an early exit: the worker's stream ends now
            self._settle()

    def _admit(self) -> types_pb2.Admission:
        inner = self._request
        wait_ms = inner.max_queue_wait_ms if inner.HasField("max_queue_wait_ms") else SERVER_BOUND_MS
        with self._lock:
            if self._cancelled:
                raise StatusError(grpc.StatusCode.CANCELLED, "the caller cancelled the generation")
            remaining_s = self._remaining()
            # The worker's stream has what is left of the one deadline: said, so a time cap
            # fits max_new_tokens to it as a relayed Generate's is.
            self._admitting = self._scheduler.Admit.future(
                scheduler_pb2.AdmitRequest(request=inner, max_queue_wait_ms=wait_ms,
                                           stream_deadline_ms=stream_deadline_ms(remaining_s)),
                timeout=remaining_s, metadata=self._metadata)
        try:
            admission = self._admitting.result()
        except grpc.FutureCancelledError:
            raise StatusError(grpc.StatusCode.CANCELLED,
                              "the caller cancelled the generation while it was admitted") from None
        except grpc.RpcError as error:
            # The same sentence Generate would end with: fields named from the request's root.
            raise relabelled(error, (error.details() or "").removeprefix(_ADMIT_PREFIX),
                             _ADMIT_PREFIX) from None
        if admission.decision == types_pb2.REJECTED:
            raise rejection_status(admission.rejection)
        with self._lock:
            self._admission = admission
            cancelled = self._cancelled
        if cancelled:  # cancelled while Admit ran: the lease goes back, nothing starts
            self._settle()
            raise StatusError(grpc.StatusCode.CANCELLED, "the caller cancelled the generation")
        return admission

    def _relay(self) -> Iterator[types_pb2.GenerateEvent]:
        """The worker cannot be reached from here: its lease goes back, then the scheduler
        admits and relays the request (Scheduler.Generate: its own Admission first)."""
        self._settle()
        with self._lock:
            if self._cancelled:
                raise StatusError(grpc.StatusCode.CANCELLED, "the caller cancelled the generation")
            self._relayed = self._scheduler.Generate(self._request, timeout=self._remaining(),
                                                     metadata=self._metadata)
        yield from self._relayed
        self._finished = True

    def _stream(self, admission: types_pb2.Admission, started: float
                ) -> Iterator[types_pb2.GenerateEvent]:
        with self._lock:
            if self._cancelled:
                raise StatusError(grpc.StatusCode.CANCELLED, "the caller cancelled the generation")
            self._call = self._worker_stub(admission.worker_address).Generate(
                worker_request(self._request, admission.lease_id, admission.max_new_tokens,
                               admission.model),
                timeout=self._remaining())
        offset_ms = (time.perf_counter() - started) * 1e3  # admission, queue, the call's setup
        tokens = 0
        try:
            for event in self._call:
                kind = event.WhichOneof("event")
                if kind == "chunk":
                    tokens += len(event.chunk.token_ids)
                    yield event
                elif kind == "admission":
                    self._worker_took_it = True  # the caller has the Admit's, first
                elif kind == "finished":
                    compose_timings(event.finished.timings, started, offset_ms)
                    self._finished = True
                    yield event
        except grpc.RpcError as error:
            raise worker_failure(error, admission, tokens, self._worker_took_it) from None

    def _settle(self) -> None:
        """Once, on every exit: a lease no worker claimed goes back to the scheduler."""
        with self._lock:
            if self._settled or self._admission is None:
                return
            self._settled = True
            admission = self._admission
        if self._finished or self._worker_took_it:
            return  # the worker claimed it: it releases it once the KV is freed
        # NOTE: a refusal is fine: LEASE_CLAIMED means the worker claimed it after all and
        # releases it itself; an unreachable scheduler expires the unclaimed lease on its own.
        with contextlib.suppress(grpc.RpcError):
            self._scheduler.Release(scheduler_pb2.ReleaseRequest(
                lease_id=admission.lease_id, lease_secret=admission.lease_secret),
                timeout=10.0, metadata=self._metadata)
