"""SchedulerServicer: protobuf in, ledger calls, protobuf out; Generate relays a worker's stream."""

from __future__ import annotations

import time
import uuid

import grpc
import structlog
from google.rpc import status_pb2

from ortserve import rich_status
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2, worker_pb2

from . import convert
from .budget import Decision, Ledger
from .config import SchedulerConfig
from .errors import rejection_status
from .worker_clients import WorkerClients

log = structlog.get_logger("scheduler")

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


def _relay_metadata(error: grpc.aio.AioRpcError, message: str) -> tuple[tuple[str, bytes], ...]:
    """The worker's rich details, re-labelled with our message (they must agree)."""
    for key, value in error.trailing_metadata() or ():
        if key == _STATUS_DETAILS_KEY:
            status = status_pb2.Status.FromString(value)
            status.message = message
            return ((_STATUS_DETAILS_KEY, status.SerializeToString()),)
    return ()


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, config: SchedulerConfig, ledger: Ledger, workers: WorkerClients) -> None:
        self._config = config
        self._ledger = ledger
        self._workers = workers

    # -- admission -------------------------------------------------------------

    async def _count_prompt(self, request: types_pb2.GenerateRequest,
                            context: grpc.aio.ServicerContext) -> int | None:
        """Prompt tokens, via a worker's Tokenize (which validates the request).

        Returns None when no worker is registered: admission then rejects NO_WORKER.
        """
        if request.WhichOneof("prompt") is None:
            await rich_status.abort(
                context, grpc.StatusCode.INVALID_ARGUMENT,
                "request has no prompt: set one of text, token_ids or chat",
                [rich_status.bad_request("prompt", "set one of text, token_ids or chat")],
            )
        snapshot = self._ledger.snapshot()
        if not snapshot:
            return None
        last_error: grpc.aio.AioRpcError | None = None
        # NOTE: any worker will do: a cluster serves one model, so one tokenizer.
        for worker in sorted(snapshot, key=lambda w: len(w.leases)):
            try:
                answer = await self._workers.stub(worker.geometry.address).Tokenize(
                    worker_pb2.TokenizeRequest(request=request), timeout=10.0)
                return len(answer.token_ids)
            except grpc.aio.AioRpcError as error:
                if error.code() != grpc.StatusCode.UNAVAILABLE:
                    await context.abort(error.code(), error.details(),
                                        _relay_metadata(error, error.details()))
                last_error = error
        await rich_status.abort(
            context, grpc.StatusCode.UNAVAILABLE,
            f"no worker answered Tokenize ({len(snapshot)} registered; last error: "
            f"{last_error.details() if last_error else 'none'}); retry shortly or check the workers",
            [rich_status.error_info("NO_WORKER", {"registered_workers": len(snapshot)}),
             rich_status.retry_info(self._config.retry_after_s)],
        )
        raise AssertionError("unreachable")

    async def _admit(self, request: types_pb2.GenerateRequest, context, dry_run: bool):
        prompt_tokens = await self._count_prompt(request, context)
        try:
            domain_request = convert.admission_request(request, prompt_tokens or 1)
        except ValueError as error:
            await rich_status.abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(error),
                                    [rich_status.bad_request("min_new_tokens", str(error))])
        return self._ledger.admit(domain_request, dry_run=dry_run)

    async def Admit(self, request: scheduler_pb2.AdmitRequest, context):
        inner = types_pb2.GenerateRequest()
        inner.CopyFrom(request.request)
        inner.request_id = inner.request_id or uuid.uuid4().hex[:16]
        admission = await self._admit(inner, context, dry_run=request.dry_run)
        lease = admission.lease
        log.info("admit", request_id=inner.request_id, decision=admission.decision.value,
                 lease_id=lease.lease_id if lease else None, dry_run=request.dry_run,
                 worker_id=admission.worker.worker_id if admission.worker else None,
                 max_new_tokens=admission.max_new_tokens, reserved_bytes=admission.reserved_bytes)
        return convert.admission_to_pb(admission)

    async def Release(self, request: scheduler_pb2.ReleaseRequest, context):
        freed = self._ledger.release(request.lease_id)
        log.info("release", lease_id=request.lease_id, freed_bytes=freed)
        return scheduler_pb2.ReleaseResponse(freed_bytes=freed, released=freed > 0)

    async def GetBudget(self, request: scheduler_pb2.GetBudgetRequest, context):
        self._ledger.expire()
        return convert.budget_to_pb(self._ledger.snapshot(), request.include_leases, time.monotonic())

    # -- workers ------------------------------------------------------------------

    async def RegisterWorker(self, request: scheduler_pb2.RegisterWorkerRequest, context):
        try:
            geometry = convert.geometry_from_pb(request)
        except ValueError as error:
            await rich_status.abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                                    f"worker registration refused: {error}",
                                    [rich_status.bad_request("geometry", str(error))])
        now = time.monotonic()
        leases = [convert.lease_from_pb(pb, now) for pb in request.live_leases]
        previous = self._ledger.geometry(geometry.worker_id)
        if previous is not None and previous.address != geometry.address:
            await self._workers.forget(previous.address)
        refused = self._ledger.register(geometry, leases)
        log.info("worker registered", worker_id=geometry.worker_id, address=geometry.address,
                 capacity_bytes=geometry.capacity_bytes, bytes_per_token=geometry.bytes_per_token,
                 context_length=geometry.context_length, restored_leases=len(leases) - len(refused),
                 refused_leases=len(refused), execution_provider=geometry.execution_provider)
        return scheduler_pb2.RegisterWorkerResponse(
            heartbeat_interval_s=self._config.heartbeat_interval_s,
            lease_ttl_s=self._config.lease_ttl_s,
            refused_lease_ids=refused,
        )

    async def Heartbeat(self, request: scheduler_pb2.HeartbeatRequest, context):
        known = self._ledger.heartbeat(request.worker_id)
        if known:
            lost = self._ledger.reconcile(request.worker_id, request.live_lease_ids,
                                          grace_s=2 * self._config.heartbeat_interval_s)
            for lease in lost:
                log.warning("lease lost by its worker; released", lease_id=lease.lease_id,
                            worker_id=lease.worker_id, freed_bytes=lease.reserved_bytes)
        return scheduler_pb2.HeartbeatResponse(known=known)

    async def ClaimLease(self, request: scheduler_pb2.ClaimLeaseRequest, context):
        lease = self._ledger.claim(request.lease_id, request.worker_id)
        if lease is None:
            await rich_status.abort(
                context, grpc.StatusCode.NOT_FOUND,
                f"lease {request.lease_id!r} is not live for worker {request.worker_id!r}: it was "
                f"released, expired (unclaimed for {self._config.claim_ttl_s:g} s, or its worker "
                "stopped heartbeating) or belongs to another worker; get a new lease from "
                "Scheduler.Admit, or call Scheduler.Generate",
                [rich_status.error_info("LEASE_NOT_FOUND", {"lease_id": request.lease_id,
                                                            "worker_id": request.worker_id})],
            )
        log.info("lease claimed", lease_id=lease.lease_id, worker_id=lease.worker_id)
        return convert.lease_to_pb(lease, time.monotonic())

    # -- the front door --------------------------------------------------------------

    async def Generate(self, request: types_pb2.GenerateRequest, context):
        arrived = time.perf_counter()
        request_id = request.request_id or uuid.uuid4().hex[:16]
        inner = types_pb2.GenerateRequest()
        inner.CopyFrom(request)
        inner.request_id = request_id
        admission = await self._admit(inner, context, dry_run=False)
        bound = log.bind(request_id=request_id)
        if admission.decision is Decision.REJECTED:
            code, message, details = rejection_status(admission.rejection)
            bound.info("rejected", cause=admission.rejection.cause.value)
            await rich_status.abort(context, code, message, details)
        lease, worker = admission.lease, admission.worker
        bound = bound.bind(lease_id=lease.lease_id, worker_id=worker.worker_id)
        bound.info("admitted", decision=admission.decision.value,
                   max_new_tokens=admission.max_new_tokens, reserved_bytes=admission.reserved_bytes)
        # The worker gets the admitted ceiling explicitly: no second resolution.
        inner.max_new_tokens = admission.max_new_tokens
        call = None
        relayed_tokens = 0
        try:
            yield types_pb2.GenerateEvent(admission=convert.admission_to_pb(admission))
            remaining = context.time_remaining()
            call = self._workers.stub(worker.address).Generate(
                worker_pb2.WorkerGenerateRequest(lease_id=lease.lease_id, request=inner),
                timeout=remaining,
            )
            relay_offset_ms = (time.perf_counter() - arrived) * 1e3
            async for event in call:
                kind = event.WhichOneof("event")
                if kind == "admission":
                    continue  # the client already has ours, first
                if kind == "chunk":
                    relayed_tokens += len(event.chunk.token_ids)
                if kind == "finished":
                    t = event.finished.timings
                    t.queue_ms += relay_offset_ms
                    t.ttft_ms += relay_offset_ms
                    t.total_ms = (time.perf_counter() - arrived) * 1e3
                    bound.info("finished", finish_reason=types_pb2.FinishReason.Name(
                        event.finished.finish_reason), generated_tokens=event.finished.usage.generated_tokens)
                yield event
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                message = (f"worker {worker.worker_id} at {worker.address} failed after "
                           f"{relayed_tokens} tokens: {error.details()}; its lease returns to the "
                           f"budget within {self._config.lease_ttl_s:g} s; retry the request")
            else:
                message = f"worker {worker.worker_id}: {error.details()}"
            bound.warning("worker call failed", code=error.code().name, details=error.details())
            await context.abort(error.code(), message, _relay_metadata(error, message))
        finally:
            if call is not None and not call.done():
                call.cancel()  # propagates a client cancel to the worker
            # A claimed lease is the worker's to release once its KV is freed;
            # one never claimed (the worker was never reached) is ours.
            if self._ledger.release_unclaimed(lease.lease_id):
                bound.info("released unclaimed lease")
