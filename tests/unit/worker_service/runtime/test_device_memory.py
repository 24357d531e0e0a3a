"""KV memory as charged (runtime/device_memory.py): the KV tensors come from an allocator
that reserves what is asked, so the device holds the pool plus a stated overhead; the
prefix cache's device block area is a bounded share. Run over CPU OrtValues, the same code
a GPU takes."""

from __future__ import annotations

import numpy as np

from tests.unit.worker_service.runtime.test_kv_arena import make_spec
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime import device_memory
from worker_service.runtime.device_rows import DeviceRows


def test_the_arena_rounds_a_request_to_256_bytes_not_to_a_power_of_two():
    assert device_memory.rounded_bytes(1) == 256
    assert device_memory.rounded_bytes(256) == 256
    assert device_memory.rounded_bytes(257) == 512
    asked = 42 * 2**30 + 100
    assert device_memory.rounded_bytes(asked) == 42 * 2**30 + 256
    assert device_memory.next_power_of_two(asked) == 64 * 2**30  # what ORT's default takes


def test_kv_tensors_come_from_the_same_as_requested_allocator_and_are_counted():
    memory = device_memory.KVMemory("cpu", 0)
    assert memory.strategy == "same-as-requested"
    a = memory.tensor([3, 5, 7], np.float16)  # 210 bytes
    b = memory.tensor([1024], np.float32)  # 4,096 bytes
    assert a.device_name() == "cpu" and a.shape() == [3, 5, 7] and b.shape() == [1024]
    assert memory.requested_bytes == 210 + 4096
    assert memory.reserved_bytes == 256 + 4096
    b.numpy()[:] = 1.0  # real memory, writable through ORT's own views
    assert a.data_ptr() != b.data_ptr()


def test_device_rows_reserve_the_pool_plus_the_stated_overhead():
    spec = make_spec(layers=3, kv_heads=2, head_dim=64, context_length=1000, dtype=np.float16)
    rows = DeviceRows(spec, 4, device="cpu", cache_blocks=5)
    tensors = ([4 * rows.row_bytes] * (2 * spec.num_layers) + [5 * rows.blocks.block_bytes]
               + [rows.token_bytes] * 2)
    assert rows.allocated_bytes == sum(tensors[:-2])
    assert rows.reserved_bytes == sum(-(-n // 256) * 256 for n in tensors)
    assert rows.overhead_bytes == rows.reserved_bytes - rows.allocated_bytes
    # The overhead is the copier's two scratch tokens and rounding: bytes, not a power of two.
    assert 0 < rows.overhead_bytes <= 256 * len(tensors)


def test_the_device_block_area_is_at_most_half_the_capacity_asked(tiny_dir):
    """Two rows asked of a large capacity: the rows leave most of it, and the block area
    takes at most DEVICE_CACHE_SHARE of it (before: everything the rows left)."""
    capacity = 64 * 2**20
    config = EngineConfig(model_dir=tiny_dir, kv_layout="device-rows", max_batch_rows=2,
                          max_context_tokens=1024, kv_capacity_bytes=capacity,
                          intra_op_threads=1)
    with Engine(config) as engine:
        rows = engine.runtime.rows
        cache_bytes = rows.blocks.slots * rows.blocks.block_bytes
        assert rows.max_rows == 2 and 0 < cache_bytes <= capacity // 2
        # The decode buckets' fixed buffers come out of what was allocated (engine/engine.py).
        assert engine.capacity_bytes + engine.decode_buffer_bytes == (
            engine.runtime.allocated_bytes) == 2 * DeviceRows.row_bytes_for(engine.spec) + cache_bytes
        assert engine.runtime.reserved_bytes == rows.reserved_bytes > engine.capacity_bytes
        assert engine.runtime.memory_strategy == "same-as-requested"
