"""The gateway's two-step path, its default: Admit, then the worker streams.

The scheduler admits (lease, cap, queue) and relays no token; the gateway reads
the worker's stream itself, on the one Worker.Relay call it keeps per worker
(ortserve/rpc/relay_client.py: one message per engine step for all its streams
there; a worker without Relay gets a Generate call each). Errors are the relayed path's (a REJECTED Admit
becomes the status Scheduler.Generate ends with; a worker's failure is worded as
the scheduler's relay words it: ortserve/rpc/worker_leg.py), so the HTTP mapping
(errors.from_grpc) is one. The worker's own Admission is awaited before the
HTTP status goes out: from then on the worker holds the lease and releases it
on every exit (a cancel included); before it, a lease no worker claimed is
given back here with Scheduler.Release and the Admit's lease secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import structlog

from gateway.upstream import OpenStream, StreamBroken
from ortserve.rpc import keepalive
from ortserve.rpc.error_path import not_reached
from ortserve.rpc.relay_client import RelayClient
from ortserve.rpc.tls import secure_or_insecure_channel
from ortserve.rpc.worker_leg import (
    SERVER_BOUND_MS,
    compose_timings,
    rejection_status,
    relabelled,
    stream_deadline_ms,
    worker_failure,
    worker_request,
)
from ortserve.v1 import scheduler_pb2, types_pb2, worker_pb2

log = structlog.get_logger("ortserve.gateway")
CONNECT_WAIT_S = 2.0  # how long a worker's first connection may take before relaying instead
RECHECK_S = 60.0  # a worker found unreachable is tried again after this long

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
                compose_timings(event.finished.timings, self._started_s, self._offset_ms)
            yield event
            if kind == "finished":
                return

    def cancel(self) -> None:
        # The worker claimed the lease: cancelling its call makes it free the KV and release.
        self.call.cancel()


class Workers:
    """The gateway's channels to workers, one per address, opened on first use; on each,
    one Relay call for every stream.

    `relay_if_unreachable` (the default path): a worker whose channel does not connect
    within CONNECT_WAIT_S (its address not routable from here, a TLS handshake refused,
    the worker down) has its requests relayed by the scheduler instead, said once in a
    warning; it is read directly again once its channel connects (a worker back up), and
    waited for again after RECHECK_S.
    """

    def __init__(self, credentials: grpc.ChannelCredentials | None,
                 relay_if_unreachable: bool = False) -> None:
        self._credentials = credentials
        self.relay_if_unreachable = relay_if_unreachable
        self._calls: dict[str, tuple[grpc.aio.Channel, RelayClient]] = {}
        self._unreachable: dict[str, float] = {}  # address -> monotonic time it was found so

    def _call(self, address: str) -> tuple[grpc.aio.Channel, RelayClient]:
        if address not in self._calls:
            channel = secure_or_insecure_channel(address, self._credentials,
                                                 options=keepalive.CHANNEL_OPTIONS)
            self._calls[address] = (channel, RelayClient(channel, address))
        return self._calls[address]

    def generate(self, address: str, request: worker_pb2.WorkerGenerateRequest,
                 timeout: float):
        """The worker's stream for `request`: its events as serialized bytes."""
        return self._call(address)[1].generate(request, timeout=timeout)

    async def reachable(self, address: str) -> bool:
        """Whether the gateway can read from the worker at `address` itself (always True
        unless relay_if_unreachable: a failure is then the request's own)."""
        if not self.relay_if_unreachable:
            return True
        found = self._unreachable.get(address)
        channel = self._call(address)[0]
        # Asked on every request, marked or not: a worker that was only down (restarted on
        # the same port) is connected again within a second (keepalive.RECONNECT_OPTIONS),
        # and read directly from then on rather than after RECHECK_S.
        if channel.get_state(try_to_connect=True) == grpc.ChannelConnectivity.READY:
            if self._unreachable.pop(address, None) is not None:
                log.info("worker reachable from the gateway again: its streams are read "
                         "directly", worker_address=address)
            return True
        if found is not None and time.monotonic() - found < RECHECK_S:
            return False
        try:
            async with asyncio.timeout(CONNECT_WAIT_S):
                await channel.channel_ready()
        except TimeoutError:
            if found is None:
                log.warning("worker not reachable from the gateway: its streams are relayed by "
                            "the scheduler", worker_address=address, waited_s=CONNECT_WAIT_S,
                            remedy="let the gateway reach the workers' advertised addresses "
                                   "(and give --worker-tls-* where workers serve TLS), or "
                                   "pass --no-direct-to-workers")
            self._unreachable[address] = time.monotonic()
            return False
        self._unreachable.pop(address, None)
        return True

    async def close(self) -> None:
        for channel, relay in self._calls.values():
            await relay.close()
            await channel.close()


async def open_direct(scheduler, workers: Workers, request: types_pb2.GenerateRequest,
                      timeout_s: float, metadata: Sequence[tuple[str, str]],
                      relay: Callable[[], Awaitable[OpenStream]] | None = None
                      ) -> DirectStream | OpenStream:
    """Admit, start the worker's Generate and wait for its Admission; raises grpc.RpcError
    (StatusError) or StreamBroken before any byte is sent, the lease given back.

    With `relay` given (the scheduler's Generate for the same request), the request goes
    there once instead, its lease given back first: when the gateway cannot reach the worker
    (Workers.reachable), or the worker's call failed without ever reaching it (not_reached:
    the request never started there), where the scheduler's relay then marks that worker
    unreachable and places the request on another."""
    started = time.perf_counter()
    deadline = time.monotonic() + timeout_s
    wait_ms = request.max_queue_wait_ms if request.HasField("max_queue_wait_ms") else SERVER_BOUND_MS
    try:
        admission = await scheduler.Admit(
            # The worker's stream shares the one deadline: said, so a time cap fits
            # max_new_tokens to it as the relayed path's Generate is.
            scheduler_pb2.AdmitRequest(request=request, max_queue_wait_ms=wait_ms,
                                       stream_deadline_ms=stream_deadline_ms(timeout_s)),
            timeout=timeout_s, metadata=tuple(metadata))
    except grpc.RpcError as error:
        raise relabelled(error, (error.details() or "").removeprefix(_ADMIT_PREFIX),
                         _ADMIT_PREFIX) from None
    if admission.decision == types_pb2.REJECTED:
        raise rejection_status(admission.rejection)
    if relay is not None and not await workers.reachable(admission.worker_address):
        await _give_back(scheduler, admission, metadata)  # before the relayed request's own
        return await relay()
    call = None
    claimed = False
    unreached = False
    try:
        call = workers.generate(
            admission.worker_address,
            worker_request(request, admission.lease_id, admission.max_new_tokens, admission.model),
            timeout=max(deadline - time.monotonic(), 0.0))
        frames = call.__aiter__()
        try:
            first = types_pb2.GenerateEvent.FromString(await frames.__anext__())
        except grpc.RpcError as error:
            if relay is None or not not_reached(error):
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
            await _give_back(scheduler, admission, metadata)
    return await relay()


async def _give_back(scheduler, admission: types_pb2.Admission,
                     metadata: Sequence[tuple[str, str]]) -> None:
    """Release a lease no worker claimed, with the Admit's lease secret."""
    # NOTE: a refusal is fine: LEASE_CLAIMED means the worker claimed it after all and
    # releases it itself; an unreachable scheduler expires the unclaimed lease.
    with contextlib.suppress(grpc.RpcError):
        await scheduler.Release(scheduler_pb2.ReleaseRequest(
            lease_id=admission.lease_id, lease_secret=admission.lease_secret),
            timeout=10.0, metadata=tuple(metadata))
