"""cuda_check's kv_memory_as_charged: the device memory reserved for KV is what the ledger
charges plus the stated overhead (runtime/device_memory.py), computed here from the
tensors' sizes apart from the allocator; on CUDA the device's free memory is read around a
probe allocation too (cudaMemGetInfo through the CUDA runtime ORT loaded)."""

from __future__ import annotations

import numpy as np

from worker_service.cuda_check.harness import Context
from worker_service.runtime import device_memory
from worker_service.runtime.device_rows import DeviceRows


def kv_memory_as_charged(ctx: Context) -> dict:
    """What the KV allocator reserved is the pool (what the ledger charges) plus the stated
    overhead, computed here apart from the allocator; on CUDA the device's own free memory
    is read around a probe allocation as well."""
    engine = ctx.engine
    rows: DeviceRows = engine.runtime.rows
    tensors = [rows.max_rows * rows.row_bytes] * (2 * engine.spec.num_layers)
    if rows.blocks.slots:
        tensors.append(rows.blocks.slots * rows.blocks.block_bytes)
    tensors += [rows.token_bytes] * 2  # the span copier's scratch tokens
    expected = sum(device_memory.rounded_bytes(n) for n in tensors)
    charged, reserved = engine.runtime.allocated_bytes, engine.runtime.reserved_bytes
    # The decode path's buckets and graphs are charged out of the same capacity (engine/engine.py).
    decode = engine.decode_buffer_bytes + engine.decode_graph_bytes
    out = {"charged_bytes": charged, "capacity_bytes": engine.capacity_bytes,
           "decode_buffer_bytes": engine.decode_buffer_bytes,
           "decode_graph_bytes": engine.decode_graph_bytes,
           "reserved_bytes": reserved, "overhead_bytes": reserved - charged,
           "expected_reserved_bytes": expected, "tensors": len(tensors),
           "allocator": engine.runtime.memory_strategy}
    ok = (reserved == expected and charged == engine.capacity_bytes + decode
          and engine.runtime.memory_strategy == "same-as-requested")
    if not ctx.dry_run:
        out["measured"] = _probe_device_reservation(ctx)
        ok = ok and out["measured"].get("ok", True)
    out["ok"] = ok
    return out


PROBE_BYTES = 96 * 2**20 + 4096  # next power of two: 128 MiB, far from what is asked


def _probe_device_reservation(ctx: Context) -> dict:
    """Free device memory (cudaMemGetInfo) before and after one KV-allocator tensor of
    PROBE_BYTES: it must drop by about that, not by the next power of two."""
    free_bytes = device_memory.cuda_free_bytes(ctx.device_id)
    if free_bytes is None:
        return {"ok": True, "not_measured": "no libcudart to ask for free memory"}
    before = free_bytes()
    probe = device_memory.KVMemory(ctx.device, ctx.device_id)
    value = probe.tensor([PROBE_BYTES], np.uint8)
    after = free_bytes()
    ctx.shared["probe"] = value  # kept to the end: the arena keeps it either way
    taken = before - after
    slack = 8 * 2**20  # the driver maps in 2 MiB pages
    return {"ok": PROBE_BYTES <= taken <= probe.reserved_bytes + slack or taken == 0,
            "probe_bytes": PROBE_BYTES, "device_free_drop_bytes": taken,
            "allocator_reserved_bytes": probe.reserved_bytes,
            "next_power_of_two_bytes": device_memory.next_power_of_two(PROBE_BYTES),
            "note": "0: the arena had a free chunk that size (inconclusive)"}
