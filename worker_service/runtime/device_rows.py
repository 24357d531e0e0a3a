"""Device rows: a row store (row_store.py) whose memory is ORT-allocated on the device.

Each layer's K and V is ONE OrtValue [max_rows, kv_heads, seq_tokens,
head_dim] allocated at start (device memory is allocated, not committed on
touch: the pool's capacity is what was allocated). The batched runner binds
rows [start, stop) by pointer at the row offset, as past input and present
output of the same memory (past_present_share_buffer), so a decode step moves
no KV: only the step's small inputs go up and the logits rows come down.

ORT's Python API copies whole OrtValues only, and rows move inside the larger
tensor (a freed row takes the last one; a session turn or a prefix-cache hit
writes a span of one row). The one mechanism for every such copy is
`SpanCopier`: a graph of Identity nodes, one per (layer, K/V, head), each
bound by pointer to a source span and a destination span: within one head of
one row, positions [t0, t1) are contiguous, so any token range of a row is
2 x layers x kv_heads contiguous spans, and one ORT run copies them all. A
span on the host side (a session's copy, a cached block) is bound as host
memory: ORT moves it across itself.

Every tensor comes from `device_memory.KVMemory`, an allocator that reserves
what is asked (not ORT's default arena, which rounds to powers of two): the
device holds the pool plus a stated overhead (`reserved_bytes`, `overhead_bytes`).

With device "cpu" the same code runs over CPU OrtValues, bound the same way:
the dry run and the tests exercise every path a GPU takes.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from ortserve.rules import kv_math
from worker_service.runtime.device_memory import KVMemory
from worker_service.runtime.kv_arena import block_tokens_for
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.row_store import RowTable, RowTableMixin, bind_rows

_ONNX_TYPE = {np.dtype(np.float16): onnx.TensorProto.FLOAT16,
              np.dtype(np.float32): onnx.TensorProto.FLOAT}


def _providers(device: str, device_id: int) -> list:
    if device == "cuda":
        return [("CUDAExecutionProvider", {"device_id": device_id}), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


class SpanCopier:
    """One ORT run copies up to `spans` contiguous spans [tokens, head_dim], each bound by
    pointer (device or host) at both ends."""

    def __init__(self, spans: int, dtype: np.dtype, head_dim: int, device: str,
                 device_id: int, memory: KVMemory | None = None) -> None:
        self.spans, self.dtype, self.head_dim = spans, dtype, head_dim
        self.device, self.device_id = device, device_id
        elem = _ONNX_TYPE[dtype]
        inputs = [helper.make_tensor_value_info(f"x{k}", elem, [f"n{k}", head_dim])
                  for k in range(spans)]
        outputs = [helper.make_tensor_value_info(f"y{k}", elem, [f"n{k}", head_dim])
                   for k in range(spans)]
        nodes = [helper.make_node("Identity", [f"x{k}"], [f"y{k}"]) for k in range(spans)]
        model = helper.make_model(helper.make_graph(nodes, "span_copy", inputs, outputs),
                                  opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(model.SerializeToString(), options,
                                            providers=_providers(device, device_id))
        # Every input must be bound: a run of fewer pairs copies one scratch token for the rest.
        memory = memory if memory is not None else KVMemory(device, device_id)
        self._scratch = [memory.tensor([1, head_dim], dtype) for _ in range(2)]
        self.runs = 0

    def copy(self, pairs: Sequence[tuple[tuple[str, int], tuple[str, int], int]]) -> None:
        """Copy each ((src device, src address), (dst device, dst address), tokens), in
        one run per `spans` pairs; a pair of 0 tokens is skipped."""
        pairs = [p for p in pairs if p[2] > 0]
        for start in range(0, len(pairs), self.spans):
            chunk = pairs[start:start + self.spans]
            binding = self.session.io_binding()
            for k in range(self.spans):
                if k >= len(chunk):
                    binding.bind_ortvalue_input(f"x{k}", self._scratch[0])
                    binding.bind_ortvalue_output(f"y{k}", self._scratch[1])
                    continue
                (src_dev, src), (dst_dev, dst), n = chunk[k]
                shape = [n, self.head_dim]
                binding.bind_input(f"x{k}", src_dev, self._id(src_dev), self.dtype, shape, src)
                binding.bind_output(f"y{k}", dst_dev, self._id(dst_dev), self.dtype, shape, dst)
            self.session.run_with_iobinding(binding)
            self.runs += 1

    def _id(self, device: str) -> int:
        return self.device_id if device == self.device else 0


class DeviceBlock:
    """A prefix-cache block held in a slot of the device block area (CachedBlock.kv); the
    slot goes back to the area when the last reference to the block does."""

    __slots__ = ("slot", "nbytes", "__weakref__")

    def __init__(self, slot: int, nbytes: int) -> None:
        self.slot, self.nbytes = slot, nbytes


class DeviceBlocks:
    """The device block area: `slots` blocks [2 x layers, kv_heads, block_tokens, head_dim],
    allocated at start beside the rows, where the prefix cache keeps its blocks."""

    def __init__(self, spec: ModelSpec, slots: int, block_tokens: int, dtype: np.dtype,
                 memory: KVMemory) -> None:
        self.shape = (2 * spec.num_layers, spec.kv_heads, block_tokens, spec.head_dim)
        self.block_bytes = math.prod(self.shape) * dtype.itemsize
        self.span_bytes = block_tokens * spec.head_dim * dtype.itemsize  # one head's tokens
        self.area = memory.tensor([slots, *self.shape], dtype) if slots else None
        self.slots = slots
        self._free = list(range(slots - 1, -1, -1))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def take(self) -> DeviceBlock | None:
        """A free slot as a block, or None when every slot holds one."""
        if not self._free:
            return None
        block = DeviceBlock(self._free.pop(), self.block_bytes)
        weakref.finalize(block, self._free.append, block.slot)
        return block

    def span(self, block: DeviceBlock, region: int, head: int) -> int:
        """The address of `head` of K/V region `region` (K of layer i at 2i) in the block."""
        assert self.area is not None
        return (self.area.data_ptr() + block.slot * self.block_bytes
                + (region * self.shape[1] + head) * self.span_bytes)


class DeviceRows(RowTableMixin):
    """Rows of KV in memory ORT allocated on `device`; see the module docstring."""

    def __init__(self, spec: ModelSpec, max_rows: int, device: str = "cuda",
                 device_id: int = 0, cache_blocks: int = 0) -> None:
        """`cache_blocks`: slots of the device block area the prefix cache keeps blocks in
        (0: its blocks are host arrays)."""
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.spec = spec
        self.max_rows = max_rows
        self.device, self.device_id = device, device_id
        self.dtype = np.dtype(spec.kv_dtype)
        # The ledger's granularity, as the host arena's: a model charges the same on both.
        self.block_tokens = block_tokens_for(spec.head_dim, self.dtype.itemsize)
        self.seq_tokens = -(-spec.context_length // self.block_tokens) * self.block_tokens
        self.row_shape = (spec.kv_heads, self.seq_tokens, spec.head_dim)
        self.token_bytes = spec.head_dim * self.dtype.itemsize  # one token of one head
        self.head_bytes = self.seq_tokens * self.token_bytes
        self.row_bytes = spec.kv_heads * self.head_bytes  # one row of one region
        shape = [max_rows, *self.row_shape]
        # Every tensor from one allocator that reserves what is asked (device_memory.py):
        # the device holds what the pool charges plus `memory`'s stated overhead.
        self.memory = KVMemory(device, device_id)
        # keys[i], values[i]: layer i's [max_rows, kv_heads, seq_tokens, head_dim]. Contents
        # need no initialising: attention reads only positions a run has written.
        self.keys = [self.memory.tensor(shape, self.dtype) for _ in range(spec.num_layers)]
        self.values = [self.memory.tensor(shape, self.dtype) for _ in range(spec.num_layers)]
        self.blocks = DeviceBlocks(spec, cache_blocks, self.block_tokens, self.dtype, self.memory)
        self.allocated_bytes = (2 * spec.num_layers * max_rows * self.row_bytes
                                + cache_blocks * self.blocks.block_bytes)
        # The device pool is what was allocated: charges may add up to all of it.
        self.table = RowTable(max_rows, spec.context_length, self.allocated_bytes,
                              self._bytes_for, what="a device KV row")
        self.copier = SpanCopier(2 * spec.num_layers * spec.kv_heads, self.dtype, spec.head_dim,
                                 device, device_id, self.memory)

    @staticmethod
    def block_bytes_for(spec: ModelSpec) -> int:
        """Device bytes one prefix-cache block takes (sizing before allocating)."""
        itemsize = np.dtype(spec.kv_dtype).itemsize
        block = block_tokens_for(spec.head_dim, itemsize)
        return 2 * spec.num_layers * spec.kv_heads * block * spec.head_dim * itemsize

    @staticmethod
    def row_bytes_for(spec: ModelSpec) -> int:
        """Device bytes one row takes over every layer and K/V (sizing before allocating)."""
        itemsize = np.dtype(spec.kv_dtype).itemsize
        block = block_tokens_for(spec.head_dim, itemsize)
        seq_tokens = -(-spec.context_length // block) * block
        return 2 * spec.num_layers * spec.kv_heads * seq_tokens * spec.head_dim * itemsize

    # --- accounting ----------------------------------------------------------

    @property
    def reserved_bytes(self) -> int:
        """Device bytes the KV allocator reserved: `allocated_bytes` plus `overhead_bytes`."""
        return self.memory.reserved_bytes

    @property
    def overhead_bytes(self) -> int:
        """Reserved beyond the pool: each tensor's rounding to the arena's 256 bytes and the
        span copier's two scratch tokens."""
        return self.memory.reserved_bytes - self.allocated_bytes

    def _bytes_for(self, n_tokens: int) -> int:
        return kv_math.bytes_for(n_tokens, self.spec.bytes_per_token, self.block_tokens)

    def memory_bytes(self) -> int:
        """Device bytes the store holds: all of it, from the start."""
        return self.allocated_bytes

    def held_bytes(self) -> int:
        """Whole blocks of what the live rows hold for their sequences (<= their charges)."""
        return self.table.written_bytes()

    def device_names(self) -> set[str]:
        area = [self.blocks.area] if self.blocks.area is not None else []
        return {v.device_name() for v in (*self.keys, *self.values, *area)}

    # --- spans ---------------------------------------------------------------

    def _regions(self) -> list[ort.OrtValue]:
        """K of layer i at 2i, V at 2i + 1 (the prefix cache's block order)."""
        return [r for i in range(self.spec.num_layers) for r in (self.keys[i], self.values[i])]

    def _span(self, region: ort.OrtValue, row: int, head: int, t0: int) -> int:
        return region.data_ptr() + row * self.row_bytes + head * self.head_bytes + t0 * self.token_bytes

    # --- free / move ---------------------------------------------------------

    def free(self, row: int) -> dict[int, int]:
        """Release `row`; the last row's written tokens move into it (one copier run), so
        rows stay [0, n). Returns {old row: new row} (maybe {})."""
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} is not live (rows are [0, {self.rows}))")
        last = self.rows - 1
        if row != last:
            n = self.written_tokens(last)
            self.copier.copy([((self.device, self._span(r, last, h, 0)),
                               (self.device, self._span(r, row, h, 0)), n)
                              for r in self._regions() for h in range(self.spec.kv_heads)])
        moved = self.table.remove(row)
        return {moved: row} if moved is not None else {}

    # --- host copies: sessions and the prefix cache ----------------------------

    def export_row(self, row: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The row's written K/V as host arrays (per layer [kv_heads, n, head_dim]); the row
        stays live, holding 0 tokens."""
        n = self.written_tokens(row)
        shape = (self.spec.kv_heads, n, self.spec.head_dim)
        keys = [np.empty(shape, self.dtype) for _ in range(self.spec.num_layers)]
        values = [np.empty(shape, self.dtype) for _ in range(self.spec.num_layers)]
        hosts = [a for i in range(self.spec.num_layers) for a in (keys[i], values[i])]
        self.copier.copy([((self.device, self._span(r, row, h, 0)),
                           ("cpu", host[h].ctypes.data), n)
                          for r, host in zip(self._regions(), hosts, strict=True)
                          for h in range(self.spec.kv_heads)])
        self.table.entry(row).written_tokens = 0
        return keys, values

    def import_row(self, row: int, keys: list, values: list, n_tokens: int) -> None:
        """Write positions [0, n_tokens) of `row` from host arrays made by `export_row`."""
        if n_tokens > self.max_tokens(row):
            raise ValueError(f"row {row} is charged for {self.max_tokens(row):,} tokens; "
                             f"it cannot take {n_tokens:,}")
        hosts = [np.ascontiguousarray(a[:, :n_tokens], dtype=self.dtype)
                 for i in range(self.spec.num_layers) for a in (keys[i], values[i])]
        self.copier.copy([(("cpu", host[h].ctypes.data),
                           (self.device, self._span(r, row, h, 0)), n_tokens)
                          for r, host in zip(self._regions(), hosts, strict=True)
                          for h in range(self.spec.kv_heads)])
        for i in range(self.spec.num_layers):
            keys[i] = values[i] = None
        self.note_written(row, n_tokens)

    def export_block(self, row: int, block: int) -> np.ndarray | DeviceBlock:
        """Block `block` of `row`: into a slot of the device block area when one is free
        (a DeviceBlock), else a host array [2 x layers, kv_heads, block_tokens, head_dim]
        (K of layer i at 2i, V at 2i + 1)."""
        bt = self.block_tokens
        t0 = block * bt
        if t0 + bt > self.written_tokens(row):
            raise ValueError(f"row {row} holds {self.written_tokens(row):,} tokens; block "
                             f"{block} ends at {t0 + bt:,}")
        heads = range(self.spec.kv_heads)
        slot = self.blocks.take()
        if slot is not None:
            self.copier.copy([((self.device, self._span(r, row, h, t0)),
                               (self.device, self.blocks.span(slot, k, h)), bt)
                              for k, r in enumerate(self._regions()) for h in heads])
            return slot
        out = np.empty((2 * self.spec.num_layers, self.spec.kv_heads, bt, self.spec.head_dim),
                       self.dtype)
        self.copier.copy([((self.device, self._span(r, row, h, t0)),
                           ("cpu", out[k, h].ctypes.data), bt)
                          for k, r in enumerate(self._regions()) for h in heads])
        return out

    def import_block(self, row: int, block: int, kv: np.ndarray | DeviceBlock) -> None:
        """Write one block made by `export_block` into `row` (a prefix cache hit); the caller
        reports the tokens held with `note_written` once every block is in."""
        bt = self.block_tokens
        t0 = block * bt
        if t0 + bt > self.max_tokens(row):
            raise ValueError(f"row {row} is charged for {self.max_tokens(row):,} tokens; "
                             f"block {block} ends at {t0 + bt:,}")
        heads = range(self.spec.kv_heads)
        if isinstance(kv, DeviceBlock):
            self.copier.copy([((self.device, self.blocks.span(kv, k, h)),
                               (self.device, self._span(r, row, h, t0)), bt)
                              for k, r in enumerate(self._regions()) for h in heads])
            return
        kv = np.ascontiguousarray(kv, dtype=self.dtype)
        self.copier.copy([(("cpu", kv[k, h].ctypes.data),
                           (self.device, self._span(r, row, h, t0)), bt)
                          for k, r in enumerate(self._regions()) for h in heads])

    def block_numpy(self, kv: np.ndarray | DeviceBlock) -> np.ndarray:
        """A host copy of a block made by `export_block` (for checks)."""
        if not isinstance(kv, DeviceBlock):
            return kv
        out = np.empty(self.blocks.shape, self.dtype)
        self.copier.copy([((self.device, self.blocks.span(kv, k, h)),
                           ("cpu", out[k, h].ctypes.data), self.block_tokens)
                          for k in range(out.shape[0]) for h in range(self.spec.kv_heads)])
        return out

    def row_numpy(self, row: int, n_tokens: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """A host copy of positions [0, n) of `row` without changing it (for checks)."""
        entry = self.table.entry(row)
        written = entry.written_tokens
        entry.written_tokens = n_tokens
        try:
            return self.export_row(row)
        finally:
            entry.written_tokens = written

    # --- binding -------------------------------------------------------------

    def bind(self, binding: ort.IOBinding, start_row: int, stop_row: int) -> None:
        """Bind rows [start, stop) of every layer as past input and present output, by
        pointer at the row offset inside the layer's tensor (row_store.bind_rows)."""
        bind_rows(binding, self.spec, self.keys, self.values, start_row, stop_row,
                  self.row_shape, self.dtype,
                  lambda region, row: region.data_ptr() + row * self.row_bytes,
                  self.device, self.device_id)

    def close(self) -> None:
        """Drop the device memory (every binding over it must be gone first)."""
        self.table.clear()
        self.keys = self.values = []
        self.blocks.area = None


def rows_for_capacity(spec: ModelSpec, capacity_bytes: int, max_rows: int) -> int:
    """How many full-context rows fit `capacity_bytes`, at most `max_rows`."""
    return max(0, min(max_rows, capacity_bytes // DeviceRows.row_bytes_for(spec)))
