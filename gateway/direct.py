"""The gateway's opt-in two-step path (--direct-to-workers): Admit, then the worker streams.

The scheduler admits (lease, cap, queue) and relays no token; the gateway reads
the worker's stream itself, on the one Worker.Relay call it keeps per worker
(ortserve/relay_client.py: one message per engine step for all its streams
there; a worker without Relay gets a Generate call each). Errors are the relayed path's (a REJECTED Admit
becomes the status Scheduler.Generate ends with; a worker's failure is worded as
the scheduler's relay words it: ortserve_client.direct), so the HTTP mapping
(errors.from_grpc) is one. The worker's own Admission is awaited before the
HTTP status goes out: from then on the worker holds the lease and releases it
on every exit (a cancel included); before it, a lease no worker claimed is
given back here with Scheduler.Release and the Admit's lease secret.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
from ortserve_client.direct import SERVER_BOUND_MS, rejection_status, relabelled, worker_failure

from ortserve import keepalive
from ortserve.error_path import not_reached
from ortserve.relay_client import RelayCall
from ortserve.tls import secure_or_insecure_channel
from ortserve.v1 import scheduler_pb2, types_pb2, worker_pb2

from .upstream import OpenStream, StreamBroken

_ADMIT_PREFIX = "request."


class DirectStream:
    """A worker's stream whose Admission has arrived (OpenStream's interface)."""

    def __init__(self, call, frames, admission: types_pb2.Admission, started_s: float,
                 offset_ms: float) -> None:
        self.call = call
        self._frames = frames  # the call's frames (bytes), the Admission already read
        self.admission = admission
        self._started_s = started_s  # perf_counter at the gateway's open
        self._offset_ms = offset_ms  # admission, queue and the worker call's setup

    async def events(self) -> AsyncIterator[types_pb2.GenerateEvent]:
        """Chunks, then the Finished event (timings composed from the gateway's start)."""
        tokens = 0
        while True:
            try:
                event = types_pb2.GenerateEvent.FromString(await self._frames.__anext__())
            except grpc.RpcError as error:
                raise worker_failure(error, self.admission, tokens, claimed=True) from None
            except StopAsyncIteration:
                raise StreamBroken(f"worker {self.admission.worker_id}'s stream ended without a "
                                   "Finished event") from None
            kind = event.WhichOneof("event")
            if kind == "chunk":
                tokens += len(event.chunk.token_ids)
            elif kind == "finished":
                t = event.finished.timings
                # As the scheduler's relay composes them: the wait before the worker's start
                # belongs to queue and ttft; total is from the gateway's start.
                t.queue_ms += self._offset_ms
                t.ttft_ms += self._offset_ms
                t.total_ms = (time.perf_counter() - self._started_s) * 1e3
            yield event
            if kind == "finished":
                return

    def cancel(self) -> None:
        # The worker claimed the lease: cancelling its call makes it free the KV and release.
        self.call.cancel()


class Workers:
    """The gateway's channels to workers, one per address, opened on first use; on each,
    one Relay call for every stream."""

    def __init__(self, credentials: grpc.ChannelCredentials | None) -> None:
        self._credentials = credentials
        self._calls: dict[str, tuple[grpc.aio.Channel, RelayCall]] = {}

    def generate(self, address: str, request: worker_pb2.WorkerGenerateRequest,
                 timeout: float):
        """The worker's stream for `request`: its events as serialized bytes."""
        if address not in self._calls:
            channel = secure_or_insecure_channel(address, self._credentials,
                                                 options=keepalive.CHANNEL_OPTIONS)
            self._calls[address] = (channel, RelayCall(channel, address))
        return self._calls[address][1].generate(request, timeout=timeout)

    async def close(self) -> None:
        for channel, relay in self._calls.values():
            await relay.close()
            await channel.close()


async def open_direct(scheduler, workers: Workers, request: types_pb2.GenerateRequest,
                      timeout_s: float, metadata: Sequence[tuple[str, str]],
                      relayed: Callable[[], Awaitable[OpenStream]] | None = None,
                      ) -> DirectStream | OpenStream:
    """Admit, start the worker's Generate and wait for its Admission; raises grpc.RpcError
    (StatusError) or StreamBroken before any byte is sent, the lease given back.

    A worker that cannot be reached at all (not_reached: the request never started there)
    with `relayed` given: the lease is given back and the request goes once through the
    scheduler's relay (`relayed()`), which marks that worker unreachable and places it on
    another; the scheduler alone learns which workers answer."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    wait_ms = request.max_queue_wait_ms if request.HasField("max_queue_wait_ms") else SERVER_BOUND_MS
    try:
        admission = await scheduler.Admit(
            scheduler_pb2.AdmitRequest(request=request, max_queue_wait_ms=wait_ms),
            timeout=timeout_s, metadata=tuple(metadata))
    except grpc.RpcError as error:
        raise relabelled(error, (error.details() or "").removeprefix(_ADMIT_PREFIX),
                         _ADMIT_PREFIX) from None
    if admission.decision == types_pb2.REJECTED:
        raise rejection_status(admission.rejection)
    inner = types_pb2.GenerateRequest()
    inner.CopyFrom(request)
    # What the scheduler's relay hands the worker: the admitted ceiling, the resolved model.
    inner.max_new_tokens = admission.max_new_tokens
    inner.model = admission.model
    inner.ClearField("max_queue_wait_ms")
    call = None
    claimed = False
    unreached = False
    try:
        call = workers.generate(
            admission.worker_address,
            worker_pb2.WorkerGenerateRequest(lease_id=admission.lease_id, request=inner),
            timeout=max(deadline - time.monotonic(), 0.0))
        frames = call.__aiter__()
        try:
            first = types_pb2.GenerateEvent.FromString(await frames.__anext__())
        except grpc.RpcError as error:
            if relayed is None or not not_reached(error):
                raise worker_failure(error, admission, 0, claimed=False) from None
            unreached = True  # the lease is given back below; the relay places it again
            first = None
        except StopAsyncIteration:
            first = None
        if not unreached:
            if first is None or first.WhichOneof("event") != "admission":
                raise StreamBroken(f"worker {admission.worker_id}'s stream did not start "
                                   "with an Admission")
            claimed = True
            return DirectStream(call, frames, admission, started,
                                (time.perf_counter() - started) * 1e3)
    finally:
        if not claimed:
            if call is not None:
                call.cancel()
            # NOTE: a refusal is fine: LEASE_CLAIMED means the worker claimed it after all and
            # releases it itself; an unreachable scheduler expires the unclaimed lease.
            with contextlib.suppress(grpc.RpcError):
                await scheduler.Release(scheduler_pb2.ReleaseRequest(
                    lease_id=admission.lease_id, lease_secret=admission.lease_secret),
                    timeout=10.0, metadata=tuple(metadata))
    return await relayed()
