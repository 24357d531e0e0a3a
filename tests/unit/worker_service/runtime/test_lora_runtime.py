"""LoRA adapters loaded and unloaded while the engine runs: served between steps, their
bytes out of (and back into) the KV capacity, refused while in use, gone afterwards."""

from __future__ import annotations

import json
import threading

import pytest

from tests.models import prepared_model_dir
from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.lora import AdapterBusy, AdapterNotFound


@pytest.fixture(scope="module", params=["tiny-llama-lora", "tiny-llama-lora-rows"])
def lora_dir(request):
    path = prepared_model_dir(request.param)
    if not (path / "lora-expected.json").is_file():
        pytest.skip(f"{path} has no lora-expected.json: run `make lora-demo`")
    return path


@pytest.fixture(scope="module")
def expected(lora_dir):
    return json.loads((lora_dir / "lora-expected.json").read_text())


@pytest.fixture()
def engine(lora_dir):
    adapters = (("random0", str(lora_dir / "adapters" / "random0.onnx_adapter")),)
    with Engine(EngineConfig(model_dir=lora_dir, intra_op_threads=2, prefill_chunk_tokens=64,
                             kv_capacity_bytes=8 * 2**20, lora_adapters=adapters)) as engine:
        yield engine


def run(engine: Engine, req: SequenceRequest) -> list[int]:
    done, out = threading.Event(), []

    def on_event(event) -> None:
        if isinstance(event, TERMINAL):
            out.append(event)
            done.set()

    engine.submit(req, on_event)
    assert done.wait(120) and isinstance(out[0], Completed), out
    return list(out[0].token_ids)


def test_an_adapter_loaded_at_runtime_serves_its_own_output_beside_the_others(engine, lora_dir,
                                                                             expected):
    prompt, new = tuple(expected["prompts"][0]), expected["new_tokens"]
    path = str(lora_dir / "adapters" / "random1.onnx_adapter")
    adapter = engine.adapters.read("late", path, "path")
    engine.adapters.add(adapter)
    assert engine.adapters.total_bytes() == 2 * adapter.nbytes
    assert run(engine, SequenceRequest("late", prompt, new, adapter="late")) == expected["random1"][0]
    assert run(engine, SequenceRequest("r0", prompt, new, adapter="random0")) == expected["random0"][0]


def test_an_idle_adapter_unloads_and_is_then_not_found(engine, expected):
    prompt, new = tuple(expected["prompts"][0]), expected["new_tokens"]
    run(engine, SequenceRequest("warm", prompt, new, adapter="random0"))
    removed = engine.adapters.remove("random0")
    assert removed.name == "random0" and engine.adapters.total_bytes() == 0
    with pytest.raises(AdapterNotFound):
        engine.check(SequenceRequest("gone", prompt, new, adapter="random0"))
    assert run(engine, SequenceRequest("base", prompt, new)) == expected["base"][0]
    with pytest.raises(AdapterNotFound):
        engine.adapters.remove("random0")


def test_an_adapter_in_use_is_not_unloaded_and_the_refusal_names_the_sequence(engine):
    done = threading.Event()
    handle = engine.submit(SequenceRequest("long", (1, 2, 3), 1_000, min_new_tokens=1_000,
                                           adapter="random0"),
                           lambda event: done.set() if isinstance(event, TERMINAL) else None)
    try:
        with pytest.raises(AdapterBusy, match="long") as error:
            engine.adapters.remove("random0")
        assert error.value.reason.value == "ADAPTER_BUSY"
        assert engine.adapters.names() == ["random0"]
    finally:
        handle.cancel()
        assert done.wait(60)
    engine.adapters.remove("random0")  # idle now


def test_an_open_session_under_an_adapter_keeps_it_loaded(engine, expected):
    engine.open_session("s")
    try:
        run_session = SequenceRequest("t1", tuple(expected["prompts"][0]), 4, adapter="random0")
        done = threading.Event()
        engine.submit(run_session, lambda e: done.set() if isinstance(e, TERMINAL) else None,
                      session_id="s")
        assert done.wait(60)
        with pytest.raises(AdapterBusy, match="session"):
            engine.adapters.remove("random0")
    finally:
        engine.close_session("s")
    engine.adapters.remove("random0")


def test_the_pool_gives_an_adapter_only_bytes_no_sequence_holds(engine):
    capacity = engine.capacity_bytes
    assert engine.kv.take_capacity(capacity + 1) == 0  # nothing held, but not that much room
    assert engine.capacity_bytes == capacity
    allocation = engine.kv.allocate(1_000)
    try:
        in_use = engine.kv.take_capacity(capacity - allocation.nbytes + 1)
        assert in_use == allocation.nbytes and engine.capacity_bytes == capacity
        assert engine.kv.take_capacity(4_096) is None
        assert engine.capacity_bytes == capacity - 4_096
        engine.kv.give_capacity(4_096)
        assert engine.capacity_bytes == capacity
    finally:
        engine.kv.free(allocation)


def test_an_adapter_reloaded_under_the_same_name_runs_its_new_weights(engine, lora_dir, expected):
    prompt, new = tuple(expected["prompts"][0]), expected["new_tokens"]
    assert run(engine, SequenceRequest("a", prompt, new, adapter="random0")) == expected["random0"][0]
    engine.adapters.remove("random0")
    # Another file under the same name: no binding may keep the old one's values.
    engine.adapters.add(engine.adapters.read("random0", str(lora_dir / "adapters" /
                                                           "random1.onnx_adapter")))
    assert run(engine, SequenceRequest("b", prompt, new, adapter="random0")) == expected["random1"][0]
