"""The two-step path, opt-in: Scheduler.Admit, then Worker.Generate on the worker's address.

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
cluster's CA signed (docs/security.md).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import grpc
from google.rpc import error_details_pb2, status_pb2

from ortserve import rich_status
from ortserve.error_path import (
    STATUS_DETAILS_KEY,
    domain_status,
    is_worker_failure,
    worker_failed_status,
)
from ortserve.errors import ContextWindowFull, DomainError, ErrorReason
from ortserve.units import human_bytes
from ortserve.v1 import scheduler_pb2, types_pb2, worker_pb2, worker_pb2_grpc

# Admit's wait when the request sets none: the server's bound (--max-queue-wait-s) and the
# call's deadline then decide, as for Generate's unset max_queue_wait_ms.
SERVER_BOUND_MS = 2**32 - 1
_ADMIT_PREFIX = "request."  # Admit names fields under AdmitRequest.request; Generate does not


class StatusError(grpc.RpcError):
    """A failure of the direct path in the shape of a failed call (code, details, rich status),
    so the client's one decoder (errors.from_rpc_error) reads it like the relayed path's."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 trailing: Sequence[tuple[str, bytes]] = ()) -> None:
        super().__init__(message)
        self._code, self._message, self._trailing = code, message, tuple(trailing)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._message

    def trailing_metadata(self):
        return self._trailing


def relabelled(error: grpc.RpcError, message: str, field_prefix: str = "") -> StatusError:
    """`error` with `message` (its rich status kept, re-labelled to agree: a google.rpc.Status
    must match grpc-message, or clients drop it); `field_prefix` stripped from field paths."""
    # NOTE: an upstream UNKNOWN (a bug there) is INTERNAL, as the scheduler's relay makes it.
    code = error.code() if error.code() != grpc.StatusCode.UNKNOWN else grpc.StatusCode.INTERNAL
    status_bin = next((v for k, v in (error.trailing_metadata() or ()) if k == STATUS_DETAILS_KEY),
                      None)
    if status_bin is None:
        return StatusError(code, message)
    status = status_pb2.Status.FromString(status_bin)
    status.code = code.value[0]
    status.message = message
    if field_prefix:
        for packed in status.details:
            if packed.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                packed.Unpack(bad)
                for violation in bad.field_violations:
                    violation.field = violation.field.removeprefix(field_prefix)
                packed.Pack(bad)
            elif packed.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                packed.Unpack(info)
                if "field" in info.metadata:
                    info.metadata["field"] = info.metadata["field"].removeprefix(field_prefix)
                packed.Pack(info)
    return StatusError(code, message, ((STATUS_DETAILS_KEY, status.SerializeToString()),))


def rejection_status(r: types_pb2.Rejection) -> StatusError:
    """A REJECTED Admit as the status Scheduler.Generate ends with for the same rejection
    (scheduler_service/rejections.py: the code from the one table, the numbers, the details)."""
    cause = types_pb2.RejectionCause.Name(r.cause)
    numbers = {
        "prompt_tokens": r.prompt_tokens, "prompt_tokens_unknown": str(r.prompt_tokens_unknown).lower(),
        "min_new_tokens": r.min_new_tokens, "requested_max_new_tokens": r.requested_max_new_tokens,
        "admissible_max_new_tokens": r.admissible_max_new_tokens,
        "context_length": r.context_length, "needed_bytes": r.needed_bytes,
        "available_bytes": r.available_bytes, "capacity_bytes": r.capacity_bytes,
        "bytes_per_token": r.bytes_per_token, "cap_refused": str(r.cap_refused).lower(),
    }
    if cause in ("QUEUE_FULL", "QUEUE_TIMEOUT"):
        numbers.update(queue_length=r.queue_length, max_queue_length=r.max_queue_length,
                       requests_ahead=r.requests_ahead, bytes_ahead=r.bytes_ahead,
                       waited_ms=round(r.waited_ms, 1), max_queue_wait_ms=round(r.max_queue_wait_ms, 1))
    details = [r]
    field = ""
    if cause == "CONTEXT_LENGTH_EXCEEDED":
        field = ContextWindowFull(r.prompt_tokens, r.requested_max_new_tokens, r.context_length,
                                  r.min_new_tokens).field
    if cause in ("BUDGET_BUSY", "EXCEEDS_CAPACITY", "QUEUE_FULL", "QUEUE_TIMEOUT"):
        details.append(rich_status.quota_failure(
            "kv_cache_bytes", f"needs {human_bytes(r.needed_bytes)}, "
            f"{human_bytes(r.available_bytes)} free of {human_bytes(r.capacity_bytes)}"))
    error = DomainError(ErrorReason(cause), f"rejected ({cause.lower()}): {r.message}; {r.remedy}",
                        metadata=numbers, field=field,
                        retry_after_s=r.retry_after.ToNanoseconds() / 1e9, details=details)
    code, message, trailing = domain_status(error)
    return StatusError(code, message, trailing)


def worker_failure(error: grpc.RpcError, admission: types_pb2.Admission, tokens: int,
                   claimed: bool) -> StatusError:
    """A worker call's failure, worded as the scheduler's relay words it (`claimed`: the
    worker had claimed the lease, so it, not the caller, gives it back)."""
    details = error.details() or ""
    if is_worker_failure(error):
        lease = ("its lease returns to the budget when the scheduler expires it (its "
                 "--lease-ttl-s)" if claimed else "its unclaimed lease is given back")
        message = (f"worker {admission.worker_id} at {admission.worker_address} failed after "
                   f"{tokens} tokens: {details[:300]}; {lease}; retry the request")
        # As the scheduler's relay answers it: UNAVAILABLE with ErrorInfo WORKER_FAILED.
        return StatusError(grpc.StatusCode.UNAVAILABLE, message, ((STATUS_DETAILS_KEY, (
            worker_failed_status(message, admission.worker_id, admission.worker_address,
                                 tokens, error))),))
    return relabelled(error, f"worker {admission.worker_id}: {details[:600]}")


class DirectCall:
    """One two-step generation, iterated like Scheduler.Generate's call (GenerateEvents;
    failures raised as grpc.RpcError), with `cancel()`. Blocking; any thread may cancel."""

    def __init__(self, scheduler, worker_stub: Callable[[str], worker_pb2_grpc.WorkerStub],
                 request: types_pb2.GenerateRequest, timeout_s: float | None,
                 metadata) -> None:
        self._scheduler = scheduler  # a SchedulerStub
        self._worker_stub = worker_stub  # address -> a WorkerStub on a cached channel
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
            call, admitting = self._call, self._admitting
        if admitting is not None:
            admitting.cancel()  # waiting in the admission queue: it leaves, holding nothing
        if call is not None:
            call.cancel()
        self._settle()

    def __iter__(self) -> Iterator[types_pb2.GenerateEvent]:
        started = time.perf_counter()
        try:
            admission = self._admit()
            yield types_pb2.GenerateEvent(admission=admission)
            yield from self._stream(admission, started)
        finally:
            with self._lock:
                call = self._call
            if call is not None and not self._finished:
                call.cancel()  # an early exit: the worker's stream ends now
            self._settle()

    def _admit(self) -> types_pb2.Admission:
        inner = self._request
        wait_ms = inner.max_queue_wait_ms if inner.HasField("max_queue_wait_ms") else SERVER_BOUND_MS
        with self._lock:
            if self._cancelled:
                raise StatusError(grpc.StatusCode.CANCELLED, "the caller cancelled the generation")
            self._admitting = self._scheduler.Admit.future(
                scheduler_pb2.AdmitRequest(request=inner, max_queue_wait_ms=wait_ms),
                timeout=self._remaining(), metadata=self._metadata)
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

    def _stream(self, admission: types_pb2.Admission, started: float
                ) -> Iterator[types_pb2.GenerateEvent]:
        inner = types_pb2.GenerateRequest()
        inner.CopyFrom(self._request)
        # What the scheduler's relay hands the worker: the admitted ceiling, the resolved
        # model; the queue is the scheduler's business, decided.
        inner.max_new_tokens = admission.max_new_tokens
        inner.model = admission.model
        inner.ClearField("max_queue_wait_ms")
        with self._lock:
            if self._cancelled:
                raise StatusError(grpc.StatusCode.CANCELLED, "the caller cancelled the generation")
            self._call = self._worker_stub(admission.worker_address).Generate(
                worker_pb2.WorkerGenerateRequest(lease_id=admission.lease_id, request=inner),
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
                    t = event.finished.timings
                    # The worker timed from its own start; the wait before it belongs to
                    # queue and ttft, and total is the caller's (the relay composes the same).
                    t.queue_ms += offset_ms
                    t.ttft_ms += offset_ms
                    t.total_ms = (time.perf_counter() - started) * 1e3
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
