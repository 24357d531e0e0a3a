"""Device rows (runtime/device_rows.py) over CPU OrtValues, bound exactly as on a GPU:
rows bound by pointer at row offsets, rows moved inside the larger tensor, spans copied
out and in, and the batched runner over them equal to each sequence alone."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.models import prepared_model_dir
from tests.unit.worker_service.runtime.test_kv_arena import make_spec
from tests.unit.worker_service.runtime.test_ort_rows import (
    alone,
    drive,
    mixed_plans,
    session_for,
)
from worker_service.core.errors import CapacityExceeded
from worker_service.runtime.device_rows import DeviceBlock, DeviceRows
from worker_service.runtime.model import load_model_spec
from worker_service.runtime.ort_rows import OrtRows


def cpu_rows(spec, max_rows):
    return DeviceRows(spec, max_rows, device="cpu")


def fill(rows: DeviceRows, row: int, n: int, seed: float) -> tuple[list, list]:
    shape = (rows.spec.kv_heads, n, rows.spec.head_dim)
    rng = np.random.default_rng(int(seed * 1000))
    keys = [rng.random(shape).astype(rows.dtype) for _ in range(rows.spec.num_layers)]
    values = [rng.random(shape).astype(rows.dtype) for _ in range(rows.spec.num_layers)]
    rows.import_row(row, list(keys), list(values), n)
    return keys, values


def whole(region, row):
    return region.numpy()[row]


def test_rows_live_in_ort_values_on_the_device_and_charge_the_ledger_s_formula():
    spec = make_spec(context_length=100, dtype=np.float16)
    rows = cpu_rows(spec, 3)
    assert rows.device_names() == {"cpu"}
    assert rows.memory_bytes() == rows.capacity_bytes == 3 * DeviceRows.row_bytes_for(spec)
    assert rows.bytes_for(1) == rows.block_tokens * spec.bytes_per_token
    rows.allocate(100), rows.allocate(100), rows.allocate(100)
    with pytest.raises(CapacityExceeded, match="0 B free"):
        rows.allocate(1)


def test_a_freed_row_takes_the_last_row_by_a_pointer_bound_copy_and_the_rest_is_untouched():
    spec = make_spec(layers=2, kv_heads=2, head_dim=16, context_length=64, dtype=np.float16)
    rows = cpu_rows(spec, 4)
    data = []
    for r, n in enumerate((10, 33, 5, 47)):
        assert rows.allocate(64) == r
        data.append(fill(rows, r, n, r + 1))
    before = [whole(region, 0).copy() for region in rows.keys]
    assert rows.free(1) == {3: 1}
    assert rows.rows == 3 and rows.written_tokens(1) == 47 and rows.copier.runs >= 5
    keys, values = rows.row_numpy(1, 47)
    for i in range(spec.num_layers):
        np.testing.assert_array_equal(keys[i], data[3][0][i])  # the moved row equals its source
        np.testing.assert_array_equal(values[i], data[3][1][i])
        np.testing.assert_array_equal(whole(rows.keys[i], 0), before[i])  # others untouched
    keys, values = rows.row_numpy(2, 5)
    np.testing.assert_array_equal(keys[1], data[2][0][1])
    assert rows.free(2) == {} and rows.rows == 2


@pytest.mark.parametrize("cache_blocks", [0, 1])
def test_blocks_and_rows_copy_out_and_back_in_exactly(cache_blocks):
    """With a device block area a block stays on the device (a slot, back when the block
    goes); without one, or with every slot taken, it is a host array."""
    spec = make_spec(layers=2, kv_heads=3, head_dim=16, context_length=512, dtype=np.float32)
    rows = DeviceRows(spec, 2, device="cpu", cache_blocks=cache_blocks)
    a, b = rows.allocate(512), rows.allocate(512)
    keys, values = fill(rows, a, 2 * rows.block_tokens + 3, 7)
    first = rows.export_block(a, 1)
    assert isinstance(first, DeviceBlock) == bool(cache_blocks)
    block = rows.block_numpy(first)
    bt = rows.block_tokens
    np.testing.assert_array_equal(block[2], keys[1][:, bt:2 * bt])  # K of layer 1 at 2
    np.testing.assert_array_equal(block[1], values[0][:, bt:2 * bt])
    second = rows.export_block(a, 0)  # no slot left: a host array
    assert isinstance(second, np.ndarray)
    rows.import_block(b, 0, second)
    rows.import_block(b, 1, first)
    del first
    assert rows.blocks.free_slots == cache_blocks  # the slot went back with the block
    rows.note_written(b, 2 * bt)
    got_k, got_v = rows.row_numpy(b, 2 * bt)
    np.testing.assert_array_equal(got_k[1], keys[1][:, :2 * bt])
    out_k, out_v = rows.export_row(a)
    assert rows.written_tokens(a) == 0
    np.testing.assert_array_equal(out_v[0], values[0])


@pytest.fixture(scope="module")
def tiny():
    spec = load_model_spec(prepared_model_dir("tiny-llama"))
    return spec, session_for(spec)


def test_batched_decode_over_device_rows_equals_each_sequence_alone(tiny):
    """Joins, leaves (rows moved inside the tensors) and a cancel, with teacher forcing so
    every logit row is compared, against each sequence decoded alone on the host arena."""
    spec, session = tiny
    plans = mixed_plans(np.random.default_rng(1), spec.vocab_size, forced=True)
    tokens, logits, (largest, moves, beside) = drive(session, spec, plans, max_rows=6,
                                                     make_store=cpu_rows)
    assert largest >= 5 and moves >= 1 and beside >= 4
    for i, plan in enumerate(plans):
        solo_tokens, solo_logits = alone(session, spec, plan)
        assert tokens[i] == solo_tokens[:len(tokens[i])]
        for step, (got, want) in enumerate(zip(logits[i], solo_logits, strict=False)):
            np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"seq {i} token {step}")


def test_first_chunks_prefill_together_into_device_rows(tiny):
    spec, session = tiny
    rows = cpu_rows(spec, 4)
    runner = OrtRows(session, spec, rows, max_chunk_tokens=64)
    prompts = [[5, 9, 13], [7, 3, 2, 8, 1, 4], [11]]
    for _ in prompts:
        rows.allocate(10)
    together = runner.prefill_first(0, prompts).copy()
    for b, p in enumerate(prompts):
        solo = cpu_rows(spec, 1)
        solo.allocate(len(p) + 4)
        want = OrtRows(session, spec, solo, max_chunk_tokens=64).prefill(0, 0, p)
        np.testing.assert_allclose(together[b], want, atol=1e-4)
        assert rows.written_tokens(b) == len(p)


def test_the_factory_sizes_device_rows_to_the_capacity_and_says_the_allocation_is_it(tiny):
    from worker_service.core.errors import InvalidWorkerField
    from worker_service.engine.config import EngineConfig
    from worker_service.engine.engine import Engine

    spec, _ = tiny
    row = DeviceRows.row_bytes_for(spec)
    config = EngineConfig(model_dir=spec.model_dir, intra_op_threads=1, kv_layout="device-rows",
                          max_batch_rows=64, kv_capacity_bytes=5 * row + row // 2)
    block = DeviceRows.block_bytes_for(spec)
    with Engine(config) as engine:  # 5 rows; the half row left over holds cache blocks
        assert engine.kv_layout == "device-rows" and engine.max_batch_rows == 5
        slots = (row // 2) // block
        # The capacity is the allocation less the decode buckets' fixed buffers (charged at
        # start); on the CPU nothing is captured, so no graph bytes.
        assert engine.decode_buffer_bytes > 0 and engine.decode_graph_bytes == 0
        assert engine.capacity_bytes + engine.decode_buffer_bytes == (
            engine.runtime.allocated_bytes) == 5 * row + slots * block
        assert engine.prefix_cache.limit_bytes == slots * block
        assert engine.sessions is not None and engine.prefix_cache is not None
        assert engine.kv.parks_on_host and engine.runtime.kv_device_names() == {"cpu"}
    # Shorter rows: more of them in the same bytes. 64 rows' decode buckets hold ~24 MiB of
    # fixed buffers (mostly [bucket, vocab] float32 logits), charged out of the capacity:
    # with tiny-llama's 100-token rows they outweigh the KV, so the capacity has room.
    short = EngineConfig(model_dir=spec.model_dir, intra_op_threads=1, kv_layout="device-rows",
                         max_batch_rows=64, max_context_tokens=100,
                         kv_capacity_bytes=5 * row + row // 2 + 64 * 2**20)
    with Engine(short) as engine:
        assert engine.spec.context_length == 100 and engine.max_batch_rows == 64
        assert engine.capacity_bytes == engine.runtime.allocated_bytes - engine.decode_buffer_bytes
    with pytest.raises(InvalidWorkerField, match="decode buckets' fixed buffers"):
        Engine(dataclasses.replace(short, kv_capacity_bytes=5 * row + row // 2))
    reserved = EngineConfig(model_dir=spec.model_dir, intra_op_threads=1, kv_layout="device-rows",
                            max_batch_rows=64, kv_capacity_bytes=5 * row + row // 2,
                            prefix_cache_bytes=2 * row)  # the cache's area first, rows after
    with Engine(reserved) as engine:
        assert engine.max_batch_rows == 3 and engine.prefix_cache.limit_bytes == 2 * row
    with pytest.raises(InvalidWorkerField, match="one device KV row"):
        Engine(EngineConfig(model_dir=spec.model_dir, intra_op_threads=1,
                            kv_layout="device-rows", kv_capacity_bytes=row - 1))


@pytest.mark.parametrize(("device", "layout", "kind"), [
    ("cuda", "auto", "device-rows"), ("cuda", "rows", "device-rows"),
    ("cpu", "auto", "arena"), ("cpu", "device-rows", "device-rows"),
    ("cuda", "static", "static"), ("cpu", "static", "static"),
])
def test_the_static_per_sequence_layout_is_built_only_when_named(tiny, monkeypatch, device,
                                                                 layout, kind):
    """A cuda runtime is device rows unless static is asked for by name (the rows are made
    on the CPU here: no GPU; the choice is the factory's, above any memory)."""
    from worker_service.engine.config import EngineConfig
    from worker_service.runtime import factory

    spec, session = tiny
    class HostMadeRows(DeviceRows):
        def __init__(self, spec, rows, device, device_id, cache_blocks=0):
            super().__init__(spec, rows, "cpu", 0, cache_blocks)

    monkeypatch.setattr(factory, "DeviceRows", HostMadeRows)
    config = EngineConfig(model_dir=spec.model_dir, device=device, kv_layout=layout,
                          max_batch_rows=4, kv_capacity_bytes=16 * 2**20)
    runtime = factory.build_runtime(config, spec, session, chunk_tokens=64)
    try:
        assert runtime.kind == kind
        assert runtime.capabilities.batched == runtime.capabilities.sessions == (kind != "static")
    finally:
        runtime.close()


def test_the_host_arena_is_refused_on_cuda(tiny):
    from worker_service.core.errors import InvalidWorkerField
    from worker_service.engine.config import EngineConfig
    from worker_service.runtime.factory import build_runtime

    spec, session = tiny
    with pytest.raises(InvalidWorkerField, match="host memory"):
        build_runtime(EngineConfig(model_dir=spec.model_dir, device="cuda", kv_layout="arena"),
                      spec, session, chunk_tokens=64)


def test_64_sequences_decode_in_one_run_over_64_device_rows(tiny):
    """Rows past genai's 32: 64 sequences submitted at once share every decode run, and
    each equals its batch-1 run (sampled with its own seed: any logit difference shows)."""
    import dataclasses
    import threading

    from worker_service.core.sampling import SamplingConfig
    from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest
    from worker_service.engine.config import EngineConfig
    from worker_service.engine.engine import Engine

    spec, _ = tiny
    row = DeviceRows.row_bytes_for(dataclasses.replace(spec, context_length=64))
    config = EngineConfig(model_dir=spec.model_dir, intra_op_threads=2, kv_layout="device-rows",
                          max_batch_rows=64, max_context_tokens=64,
                          # Room for the 64 rows' decode buckets (~24 MiB of fixed buffers,
                          # charged out of the capacity: engine/engine.py).
                          kv_capacity_bytes=64 * row + 64 * 2**20)
    with Engine(config) as engine:
        assert engine.max_batch_rows == 64
        reqs = [SequenceRequest(f"s{i}", (1 + i % 7, 5, 9 + i % 3), 6, min_new_tokens=6,
                                sampling=SamplingConfig(temperature=1.0, seed=i))
                for i in range(64)]
        ended: dict[str, object] = {}
        done = threading.Event()

        def on_event(event) -> None:
            if isinstance(event, TERMINAL):
                ended[event.sequence_id] = event
                if len(ended) == len(reqs):
                    done.set()

        for r in reqs:
            engine.submit(r, on_event)
        assert done.wait(300) and all(isinstance(e, Completed) for e in ended.values())
        assert engine.runner.largest_batch == 64
        for i in (0, 17, 63):
            solo = engine.generate(SequenceRequest(f"solo-{i}", reqs[i].prompt_ids, 6,
                                                   min_new_tokens=6, sampling=reqs[i].sampling))
            assert solo.token_ids == ended[f"s{i}"].token_ids
