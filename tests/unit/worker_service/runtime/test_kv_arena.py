"""The commit-on-touch KV arena: rounding, accounting, compaction, and the kernel's view."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from scheduler_service.ledger.ledger import WorkerGeometry
from worker_service.core.errors import CapacityExceeded
from worker_service.runtime.kv_arena import KVArena, block_tokens_for
from worker_service.runtime.model import ModelSpec


def make_spec(layers=2, kv_heads=2, head_dim=64, context_length=1000, dtype=np.float32) -> ModelSpec:
    return ModelSpec(
        name="synthetic", model_dir=Path("."), num_layers=layers, kv_heads=kv_heads,
        head_dim=head_dim, num_heads=2 * kv_heads, kv_dtype=np.dtype(dtype),
        context_length=context_length, eos_token_ids=(2,), vocab_size=16,
        past_key_name="past_key_values.{i}.key", past_value_name="past_key_values.{i}.value",
        present_key_name="present.{i}.key", present_value_name="present.{i}.value")


def write_tokens(arena: KVArena, row: int, t0: int, t1: int, value: float) -> None:
    """What GQA does in a run: write positions [t0, t1) of every layer and head of `row`."""
    for region in (*arena.keys, *arena.values):
        region[row, :, t0:t1] = value
    arena.note_written(row, t1)


def check_invariant(arena: KVArena) -> None:
    kernel = arena.kernel_committed_bytes()
    assert arena.committed_bytes() <= arena.charged_bytes()
    assert kernel <= arena.charged_bytes()
    assert kernel == arena.committed_bytes()  # the arena's page accounting is the kernel's


@pytest.mark.parametrize(("head_dim", "dtype", "block"), [
    (64, np.float32, 16), (16, np.float32, 64), (64, np.float16, 32),
    (96, np.float32, 32),  # 384 bytes does not divide a page: 3 pages hold 32 tokens
    (2048, np.float32, 1),  # a token of one head spans two pages
])
def test_block_tokens_fill_whole_pages(head_dim, dtype, block):
    itemsize = np.dtype(dtype).itemsize
    assert block_tokens_for(head_dim, itemsize, 4096) == block
    assert block * head_dim * itemsize % 4096 == 0


def test_bytes_for_is_the_ledgers_formula():
    arena = KVArena(make_spec(), max_rows=2, capacity_bytes=10**9)
    geometry = WorkerGeometry(worker_id="w", address="a", model="m", context_length=1000,
                              bytes_per_token=arena.spec.bytes_per_token, capacity_bytes=10**9,
                              block_tokens=arena.block_tokens)
    for n in (1, 15, 16, 17, 999, 1000):
        assert arena.bytes_for(n) == geometry.bytes_for(n)
    # The row's sequence axis is padded to whole blocks, so each head's region is page-aligned.
    assert arena.seq_tokens == 1008 and arena.seq_tokens % arena.block_tokens == 0


def test_reserving_address_space_commits_nothing():
    spec = make_spec(layers=30, kv_heads=3, context_length=8192)
    arena = KVArena(spec, max_rows=16, capacity_bytes=2**40)
    assert arena.mapped_bytes == 16 * 8192 * spec.bytes_per_token  # 5.6 GiB of address space
    row = arena.allocate(8192)
    assert arena.kernel_committed_bytes() == 0 == arena.committed_bytes()
    write_tokens(arena, row, 0, 1, 1.0)
    # One token commits one page per layer, K/V and head: one block's charge.
    assert arena.kernel_committed_bytes() == 2 * 30 * 3 * 4096 == arena.bytes_for(1)
    arena.free(row)
    assert arena.kernel_committed_bytes() == 0


def test_allocation_is_by_charge_and_by_rows():
    arena = KVArena(make_spec(), max_rows=3, capacity_bytes=0)
    arena.capacity_bytes = arena.bytes_for(100)
    assert arena.can_allocate(112) and not arena.can_allocate(113)  # 100 rounds to 112
    with pytest.raises(CapacityExceeded, match="KV arena row of 113 tokens"):
        arena.allocate(113)
    assert arena.allocate(50) == 0 and arena.allocate(30) == 1  # 64 + 32 tokens <= 112
    assert not arena.can_allocate(17)
    with pytest.raises(CapacityExceeded):
        arena.allocate(17)
    arena.capacity_bytes = 10**9
    arena.allocate(1)
    with pytest.raises(CapacityExceeded, match="all 3 rows are in use"):
        arena.allocate(1)
    with pytest.raises(ValueError, match="context"):
        arena.allocate(1001)
    with pytest.raises(ValueError, match="charged for 50"):
        arena.note_written(0, 51)


def test_free_moves_the_last_row_into_the_hole_and_returns_its_pages():
    arena = KVArena(make_spec(), max_rows=4, capacity_bytes=10**9)
    lengths = {0: 40, 1: 3, 2: 200, 3: 77}
    for row, n in lengths.items():
        assert arena.allocate(n + 10) == row
        write_tokens(arena, row, 0, n, float(row + 1))
    check_invariant(arena)
    assert arena.free(1) == {3: 1}  # row 3 (77 tokens) now lives in row 1
    check_invariant(arena)
    assert arena.rows == 3 and arena.written_tokens(1) == 77 and arena.max_tokens(1) == 87
    for region in (*arena.keys, *arena.values):
        assert np.all(region[1, :, :77] == 4.0)
        assert np.all(region[1, :, 77:] == 0.0)  # the hole's old tokens are gone
        assert np.all(region[3] == 0.0)  # the old last row was returned
    assert arena.free(2) == {}  # the last row: nothing moves
    assert arena.free(0) == {1: 0}
    assert arena.free(0) == {}
    assert arena.kernel_committed_bytes() == 0 == arena.charged_bytes()
    with pytest.raises(IndexError):
        arena.free(0)


def test_committed_stays_within_charges_even_during_a_move(monkeypatch):
    """A short freed row's charge bounds the chunks in which a long row is moved."""
    arena = KVArena(make_spec(), max_rows=3, capacity_bytes=10**9)
    long_tokens = 900
    for n in (1, 1, long_tokens):
        arena.allocate(n)
    write_tokens(arena, 0, 0, 1, 1.0)
    write_tokens(arena, 1, 0, 1, 2.0)
    write_tokens(arena, 2, 0, long_tokens, 3.0)
    seen: list[tuple[int, int]] = []
    discard = arena._discard_from

    def watched(row, t0, t1=None):
        seen.append((arena.kernel_committed_bytes(), arena.charged_bytes()))
        discard(row, t0, t1)

    monkeypatch.setattr(arena, "_discard_from", watched)
    assert arena.free(0) == {2: 0}
    assert len(seen) > long_tokens // 16  # moved block by block: the freed charge is one block
    assert all(kernel <= charged for kernel, charged in seen)
    check_invariant(arena)
    assert np.all(arena.keys[1][0, :, :long_tokens] == 3.0)


def test_random_joins_and_leaves_keep_the_invariant():
    rng = np.random.default_rng(7)
    arena = KVArena(make_spec(context_length=300), max_rows=6, capacity_bytes=0)
    arena.capacity_bytes = arena.bytes_for(300) * 3  # charges, not rows, bind first at times
    contents: list[float] = []  # per live row: the value its tokens hold
    for step in range(120):
        if arena.rows and rng.random() < 0.3:
            row = int(rng.integers(arena.rows))
            moved = arena.free(row)
            last = contents.pop()
            if moved:
                contents[row] = last
        else:
            n = int(rng.integers(1, 301))
            if arena.can_allocate(n):
                row = arena.allocate(n)
                contents.append(float(step + 1))
        for row in range(arena.rows):  # every row grows a little, as decode does
            t0 = arena.written_tokens(row)
            t1 = min(arena.max_tokens(row), t0 + int(rng.integers(0, 40)))
            write_tokens(arena, row, t0, t1, contents[row])
        check_invariant(arena)
        for row in range(arena.rows):
            n = arena.written_tokens(row)
            assert np.all(arena.values[1][row, :, :n] == contents[row])


class RecordingBinding:
    """Records what KVArena.bind binds (an ort.IOBinding needs a session)."""

    def __init__(self) -> None:
        self.inputs: dict[str, tuple] = {}
        self.outputs: dict[str, tuple] = {}

    def bind_input(self, name, device, device_id, dtype, shape, ptr) -> None:
        self.inputs[name] = (device, dtype, list(shape), ptr)

    def bind_output(self, name, device, device_id, dtype, shape, ptr) -> None:
        self.outputs[name] = (device, dtype, list(shape), ptr)


def test_bind_binds_the_arena_rows_in_place_as_past_and_present():
    arena = KVArena(make_spec(), max_rows=4, capacity_bytes=10**9)
    for _ in range(3):
        arena.allocate(10)
    decode = RecordingBinding()
    arena.bind(decode, 0, 3)
    assert len(decode.inputs) == len(decode.outputs) == 2 * arena.spec.num_layers
    past = decode.inputs["past_key_values.0.key"]
    assert past == ("cpu", arena.dtype, [3, 2, arena.seq_tokens, 64], arena.keys[0].ctypes.data)
    assert decode.outputs["present.0.key"] == past  # the same memory, read and written in place
    chunk = RecordingBinding()  # a batch-1 prompt chunk into row 2
    arena.bind(chunk, 2, 3)
    row_value = chunk.inputs["past_key_values.0.value"]
    assert row_value[2:] == ([1, 2, arena.seq_tokens, 64], arena.values[0][2].ctypes.data)
    assert chunk.outputs["present.0.value"] == row_value
