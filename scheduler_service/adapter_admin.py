"""Scheduler.LoadAdapter / UnloadAdapter: an operator's LoRA adapter calls, relayed to a worker.

They are on the scheduler, not only on the worker, because that is where callers
are authenticated: the public port's API keys give these RPCs to the admin role
(auth.METHOD_ROLES lists them not, so they need admin), while a worker's port
knows only the cluster certificate. The bytes move on the worker's side: the
worker takes the adapter's bytes out of its KV capacity and the ledger's in one
call (SchedulerInternal.ResizeForAdapter) before it loads, so a worker loaded
directly with a cluster certificate keeps the ledger as true as one loaded here.
"""

from __future__ import annotations

import grpc
import structlog

from ortserve.rpc.error_path import Relayed
from ortserve.rules import request_rules
from ortserve.status.errors import InvalidField, quoted
from ortserve.v1 import types_pb2
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.worker_clients import WorkerClients

log = structlog.get_logger("scheduler")

# Reading a file and copying it onto the device: seconds for a large adapter.
_CALL_TIMEOUT_S = 120.0


class AdapterAdmin:
    def __init__(self, ledger: Ledger, workers: WorkerClients) -> None:
        self._ledger = ledger
        self._workers = workers

    def _address(self, worker_id: str) -> str:
        """The registered worker's address; INVALID_ARGUMENT on worker_id naming the workers."""
        snapshot = self._ledger.snapshot()
        ids = [w.geometry.worker_id for w in snapshot]
        if not worker_id and len(snapshot) == 1:
            return snapshot[0].geometry.address
        for w in snapshot:
            if w.geometry.worker_id == worker_id:
                return w.geometry.address
        listed = ", ".join(quoted(i) for i in ids) or "none"
        why = "is empty" if not worker_id else f"{quoted(worker_id)} is not registered"
        raise InvalidField("worker_id", f"{why}; the registered workers are {listed} "
                           "(GetBudget's workers): name one", registered_workers=len(ids))

    async def load(self, request: types_pb2.LoadAdapterRequest) -> types_pb2.AdapterChange:
        return await self._relay("LoadAdapter", request, "adapter load relayed")

    async def unload(self, request: types_pb2.UnloadAdapterRequest) -> types_pb2.AdapterChange:
        return await self._relay("UnloadAdapter", request, "adapter unload relayed")

    async def _relay(self, method: str, request, event: str) -> types_pb2.AdapterChange:
        """`method` on the named worker; its refusal passes on as it is (its numbers included)."""
        request_rules.bounded("worker_id", request.worker_id, request_rules.MAX_WORKER_ID_CHARS)
        address = self._address(request.worker_id)
        try:
            change = await getattr(self._workers.stub(address), method)(
                request, timeout=_CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise Relayed(error) from None
        log.info(event, worker_id=change.worker_id, adapter=change.adapter.name,
                 adapter_bytes=change.adapter.held_bytes, capacity_bytes=change.capacity_bytes)
        return change
