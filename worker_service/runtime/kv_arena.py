"""A commit-on-touch KV arena: every sequence is one row of a shared batch buffer (CPU).

Batched decode needs each layer's past/present as ONE tensor [B, kv_heads, L,
head_dim] whose rows are the running sequences (DESIGN.md, "Batching"). The
arena reserves address space for `max_rows` full-context rows up front and lets
the kernel commit memory only where KV is written:

- one anonymous private mapping (MAP_NORESERVE, MADV_NOHUGEPAGE) holds, for
  every layer, a K region and a V region, each viewed as a numpy array
  [max_rows, kv_heads, seq_tokens, head_dim]. One mapping rather than one per
  layer: the kernel may merge adjacent anonymous mappings into one VMA anyway,
  and a single VMA makes the kernel's view (`kernel_committed_bytes`) exact;
- `block_tokens` tokens of one head fill whole pages, and every head's region
  starts on a page boundary (seq_tokens is context_length rounded up to
  blocks), so a row holding n tokens commits exactly
  ceil(n / block_tokens) x block_tokens x bytes_per_token: the ledger's own
  formula (`bytes_for`) applied to what was written, never above the charge;
- freeing a row returns its pages (MADV_DONTNEED) and moves the last row into
  the hole, so rows [0, n) stay contiguous and one run decodes them all.

Accounting is by charge: sum of bytes_for(max_tokens) over live rows <=
capacity_bytes. The caller reports how many tokens a row holds
(`note_written`); the runner does so after every run.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap

import numpy as np
import onnxruntime as ort

from ortserve.rules import kv_math
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.row_store import RowTable, RowTableMixin, bind_rows

# Not exported by Python's mmap module; the Linux value on x86_64 and arm64.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_GUARD_BYTES = mmap.PAGESIZE
_PROT_NONE = 0
_libc = ctypes.CDLL(None, use_errno=True)


def _protect_none(address: int) -> None:
    """Make one page inaccessible (a guard: its own VMA, never merged with the arena's)."""
    if _libc.mprotect(ctypes.c_void_p(address), ctypes.c_size_t(_GUARD_BYTES), _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect of the KV arena's guard page failed")


def block_tokens_for(head_dim: int, itemsize: int, page_bytes: int = mmap.PAGESIZE) -> int:
    """Fewest tokens whose K (or V) of one head fills whole pages.

    page / (head_dim x itemsize) when that divides (16 at head_dim 64 fp32);
    otherwise the smallest page-aligned block (head_dim 96 fp32: 32 tokens in
    3 pages), so committed memory still moves in whole blocks.
    """
    token_head_bytes = head_dim * itemsize
    return math.lcm(page_bytes, token_head_bytes) // token_head_bytes


class KVArena(RowTableMixin):
    """Rows of KV in one commit-on-touch mapping (a RowStore in host memory); see the module
    docstring. The rows' bookkeeping is the RowTable's; this class is the memory."""

    device = "cpu"

    def __init__(self, spec: ModelSpec, max_rows: int, capacity_bytes: int) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.spec = spec
        self.max_rows = max_rows
        self.dtype = np.dtype(spec.kv_dtype)
        self.block_tokens = block_tokens_for(spec.head_dim, self.dtype.itemsize)
        # The row's sequence axis, rounded up so each head's region is whole blocks
        # (and so page-aligned). GQA only reads and writes positions < the mask width.
        self.seq_tokens = -(-spec.context_length // self.block_tokens) * self.block_tokens
        self.row_shape = (spec.kv_heads, self.seq_tokens, spec.head_dim)
        self.region_bytes = max_rows * math.prod(self.row_shape) * self.dtype.itemsize
        self.mapped_bytes = 2 * spec.num_layers * self.region_bytes
        # A PROT_NONE guard page on each side: the kernel merges adjacent anonymous
        # mappings of equal flags (another arena's, say) into one VMA, which would
        # blur the kernel's count of this arena's pages (found in the tests).
        self._map = mmap.mmap(-1, self.mapped_bytes + 2 * _GUARD_BYTES,
                              flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE,
                              prot=mmap.PROT_READ | mmap.PROT_WRITE)
        # Huge pages would commit 2 MiB at a touch: far above a short row's charge.
        self._map.madvise(mmap.MADV_NOHUGEPAGE)
        flat = np.frombuffer(self._map, dtype=self.dtype,
                             count=self.mapped_bytes // self.dtype.itemsize, offset=_GUARD_BYTES)
        _protect_none(flat.ctypes.data - _GUARD_BYTES)
        _protect_none(flat.ctypes.data + self.mapped_bytes)
        per_region = self.region_bytes // self.dtype.itemsize
        shape = (max_rows, *self.row_shape)
        # keys[i], values[i]: layer i's [max_rows, kv_heads, seq_tokens, head_dim].
        self.keys = [flat[(2 * i) * per_region:(2 * i + 1) * per_region].reshape(shape)
                     for i in range(spec.num_layers)]
        self.values = [flat[(2 * i + 1) * per_region:(2 * i + 2) * per_region].reshape(shape)
                       for i in range(spec.num_layers)]
        self.base_address = flat.ctypes.data
        self.table = RowTable(max_rows, spec.context_length, capacity_bytes, self._bytes_for,
                              what="a KV arena row")

    # --- accounting ----------------------------------------------------------

    def _bytes_for(self, n_tokens: int) -> int:
        return kv_math.bytes_for(n_tokens, self.spec.bytes_per_token, self.block_tokens)

    def committed_bytes(self) -> int:
        """The arena's page accounting: whole blocks of the positions each row has touched."""
        return self.table.touched_bytes()

    def memory_bytes(self) -> int:
        return self.committed_bytes()

    def device_names(self) -> set[str]:
        return {"cpu"}

    def kernel_committed_bytes(self) -> int:
        """Resident bytes of the arena's mapping, as the kernel counts them (/proc/self/smaps)."""
        start, end = self.base_address, self.base_address + self.mapped_bytes
        total_kib = 0
        inside = False
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split(maxsplit=1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    inside = lo < end and hi > start
                    if inside and (lo < start or hi > end):
                        # Merged with a neighbour: the count would not be the arena's alone.
                        raise RuntimeError(f"VMA {head} straddles the arena [{start:#x}, {end:#x})")
                elif inside and head == "Rss:":
                    total_kib += int(line.split()[1])
        return total_kib * 1024

    # --- free --------------------------------------------------------------

    def free(self, row: int) -> dict[int, int]:
        """Release `row`; returns {old row: new row} for a row moved into the hole (maybe {}).

        The last live row moves into the hole, copying only its written tokens,
        so rows stay [0, n). The freed row's charge is dropped only once the move
        is done, and the copy goes in chunks no larger than that charge whose
        source pages are returned at once: committed memory stays within the
        charges throughout.
        """
        if not 0 <= row < self.rows:
            raise IndexError(f"row {row} is not live (rows are [0, {self.rows}))")
        last = self.rows - 1
        freed = self.table.entry(row)
        self._discard_from(row, 0)
        if row != last:
            kept = self.table.entry(last)
            chunk_tokens = self.bytes_for(freed.max_tokens) // self.spec.bytes_per_token
            for t0 in range(0, kept.written_tokens, chunk_tokens):
                t1 = min(t0 + chunk_tokens, kept.written_tokens)
                for region in (*self.keys, *self.values):
                    region[row, :, t0:t1] = region[last, :, t0:t1]
                self._discard_from(last, t0, t1)
            self._discard_from(last, 0)
        moved = self.table.remove(row)
        return {moved: row} if moved is not None else {}

    def export_row(self, row: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Copy the row's written K/V out to host arrays (per layer [kv_heads, n, head_dim]).

        For a session between turns (session_kv.py). The row's pages are returned
        block by block as they are copied, so the row plus its copy commit at most
        one block more than the row alone did. The row stays live, holding 0 tokens.
        """
        entry = self.table.entry(row)
        n = entry.written_tokens
        shape = (self.spec.kv_heads, n, self.spec.head_dim)
        keys = [np.empty(shape, self.dtype) for _ in range(self.spec.num_layers)]
        values = [np.empty(shape, self.dtype) for _ in range(self.spec.num_layers)]
        step = self.block_tokens
        for t0 in range(0, n, step):
            t1 = min(t0 + step, n)
            for i in range(self.spec.num_layers):
                keys[i][:, t0:t1] = self.keys[i][row, :, t0:t1]
                values[i][:, t0:t1] = self.values[i][row, :, t0:t1]
            self._discard_from(row, t0, t1)
        entry.written_tokens = 0
        return keys, values

    def import_row(self, row: int, keys: list, values: list, n_tokens: int) -> None:
        """Write positions [0, n_tokens) of `row` from host arrays made by `export_row`.

        Each layer's source entry is set to None once copied, so a caller that
        handed over its only reference frees the copy layer by layer.
        """
        if n_tokens > self.max_tokens(row):
            raise ValueError(f"row {row} is charged for {self.max_tokens(row):,} tokens; "
                             f"it cannot take {n_tokens:,}")
        for i in range(self.spec.num_layers):
            self.keys[i][row, :, :n_tokens] = keys[i][:, :n_tokens]
            self.values[i][row, :, :n_tokens] = values[i][:, :n_tokens]
            keys[i] = values[i] = None
        self.note_written(row, n_tokens)

    def export_block(self, row: int, block: int) -> np.ndarray:
        """Copy block `block` of `row` out as [2 x layers, kv_heads, block_tokens, head_dim]
        (K of layer i at 2i, V at 2i + 1), then return the row's pages of that block: a
        finishing row's blocks go to the prefix cache without the two ever both committed."""
        bt = self.block_tokens
        t0, t1 = block * bt, (block + 1) * bt
        if t1 > self.written_tokens(row):
            raise ValueError(f"row {row} holds {self.written_tokens(row):,} tokens; block "
                             f"{block} ends at {t1:,}")
        out = np.empty((2 * self.spec.num_layers, self.spec.kv_heads, bt, self.spec.head_dim),
                       self.dtype)
        for i in range(self.spec.num_layers):
            out[2 * i] = self.keys[i][row, :, t0:t1]
            out[2 * i + 1] = self.values[i][row, :, t0:t1]
        self._discard_from(row, t0, t1)
        return out

    def import_block(self, row: int, block: int, kv: np.ndarray) -> None:
        """Write one block made by `export_block` into `row` (a prefix cache hit); the caller
        reports the tokens held with `note_written` once every block is in."""
        bt = self.block_tokens
        t0, t1 = block * bt, (block + 1) * bt
        if t1 > self.max_tokens(row):
            raise ValueError(f"row {row} is charged for {self.max_tokens(row):,} tokens; "
                             f"block {block} ends at {t1:,}")
        for i in range(self.spec.num_layers):
            self.keys[i][row, :, t0:t1] = kv[2 * i]
            self.values[i][row, :, t0:t1] = kv[2 * i + 1]

    def _discard_from(self, row: int, t0: int, t1: int | None = None) -> None:
        """Return the pages of tokens [t0, t1) (t0, t1 block-aligned or the end) of every head."""
        t1 = self.seq_tokens if t1 is None else -(-t1 // self.block_tokens) * self.block_tokens
        token_bytes = self.spec.head_dim * self.dtype.itemsize
        head_bytes = self.seq_tokens * token_bytes
        if t0 == 0 and t1 == self.seq_tokens:
            # The whole row: its heads are adjacent in each region, so one call per region.
            # NOTE: each madvise is a TLB shootdown across ORT's threads (~16 us measured in
            # the engine, against ~6 us alone): a freed row made 180 calls on SmolLM2.
            row_bytes = self.spec.kv_heads * head_bytes
            for r in range(2 * self.spec.num_layers):
                self._map.madvise(mmap.MADV_DONTNEED,
                                  _GUARD_BYTES + r * self.region_bytes + row * row_bytes, row_bytes)
            return
        for r in range(2 * self.spec.num_layers):
            for h in range(self.spec.kv_heads):
                offset = (_GUARD_BYTES + r * self.region_bytes + (row * self.spec.kv_heads + h) * head_bytes
                          + t0 * token_bytes)
                self._map.madvise(mmap.MADV_DONTNEED, offset, (t1 - t0) * token_bytes)

    def close(self) -> None:
        """Drop the mapping (a numpy view still exported keeps it until the last one goes)."""
        self.table.clear()
        self.keys = self.values = []
        # Views still exported (BufferError): the mapping goes with the last of them.
        with contextlib.suppress(BufferError):
            self._map.close()

    # --- binding -------------------------------------------------------------

    def bind(self, binding: ort.IOBinding, start_row: int, stop_row: int) -> None:
        """Bind rows [start, stop) of every layer as past input and present output, by pointer
        (row_store.bind_rows): [0, n) for a batched decode, [r, r+1) for a batch-1 prompt
        chunk into row r."""
        bind_rows(binding, self.spec, self.keys, self.values, start_row, stop_row,
                  self.row_shape, self.dtype, lambda region, row: region[row].ctypes.data)
