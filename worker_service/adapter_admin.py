"""Load and unload a LoRA adapter at runtime, its bytes moved in the KV capacity here and
in the scheduler's ledger together.

A load: read and check the file (off the event loop), take its bytes out of this
worker's KV capacity (refused, ADAPTER_NO_ROOM, when its sequences hold them),
serve it between two engine steps, then have the ledger move the worker's
capacity by the same bytes (SchedulerInternal.ResizeForAdapter, refused when the
ledger's leases hold them): a refusal there undoes the first steps, so the
worker and the ledger never disagree about what KV may hold. The ledger lists
the adapter only then, so no request is placed here for it before it is served.
An unload: stop serving it (ADAPTER_BUSY while sequences or sessions use it),
give its bytes back, then tell the ledger; a ledger that cannot be told keeps
the smaller capacity (the safe side) until the worker registers again.
"""

from __future__ import annotations

import asyncio

import grpc
import structlog

from ortserve.v1 import types_pb2
from worker_service.core.errors import InvalidWorkerField
from worker_service.engine.engine import Engine
from worker_service.runtime.lora import Adapter, AdapterNoRoom
from worker_service.scheduler_link import SchedulerLink

log = structlog.get_logger("worker")


def adapters_pb(engine: Engine) -> list[types_pb2.LoraAdapter]:
    """What this worker serves, for its registration, Info and the admin RPCs' answers."""
    return [adapter_pb(adapter) for adapter in engine.adapters.loaded()]


def adapter_pb(adapter: Adapter) -> types_pb2.LoraAdapter:
    return types_pb2.LoraAdapter(name=adapter.name, held_bytes=adapter.nbytes, path=adapter.path)


async def load(engine: Engine, link: SchedulerLink, name: str, path: str) -> types_pb2.AdapterChange:
    if engine.adapters.served is None:
        raise InvalidWorkerField("path", f"adapter {name!r}: this worker's model "
                             f"{engine.spec.name!r} takes no LoRA weights as inputs (or its KV "
                             "layout runs no adapters), so it serves none; load adapters on a "
                             "worker of a base built by `python -m model_tools.lora`")
    adapter = await asyncio.to_thread(engine.adapters.read, name, path, "path")
    in_use = engine.kv.take_capacity(adapter.nbytes)
    if in_use is not None:
        raise AdapterNoRoom(name, adapter.nbytes, engine.capacity_bytes, in_use)
    try:
        await asyncio.to_thread(engine.adapters.add, adapter)
        try:
            change = await link.resize_for_adapter(adapter_pb(adapter), loaded=True)
        except BaseException:
            await asyncio.to_thread(engine.adapters.remove, name)
            raise
    except BaseException:
        engine.kv.give_capacity(adapter.nbytes)
        raise
    link.serving(engine.capacity_bytes, adapters_pb(engine))
    log.info("adapter loaded", adapter=name, path=path, adapter_bytes=adapter.nbytes,
             capacity_bytes=engine.capacity_bytes)
    return change


async def unload(engine: Engine, link: SchedulerLink, name: str) -> types_pb2.AdapterChange:
    adapter = await asyncio.to_thread(engine.adapters.remove, name)
    engine.kv.give_capacity(adapter.nbytes)
    link.serving(engine.capacity_bytes, adapters_pb(engine))
    log.info("adapter unloaded", adapter=name, adapter_bytes=adapter.nbytes,
             capacity_bytes=engine.capacity_bytes)
    try:
        return await link.resize_for_adapter(adapter_pb(adapter), loaded=False)
    except grpc.aio.AioRpcError as error:
        # Unloaded here: the ledger keeps the smaller capacity (it under-offers, never
        # over) and lists the adapter (the worker answers NOT_FOUND) until we register again.
        log.warning("could not tell the scheduler an adapter was unloaded; it learns at the "
                    "next registration", adapter=name, code=error.code().name,
                    details=error.details())
        return types_pb2.AdapterChange(worker_id=link.worker_id, adapter=adapter_pb(adapter),
                                       capacity_bytes=engine.capacity_bytes,
                                       adapters=adapters_pb(engine))
