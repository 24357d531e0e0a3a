"""The worker's side of the scheduler protocol: register, heartbeat, claim, release, and
deregister at a clean stop.

All go to SchedulerInternal on the scheduler's internal port (--scheduler
points there), over mutual TLS when the worker has a certificate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import grpc
import structlog

from ortserve.rpc.tls import secure_or_insecure_channel
from ortserve.v1 import internal_pb2, internal_pb2_grpc, scheduler_pb2, types_pb2

log = structlog.get_logger("worker")


_REFUSALS = (grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.INVALID_ARGUMENT,
             grpc.StatusCode.FAILED_PRECONDITION)

_TLS_FLAGS = "--tls-cert, --tls-key and --tls-ca (env ORTSERVE_WORKER_TLS_CERT, ..._KEY, ..._CA)"


def likely_cause(details: str, tls: bool, address: str) -> str:
    """What an UNAVAILABLE from the scheduler most likely means, and the next step.

    gRPC says only UNAVAILABLE; its details hold the transport's words (measured
    with grpcio 1.85 against a real scheduler): a TLS port closes a
    plaintext connection at once ("Socket closed"), and a plaintext port answers
    a TLS ClientHello with bytes OpenSSL reads as WRONG_VERSION_NUMBER.
    """
    if "Connection refused" in details:
        return (f"nothing listens at {address}: start the scheduler, or point --scheduler "
                "(env ORTSERVE_SCHEDULER_ADDRESS) at its --internal-port (default 50061)")
    if "WRONG_VERSION_NUMBER" in details or "HTTP_REQUEST" in details:
        return (f"{address} does not speak TLS and this worker does: start the scheduler "
                "with --tls-cert, --tls-key and --tls-ca, or drop this worker's --tls-* "
                "flags on a trusted network")
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return ("the scheduler's certificate does not chain to this worker's --tls-ca: "
                "give the CA that signed it")
    if "Hostname Verification" in details or "Peer name" in details:
        return (f"the scheduler's certificate does not name the host in --scheduler "
                f"{address}: dial a name (or IP) the certificate carries")
    if "Socket closed" in details or "Connection reset" in details:
        if not tls:
            return (f"{address} closed the connection at once: the scheduler most likely "
                    f"requires TLS (its internal port is mutual TLS); give this worker "
                    f"{_TLS_FLAGS}")
        return (f"{address} closed the connection during the TLS handshake: the scheduler "
                "most likely refused this worker's certificate; it must chain to the "
                "scheduler's --tls-ca")
    return ""


class SchedulerLink:
    def __init__(self, address: str, registration: scheduler_pb2.RegisterWorkerRequest,
                 live_leases: Callable[[], list[types_pb2.Lease]],
                 batch_stats: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0),
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        self.address = address
        self._registration = registration
        self._live_leases = live_leases
        self._tls = credentials is not None
        self._batch_stats = batch_stats  # (running sequences, batch rows, largest batch)
        self._channel = secure_or_insecure_channel(address, credentials)
        self._stub = internal_pb2_grpc.SchedulerInternalStub(self._channel)
        self.heartbeat_interval_s = 2.0
        self.registered = asyncio.Event()
        self.draining = False  # sent with every heartbeat once set
        self.leaving = False  # set by deregister(): run() stops, nothing registers again
        # The sessions this worker holds, sent with every registration: a restarted
        # scheduler rebuilds its session registry from them (session_lifecycle.py).
        self.live_sessions: Callable[[], list[scheduler_pb2.LiveSession]] = list
        # Runs after a registration with the sessions the scheduler did not restore and
        # the leases it refused: the worker frees those sessions.
        self.drop_sessions: Callable[[list[str], list[str]], Awaitable[None]] | None = None
        # Runs after a registration with the leases the scheduler refused: the worker stops
        # their running sequences (it may not hold KV the ledger does not charge).
        self.stop_unrestored: Callable[[list[str]], Awaitable[None]] | None = None
        # (bytes the prefix cache holds, its summary's chain hashes), sent with every
        # heartbeat: the ledger shows the bytes, placement follows the hashes.
        self.prefix_cache: Callable[[], tuple[int, list[int]]] = lambda: (0, [])
        # (rows, steps, seconds) of its decoding steps since the last heartbeat (engine
        # StepTimes.drain): the scheduler's time budget.
        self.step_timings: Callable[[], list[tuple[int, int, float]]] = lambda: []
        # (ms a prompt token costs in a step, 0: unmeasured; ms a chunk's own run costs; the
        # step's most prompt tokens): the pace of prompt chunks, for the TTFT prediction.
        self.prefill_pace: Callable[[], tuple[float, float, int]] = lambda: (0.0, 0.0, 0)
        # Seconds of the p90 decode step at these rows (engine PrefillPace.decode_tail_s; 0:
        # none): the margin its chunks leave, which the TTFT prediction takes as the worker does.
        self.decode_tail_s: Callable[[int], float] = lambda rows: 0.0

    @property
    def worker_id(self) -> str:
        return self._registration.worker_id

    async def register(self) -> None:
        request = scheduler_pb2.RegisterWorkerRequest()
        request.CopyFrom(self._registration)
        request.live_leases.extend(self._live_leases())
        request.live_sessions.extend(self.live_sessions())
        reply = await self._stub.RegisterWorker(request, timeout=10.0)
        self.heartbeat_interval_s = reply.heartbeat_interval_s or self.heartbeat_interval_s
        for lease_id in reply.refused_lease_ids:
            log.error("scheduler refused to restore a live lease", lease_id=lease_id)
        if reply.dropped_session_ids and self.drop_sessions is not None:
            await self.drop_sessions(list(reply.dropped_session_ids),
                                     list(reply.refused_lease_ids))
        if reply.refused_lease_ids and self.stop_unrestored is not None:
            await self.stop_unrestored(list(reply.refused_lease_ids))
        self.registered.set()
        log.info("registered with scheduler", scheduler=self.address, worker_id=self.worker_id,
                 restored_leases=len(request.live_leases) - len(reply.refused_lease_ids),
                 restored_sessions=len(request.live_sessions) - len(reply.dropped_session_ids))

    async def run(self) -> None:
        """Register, then heartbeat until deregister(); re-register whenever the scheduler
        forgot us."""
        backoff_s = 0.2
        while not self.leaving:
            try:
                if not self.registered.is_set():
                    await self.register()
                live = [lease.lease_id for lease in self._live_leases()]
                reply = await self._heartbeat(live)
                if not reply.known:
                    log.warning("scheduler does not know this worker; registering again")
                    self.registered.clear()
                    continue
                backoff_s = 0.2
                await asyncio.sleep(self.heartbeat_interval_s)
            except grpc.aio.AioRpcError as error:
                self.registered.clear()
                if error.code() in _REFUSALS:
                    # The scheduler answered and said no (e.g. WORKER_ID_IN_USE): say what it
                    # said; retrying still makes sense (the other worker may go away).
                    log.error("scheduler refused this worker; retrying", scheduler=self.address,
                              code=error.code().name, details=error.details(),
                              retry_in_s=backoff_s)
                else:
                    # The details and a likely cause: UNAVAILABLE alone hid a TLS mismatch.
                    details = error.details() or ""
                    cause = likely_cause(details, self._tls, self.address)
                    log.warning("scheduler unreachable; retrying", scheduler=self.address,
                                code=error.code().name, details=details, retry_in_s=backoff_s,
                                **({"likely_cause": cause} if cause else {}))
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 5.0)

    async def _heartbeat(self, live_lease_ids: list[str]) -> scheduler_pb2.HeartbeatResponse:
        running, rows, largest = self._batch_stats()
        cached_bytes, cached_hashes = self.prefix_cache()
        prompt_token_ms, prompt_chunk_ms, chunk_tokens = self.prefill_pace()
        return await self._stub.Heartbeat(scheduler_pb2.HeartbeatRequest(
            worker_id=self.worker_id, address=self._registration.address,
            live_lease_ids=live_lease_ids, draining=self.draining,
            running_sequences=running, batch_rows=rows, largest_batch=largest,
            cached_bytes=cached_bytes, cached_prefix_hashes=cached_hashes,
            step_timings=[scheduler_pb2.StepTiming(rows=rows, steps=steps, seconds=seconds,
                                                   tail_seconds=self.decode_tail_s(rows))
                          for rows, steps, seconds in self.step_timings()],
            prompt_token_ms=prompt_token_ms, prompt_chunk_ms=prompt_chunk_ms,
            prefill_chunk_tokens=chunk_tokens), timeout=5.0)

    async def announce_draining(self) -> None:
        """Tell the scheduler now (not at the next heartbeat) to place nothing more here."""
        self.draining = True
        try:
            await self._heartbeat([lease.lease_id for lease in self._live_leases()])
        except grpc.aio.AioRpcError as error:
            log.warning("could not tell the scheduler this worker is draining",
                        code=error.code().name, details=error.details())

    async def deregister(self) -> bool:
        """A clean stop's goodbye, after the drain: the scheduler forgets this worker now
        (its leases with it), so the same --worker-id registers again at once. After it
        this link registers no more. False when the scheduler was not told (unreachable, or
        it did not know this worker): it forgets this worker after its lease TTL instead."""
        self.leaving = True
        if not self.registered.is_set():
            return False
        try:
            reply = await self._stub.Deregister(internal_pb2.DeregisterRequest(
                worker_id=self.worker_id, address=self._registration.address), timeout=5.0)
        except grpc.aio.AioRpcError as error:
            log.warning("could not tell the scheduler this worker stopped; it forgets this "
                        "worker after its lease TTL", scheduler=self.address,
                        code=error.code().name, details=error.details())
            return False
        self.registered.clear()
        log.info("deregistered from scheduler", scheduler=self.address, worker_id=self.worker_id,
                 known=reply.known, released_leases=reply.released_leases,
                 freed_bytes=reply.freed_bytes, sessions_on_disk=reply.sessions_on_disk)
        return reply.known

    def serving(self, capacity_bytes: int, adapters: list[types_pb2.LoraAdapter]) -> None:
        """The worker's capacity and adapters changed (an adapter loaded or unloaded): what
        every later registration announces."""
        self._registration.capacity_bytes = capacity_bytes
        del self._registration.adapters[:]
        self._registration.adapters.extend(adapters)

    async def resize_for_adapter(self, adapter: types_pb2.LoraAdapter,
                                 loaded: bool) -> types_pb2.AdapterChange:
        """Have the ledger move this worker's capacity by the adapter's bytes (and list it
        or not); raises the ledger's refusal (ADAPTER_NO_ROOM) as the scheduler sent it."""
        return await self._stub.ResizeForAdapter(
            internal_pb2.ResizeForAdapterRequest(worker_id=self.worker_id, adapter=adapter,
                                                 loaded=loaded), timeout=10.0)

    async def claim(self, lease_id: str, prompt_tokens: int = 0,
                    max_new_tokens: int = 0) -> types_pb2.Lease:
        return await self._stub.ClaimLease(
            scheduler_pb2.ClaimLeaseRequest(lease_id=lease_id, worker_id=self.worker_id,
                                            prompt_tokens=prompt_tokens,
                                            max_new_tokens=max_new_tokens), timeout=10.0)

    async def shrink(self, lease_id: str, held_tokens: int, host_bytes: int = 0,
                     disk_bytes: int = 0, if_request_id: str = "") -> types_pb2.Lease | None:
        """Shrink a session's lease after freeing KV; retried like release (a lease left
        larger than needed only over-reserves: safe, never the other way). Returns the
        lease as the ledger now holds it, None when no attempt got through."""
        for attempt in range(3):
            try:
                return await self._stub.ShrinkLease(
                    scheduler_pb2.ShrinkLeaseRequest(lease_id=lease_id, worker_id=self.worker_id,
                                                     held_tokens=held_tokens,
                                                     host_bytes=host_bytes,
                                                     disk_bytes=disk_bytes,
                                                     if_request_id=if_request_id), timeout=5.0)
            except grpc.aio.AioRpcError as error:
                log.warning("shrink failed", lease_id=lease_id, code=error.code().name,
                            attempt=attempt + 1)
                await asyncio.sleep(0.2 * (attempt + 1))
        return None

    async def release(self, lease_id: str, outcome: str = "", cause: str = "",
                      finished: types_pb2.Finished | None = None) -> int:
        """Release once, saying how its sequence ended (`outcome`, `cause`, `finished`: the
        scheduler's count of a two-step request); retried on transport errors (heartbeats
        reconcile if all fail)."""
        request = scheduler_pb2.ReleaseRequest(lease_id=lease_id, worker_id=self.worker_id,
                                               outcome=outcome, cause=cause, finished=finished)
        for attempt in range(3):
            try:
                reply = await self._stub.ReleaseClaimed(request, timeout=5.0)
                return reply.freed_bytes
            except grpc.aio.AioRpcError as error:
                log.warning("release failed", lease_id=lease_id, code=error.code().name,
                            attempt=attempt + 1)
                await asyncio.sleep(0.2 * (attempt + 1))
        return 0

    async def close(self) -> None:
        await self._channel.close()
