"""The worker's runtime load and unload (worker_service/adapter_admin.py) over a real engine
and a stand-in scheduler link: the pool and the ledger move together, and a ledger refusal
undoes the load."""

from __future__ import annotations

import asyncio

import pytest

from ortserve.status.errors import DomainError, ErrorReason
from ortserve.v1 import types_pb2
from tests.models import prepared_model_dir
from worker_service import adapter_admin
from worker_service.core.errors import InvalidWorkerField
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.lora import AdapterNoRoom


class StandInLink:
    """The ledger's side: records each resize, refuses when told to."""

    worker_id = "w"

    def __init__(self, refuse: bool = False) -> None:
        self.refuse = refuse
        self.resized: list[tuple[str, int, bool]] = []
        self.announced: tuple[int, list[str]] | None = None

    async def resize_for_adapter(self, adapter, loaded: bool):
        if self.refuse:
            raise DomainError(ErrorReason.ADAPTER_NO_ROOM, "the ledger's leases hold it")
        self.resized.append((adapter.name, adapter.held_bytes, loaded))
        return types_pb2.AdapterChange(worker_id=self.worker_id, adapter=adapter)

    def serving(self, capacity_bytes: int, adapters) -> None:
        self.announced = (capacity_bytes, [a.name for a in adapters])


@pytest.fixture(scope="module")
def lora_dir():
    path = prepared_model_dir("tiny-llama-lora-rows")
    if not (path / "lora-expected.json").is_file():
        pytest.skip(f"{path} has no lora-expected.json: run `make lora-demo`")
    return path


@pytest.fixture()
def engine(lora_dir):
    with Engine(EngineConfig(model_dir=lora_dir, intra_op_threads=1,
                             kv_capacity_bytes=8 * 2**20)) as engine:
        yield engine


def path_of(lora_dir, name: str) -> str:
    return str(lora_dir / "adapters" / f"{name}.onnx_adapter")


def test_load_then_unload_moves_the_pool_and_the_ledger_by_the_adapters_bytes(engine, lora_dir):
    link = StandInLink()
    capacity = engine.capacity_bytes
    asyncio.run(adapter_admin.load(engine, link, "fr", path_of(lora_dir, "random0")))
    nbytes = engine.adapters.total_bytes()
    assert nbytes > 0 and engine.capacity_bytes == capacity - nbytes
    assert link.resized == [("fr", nbytes, True)]
    assert link.announced == (capacity - nbytes, ["fr"])  # what a re-registration says
    asyncio.run(adapter_admin.unload(engine, link, "fr"))
    assert engine.capacity_bytes == capacity and engine.adapters.total_bytes() == 0
    assert link.resized[-1] == ("fr", nbytes, False)
    assert link.announced == (capacity, [])


def test_a_ledger_refusal_undoes_the_load(engine, lora_dir):
    capacity = engine.capacity_bytes
    with pytest.raises(DomainError, match="ledger"):
        asyncio.run(adapter_admin.load(engine, StandInLink(refuse=True), "fr",
                                       path_of(lora_dir, "random0")))
    assert engine.capacity_bytes == capacity and engine.adapters.names() == []


def test_a_load_the_sequences_leave_no_room_for_is_refused_with_the_numbers(engine, lora_dir):
    tokens = engine.capacity_bytes // engine.spec.bytes_per_token
    while engine.kv.bytes_for(tokens) > engine.capacity_bytes:
        tokens -= 1
    held = engine.kv.allocate(tokens)  # all but less than one block
    try:
        capacity = engine.capacity_bytes
        with pytest.raises(AdapterNoRoom) as error:
            asyncio.run(adapter_admin.load(engine, StandInLink(), "fr",
                                           path_of(lora_dir, "random0")))
        assert error.value.metadata["in_use_bytes"] == held.nbytes
        assert error.value.metadata["capacity_bytes"] == capacity
        assert engine.capacity_bytes == capacity and engine.adapters.names() == []
    finally:
        engine.kv.free(held)


def test_a_file_that_is_not_an_adapter_is_refused_naming_path(engine, lora_dir):
    with pytest.raises(InvalidWorkerField, match="path"):
        asyncio.run(adapter_admin.load(engine, StandInLink(), "fr",
                                       str(lora_dir / "tokenizer.json")))
