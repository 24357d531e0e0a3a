"""SchedulerInternalServicer: the worker-facing RPCs, on the scheduler's internal port only.

These RPCs change what the ledger believes about capacity and ownership, so
they are not on the public Scheduler service: a client there could announce a
fake worker with a huge capacity, or claim and release others' leases. With
TLS configured the internal port requires a client certificate from the
cluster CA (mutual TLS), so only workers reach these handlers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from ortserve.rules import request_rules
from ortserve.status.errors import DomainError, ErrorReason, clip
from ortserve.v1 import internal_pb2, internal_pb2_grpc, scheduler_pb2
from scheduler_service import convert
from scheduler_service.config import SchedulerConfig
from scheduler_service.decision_log import log_expired
from scheduler_service.ledger import errors as ledger_errors
from scheduler_service.ledger.ledger import BatchStats, Ledger, PrefixCacheReport
from scheduler_service.request_outcome import count_two_step
from scheduler_service.sessions.registry import SessionRegistry
from scheduler_service.sessions.restore import restore_sessions, sessions_left_with
from scheduler_service.worker_clients import WorkerClients

log = structlog.get_logger("scheduler")


class SchedulerInternalServicer(internal_pb2_grpc.SchedulerInternalServicer):
    def __init__(self, config: SchedulerConfig, ledger: Ledger, workers: WorkerClients,
                 kick: Callable[[], None], metrics=None,
                 sessions: SessionRegistry | None = None) -> None:
        self._config = config
        self._ledger = ledger
        self._workers = workers
        self._kick = kick  # serve the admission queue when bytes come free
        self._metrics = metrics
        self._sessions = sessions if sessions is not None else SessionRegistry()

    async def RegisterWorker(self, request: scheduler_pb2.RegisterWorkerRequest, context):
        request_rules.bounded("worker_id", request.worker_id, request_rules.MAX_WORKER_ID_CHARS)
        request_rules.bounded("address", request.address, request_rules.MAX_ADDRESS_CHARS)
        geometry = convert.geometry_from_pb(request)
        now = time.monotonic()
        leases = convert.live_leases_from_pb(request, now)
        previous = self._ledger.geometry(geometry.worker_id)
        refused = self._ledger.register(geometry, leases)  # raises WORKER_ID_IN_USE
        # The worker's sessions, once their leases are back (a restart left none here).
        dropped = restore_sessions(self._sessions, self._ledger, request)
        if previous is not None and previous.address != geometry.address:
            await self._workers.forget(previous.address)
        self._workers.registered(geometry.address)
        log_expired(self._ledger.expire(), self._metrics)
        self._kick()  # a new worker's bytes serve the queue
        log.info("worker registered", worker_id=geometry.worker_id, address=geometry.address,
                 capacity_bytes=geometry.capacity_bytes, bytes_per_token=geometry.bytes_per_token,
                 context_length=geometry.context_length, vocab_size=geometry.vocab_size,
                 restored_leases=len(leases) - len(refused), refused_leases=len(refused),
                 restored_sessions=len(request.live_sessions) - len(dropped),
                 dropped_sessions=len(dropped),
                 execution_provider=geometry.execution_provider)
        return scheduler_pb2.RegisterWorkerResponse(
            heartbeat_interval_s=self._config.heartbeat_interval_s,
            lease_ttl_s=self._config.lease_ttl_s,
            refused_lease_ids=refused,
            dropped_session_ids=dropped,
        )

    async def Heartbeat(self, request: scheduler_pb2.HeartbeatRequest, context):
        known = self._ledger.heartbeat(request.worker_id, draining=request.draining,
                                       address=request.address,
                                       batch=BatchStats(request.running_sequences,
                                                        request.batch_rows, request.largest_batch),
                                       prefix=PrefixCacheReport(
                                           request.cached_bytes,
                                           frozenset(request.cached_prefix_hashes)),
                                       steps=convert.step_samples(request.step_timings),
                                       prefill=convert.prefill_pace(request))
        if known and request.step_timings:
            self._kick()  # a new measurement may let a request waiting on time start
        if known:
            lost = self._ledger.reconcile(request.worker_id, request.live_lease_ids,
                                          grace_s=2 * self._config.heartbeat_interval_s)
            for lease in lost:
                log.warning("lease lost by its worker; released", lease_id=lease.lease_id,
                            worker_id=lease.worker_id, freed_bytes=lease.reserved_bytes,
                            prompt_tokens=lease.prompt_tokens, max_new_tokens=lease.max_new_tokens)
            if lost:
                self._kick()
        return scheduler_pb2.HeartbeatResponse(known=known)

    async def ClaimLease(self, request: scheduler_pb2.ClaimLeaseRequest, context):
        lease = self._ledger.claim(
            request.lease_id, request.worker_id,
            check=lambda lease: request_rules.lease_match(
                lease.lease_id, request.prompt_tokens, request.max_new_tokens,
                lease.prompt_tokens, lease.max_new_tokens))
        if lease is None:
            raise ledger_errors.lease_not_live(request.lease_id, request.worker_id,
                                               self._config.claim_ttl_s)
        log.info("lease claimed", lease_id=lease.lease_id, worker_id=lease.worker_id)
        return convert.lease_to_pb(lease, time.monotonic())

    async def ReleaseClaimed(self, request: scheduler_pb2.ReleaseRequest, context):
        request_rules.bounded("lease_id", request.lease_id, request_rules.MAX_LEASE_ID_CHARS)
        request_rules.bounded("worker_id", request.worker_id, request_rules.MAX_WORKER_ID_CHARS)
        lease = self._ledger.lease(request.lease_id)
        freed = self._ledger.release(request.lease_id, request.worker_id)
        log.info("release", lease_id=request.lease_id, worker_id=request.worker_id or None,
                 freed_bytes=freed)
        if freed:
            self._kick()
        if freed and lease is not None and lease.two_step and self._metrics is not None:
            # A relayed request is counted at its Generate's exit; a two-step one's only
            # witness here is its worker, which says how it ended as it releases.
            count_two_step(self._metrics, request)
        return scheduler_pb2.ReleaseResponse(freed_bytes=freed, released=freed > 0)

    async def ShrinkLease(self, request: scheduler_pb2.ShrinkLeaseRequest, context):
        """A session's worker freed KV (a turn's end, a swap-out): the lease follows, never up."""
        lease = self._ledger.shrink(request.lease_id, request.worker_id, request.held_tokens,
                                    request.host_bytes, request.disk_bytes,
                                    request.if_request_id)
        if lease is None and request.if_request_id:
            lease = self._ledger.lease(request.lease_id)  # a turn was admitted since: unchanged
            if lease is not None and lease.worker_id == request.worker_id:
                return convert.lease_to_pb(lease, time.monotonic())
        if lease is None:
            raise DomainError(ErrorReason.LEASE_NOT_FOUND,
                              f"lease {clip(request.lease_id)} is not live for worker "
                              f"{clip(request.worker_id)}", metadata={"lease_id": request.lease_id})
        self._kick()  # the freed bytes may serve the admission queue's head
        return convert.lease_to_pb(lease, time.monotonic())

    async def ResizeForAdapter(self, request: internal_pb2.ResizeForAdapterRequest, context):
        """A worker loads or unloads a LoRA adapter: its capacity moves by the adapter's
        bytes here first (a load the leases leave no room for is refused, ADAPTER_NO_ROOM)."""
        request_rules.bounded("worker_id", request.worker_id, request_rules.MAX_WORKER_ID_CHARS)
        adapter = request.adapter
        geometry = self._ledger.resize_for_adapter(request.worker_id, adapter.name,
                                                   adapter.held_bytes, request.loaded,
                                                   path=adapter.path)
        if geometry is None:
            raise DomainError(ErrorReason.NO_WORKER,
                              f"worker {clip(request.worker_id)} is not registered here; it "
                              "registers again with its next heartbeat, then retry",
                              metadata={"worker_id": request.worker_id})
        log.info("adapter loaded" if request.loaded else "adapter unloaded",
                 worker_id=request.worker_id, adapter=adapter.name,
                 adapter_bytes=adapter.held_bytes, capacity_bytes=geometry.capacity_bytes)
        if not request.loaded:
            self._kick()  # the returned bytes may serve the admission queue's head
        return convert.adapter_change_to_pb(geometry, adapter)

    async def Deregister(self, request: internal_pb2.DeregisterRequest, context):
        """A worker's clean stop: forget it now (its leases with it, each once), not after
        the lease TTL, so the same worker id registers again at once."""
        request_rules.bounded("worker_id", request.worker_id, request_rules.MAX_WORKER_ID_CHARS)
        request_rules.bounded("address", request.address, request_rules.MAX_ADDRESS_CHARS)
        dropped = self._ledger.forget_worker(request.worker_id, request.address)
        if dropped is None:
            log.info("deregistration of an unknown worker; nothing changed",
                     worker_id=request.worker_id, address=request.address)
            return internal_pb2.DeregisterResponse(known=False)
        for lease in dropped:
            log.info("lease released with its worker's clean stop", lease_id=lease.lease_id,
                     worker_id=lease.worker_id, request_id=clip(lease.request_id),
                     claimed=lease.claimed, session=lease.session,
                     freed_bytes=lease.reserved_bytes, disk_bytes=lease.disk_bytes)
        on_disk, gone = sessions_left_with(self._sessions, request.worker_id, dropped)
        await self._workers.forget(request.address)
        freed = sum(lease.reserved_bytes for lease in dropped)
        if self._metrics is not None:
            self._metrics.deregistered(dropped)
        log.info("worker deregistered (a clean stop)", worker_id=request.worker_id,
                 address=request.address, released_leases=len(dropped), freed_bytes=freed,
                 sessions_on_disk=on_disk, sessions_lost=gone)
        self._kick()  # the queue re-decides without this worker's capacity
        return internal_pb2.DeregisterResponse(known=True, released_leases=len(dropped),
                                               freed_bytes=freed, sessions_on_disk=on_disk)
