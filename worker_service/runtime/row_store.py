"""The row store: the running sequences as rows [0, n) of one KV tensor per layer and K/V.

Batched decode needs each layer's past/present as ONE tensor [rows, kv_heads,
seq_tokens, head_dim] whose rows are the running sequences (DESIGN.md,
"Batching"). Two memories hold such rows:

- the host arena (kv_arena.py): a commit-on-touch mapping; a row commits only
  the blocks its sequence writes;
- device rows (device_rows.py): OrtValues allocated on the device at start,
  bound by pointer at row offsets.

What they share is pure bookkeeping, kept here in `RowTable` (rows, their
charges, written and touched tokens, and the rule that the last row moves into
a freed one so rows stay [0, n)); what differs is only the memory: how a row
is bound, moved, copied out and in. `RowStore` is what the runners
(ort_rows.py, rows_runner.py) ask of either; `RowTableMixin` gives a
memory class the table's side of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from worker_service.core.errors import CapacityExceeded
from worker_service.runtime.model import ModelSpec


@dataclass
class RowEntry:
    """One live row: its sequence's charge and what has been written into it."""

    max_tokens: int  # the row's charge, in tokens (prompt + max_new_tokens)
    charged_bytes: int
    written_tokens: int = 0  # positions [0, written) hold the sequence's K/V
    # Positions a run wrote up to, scratch included (its pages are committed on the host).
    touched_tokens: int = 0


class RowTable:
    """Rows [0, n): charges, written and touched tokens. Pure: no memory, no ORT."""

    def __init__(self, max_rows: int, context_length: int, capacity_bytes: int,
                 bytes_for: Callable[[int], int], what: str = "a KV row") -> None:
        self.what = what  # how errors name a row ("a KV arena row")
        self.max_rows = max_rows
        self.context_length = context_length
        self.capacity_bytes = capacity_bytes
        self.bytes_for = bytes_for
        self._rows: list[RowEntry] = []

    def __len__(self) -> int:
        return len(self._rows)

    def entry(self, row: int) -> RowEntry:
        return self._rows[row]

    def charged_bytes(self) -> int:
        return sum(r.charged_bytes for r in self._rows)

    def touched_bytes(self) -> int:
        """Whole blocks of the positions each row has touched (the host arena's commit)."""
        return sum(self.bytes_for(r.touched_tokens) for r in self._rows)

    def written_bytes(self) -> int:
        """Whole blocks of the positions each row holds for its sequence."""
        return sum(self.bytes_for(r.written_tokens) for r in self._rows)

    def can_allocate(self, max_tokens: int, also: Sequence[int] = ()) -> bool:
        """Whether a row of `max_tokens` fits now, after rows for `also` (token counts of
        rows about to be allocated)."""
        return (len(self._rows) + len(also) < self.max_rows
                and 1 <= max_tokens <= self.context_length
                and self.charged_bytes() + sum(map(self.bytes_for, also))
                + self.bytes_for(max_tokens) <= self.capacity_bytes)

    def allocate(self, max_tokens: int) -> int:
        """A new row (the next index) for a sequence of up to max_tokens tokens."""
        if not 1 <= max_tokens <= self.context_length:
            raise ValueError(f"a row holds 1..{self.context_length} tokens (the model's "
                             f"context), got {max_tokens}")
        needed = self.bytes_for(max_tokens)
        held = self.charged_bytes()
        if held + needed > self.capacity_bytes:
            raise CapacityExceeded(needed, held, self.capacity_bytes,
                                   detail=f"{self.what} of {max_tokens:,} tokens")
        if len(self._rows) >= self.max_rows:
            raise CapacityExceeded(needed, held, self.capacity_bytes,
                                   detail=f"{self.what}, but all {self.max_rows} rows are in use "
                                          "(raise --max-batch-rows)")
        self._rows.append(RowEntry(max_tokens, needed))
        return len(self._rows) - 1

    def note_written(self, row: int, n_tokens: int, touched_tokens: int = 0) -> None:
        """Record that `row` now holds positions [0, n_tokens); touched_tokens: a run also
        wrote scratch up to that position."""
        entry = self._rows[row]
        touched = max(entry.touched_tokens, n_tokens, touched_tokens)
        if not 0 <= n_tokens <= touched <= entry.max_tokens:
            raise ValueError(f"row {row} is charged for {entry.max_tokens:,} tokens; "
                             f"it cannot hold {max(n_tokens, touched_tokens):,}")
        entry.written_tokens = n_tokens
        entry.touched_tokens = touched

    def remove(self, row: int) -> int | None:
        """Drop `row`'s entry; the last row's entry takes its place (the memory moved it
        first). Returns the index of the row that moved, or None."""
        if not 0 <= row < len(self._rows):
            raise IndexError(f"row {row} is not live (rows are [0, {len(self._rows)}))")
        last = len(self._rows) - 1
        if row == last:
            self._rows.pop()
            return None
        kept = self._rows.pop()
        kept.touched_tokens = kept.written_tokens  # scratch beyond was not moved
        self._rows[row] = kept
        return last

    def clear(self) -> None:
        self._rows.clear()


class RowStore(Protocol):
    """Rows of KV as the runners use them, in host or device memory."""

    spec: ModelSpec
    max_rows: int
    block_tokens: int  # the ledger's granularity (kv_math.bytes_for)
    seq_tokens: int  # each row's sequence axis
    device: str  # "cpu" | "cuda": where bind() points ORT
    table: RowTable

    @property
    def rows(self) -> int: ...
    def written_tokens(self, row: int) -> int: ...
    def max_tokens(self, row: int) -> int: ...
    def note_written(self, row: int, n_tokens: int, touched_tokens: int = 0) -> None: ...
    def bytes_for(self, n_tokens: int) -> int: ...
    def charged_bytes(self) -> int: ...
    def can_allocate(self, max_tokens: int, also: Sequence[int] = ()) -> bool: ...
    def allocate(self, max_tokens: int) -> int: ...

    def free(self, row: int) -> dict[int, int]:
        """Release `row`; the last row moves into the hole: {old: new} (maybe {})."""
        ...

    def bind(self, binding: ort.IOBinding, start_row: int, stop_row: int) -> None:
        """Bind rows [start, stop) of every layer as past input and present output."""
        ...

    def export_row(self, row: int) -> tuple[list[Any], list[Any]]:
        """The row's written K/V, per layer [kv_heads, n, head_dim], as host arrays; the row
        stays live holding 0 tokens."""
        ...

    def import_row(self, row: int, keys: list, values: list, n_tokens: int) -> None: ...

    def export_block(self, row: int, block: int) -> np.ndarray:
        """Block `block` of the row as [2 x layers, kv_heads, block_tokens, head_dim]."""
        ...

    def import_block(self, row: int, block: int, kv: np.ndarray) -> None: ...

    def device_names(self) -> set[str]:
        """Where the KV tensors live ("cpu", "cuda"), for checks."""
        ...

    def memory_bytes(self) -> int:
        """Bytes of memory the store holds now, as its memory counts them."""
        ...

    def close(self) -> None: ...


class RowTableMixin:
    """The table's side of a RowStore, for a memory class that sets `self.table`."""

    table: RowTable
    block_tokens: int

    @property
    def rows(self) -> int:
        """Live rows: they are exactly [0, rows)."""
        return len(self.table)

    @property
    def capacity_bytes(self) -> int:
        """What the rows' charges may add up to."""
        return self.table.capacity_bytes

    @capacity_bytes.setter
    def capacity_bytes(self, value: int) -> None:
        self.table.capacity_bytes = value

    def written_tokens(self, row: int) -> int:
        return self.table.entry(row).written_tokens

    def max_tokens(self, row: int) -> int:
        return self.table.entry(row).max_tokens

    def note_written(self, row: int, n_tokens: int, touched_tokens: int = 0) -> None:
        """Record that `row` now holds positions [0, n_tokens) (the runner calls it per run).

        touched_tokens: a run also wrote scratch up to that position (its pages are
        committed though the tokens are not the sequence's yet).
        """
        self.table.note_written(row, n_tokens, touched_tokens)

    def bytes_for(self, n_tokens: int) -> int:
        """Bytes a row of up to n_tokens is charged: whole blocks, the ledger's own formula."""
        return self.table.bytes_for(n_tokens)

    def charged_bytes(self) -> int:
        return self.table.charged_bytes()

    def can_allocate(self, max_tokens: int, also: Sequence[int] = ()) -> bool:
        return self.table.can_allocate(max_tokens, also)

    def allocate(self, max_tokens: int) -> int:
        """A new row (the next index) for a sequence of up to max_tokens tokens."""
        return self.table.allocate(max_tokens)


def bind_rows(binding: ort.IOBinding, spec: ModelSpec, keys: Sequence[Any], values: Sequence[Any],
              start_row: int, stop_row: int, row_shape: Sequence[int], dtype: Any,
              row_address: Callable[[Any, int], int], device: str = "cpu",
              device_id: int = 0) -> None:
    """Bind rows [start, stop) of every layer as past input and present output, by pointer.

    A contiguous slice of rows is a contiguous tensor, so ORT reads and writes the rows in
    place (past_present_share_buffer). The memories differ only in `row_address(region,
    row)`: where a row starts inside one layer's K or V.
    """
    shape = [stop_row - start_row, *row_shape]
    for i in range(spec.num_layers):
        for fmt_past, fmt_present, region in (
                (spec.past_key_name, spec.present_key_name, keys[i]),
                (spec.past_value_name, spec.present_value_name, values[i])):
            ptr = row_address(region, start_row)
            binding.bind_input(fmt_past.format(i=i), device, device_id, dtype, shape, ptr)
            binding.bind_output(fmt_present.format(i=i), device, device_id, dtype, shape, ptr)
