"""Decode in padded buckets with fixed buffers (runtime/decode_step.py) gives the unpadded
batch's logits and tokens bit for bit on the CPU, and the device's greedy ids are the host
argmax of those logits."""

from __future__ import annotations

import numpy as np
import pytest

from tests.models import prepared_model_dir
from tests.unit.worker_service.runtime.test_last_logits import gathered_session
from worker_service.runtime.decode_step import (
    DecodeShapes,
    StepStats,
    bucket_for,
    bucket_ladder,
)
from worker_service.runtime.device_rows import DeviceRows
from worker_service.runtime.kv_arena import KVArena
from worker_service.runtime.model import load_model_spec
from worker_service.runtime.ort_rows import OrtRows

PROMPTS = ([5, 17, 300, 42, 9], [7, 8], [1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 11])


@pytest.fixture(scope="module", params=["next_ids in the graph", "host argmax"])
def tiny(request):
    """The graph with its greedy choice (CUDA's edit, run here on the CPU) and without (the
    CPU's: the runner argmaxes the host logits)."""
    spec = load_model_spec(prepared_model_dir("tiny-llama"))
    return spec, gathered_session(spec, next_ids=request.param == "next_ids in the graph")


def test_the_ladder_pads_to_powers_of_two_and_the_arena_never_pads():
    assert bucket_ladder(128, pads=True) == (1, 2, 4, 8, 16, 32, 64, 128)
    assert bucket_ladder(48, pads=True) == (1, 2, 4, 8, 16, 32, 48)
    assert bucket_ladder(5, pads=False) == (1, 2, 3, 4, 5)
    assert [bucket_for(n, bucket_ladder(48, True)) for n in (1, 3, 5, 17, 33, 48)] == [
        1, 4, 8, 32, 48, 48]
    with pytest.raises(ValueError, match="exceed the largest bucket"):
        bucket_for(49, bucket_ladder(48, True))


def test_shapes_follow_the_store(tiny):
    spec, _ = tiny
    arena = KVArena(spec, max_rows=6, capacity_bytes=2**30)
    # The arena commits on touch: a padded row would hold pages nobody is charged for.
    assert DecodeShapes.for_store(arena) == DecodeShapes((1, 2, 3, 4, 5, 6), False, False)
    rows = DeviceRows(spec, 6, "cpu")
    try:
        # CPU device rows (the dry run): the CUDA shapes, nothing captured.
        assert DecodeShapes.for_store(rows, capture=True) == DecodeShapes((1, 2, 4, 6), True,
                                                                          False)
    finally:
        rows.close()


def _decode_three(spec, session, shapes: DecodeShapes | None, steps: int,
                  mask_counts: bool | None = None):
    """Three prompts of different lengths prefilled into rows 0..2 of CPU device rows, then
    `steps` greedy decode steps (the device's ids fed back); the logits and ids of each."""
    store = DeviceRows(spec, 8, "cpu")
    runner = OrtRows(session, spec, store, max_chunk_tokens=16, shapes=shapes,
                         mask_counts=mask_counts)
    assert runner.warm_graphs() == ([] if shapes is None or not shapes.capture
                                    else list(shapes.ladder))
    past, ids = [], []
    for prompt in PROMPTS:
        row = store.allocate(64)
        logits = runner.prefill(row, 0, prompt)
        past.append(len(prompt))
        ids.append(int(np.argmax(logits[0])))
    logits_by_step, ids_by_step = [], []
    for _ in range(steps):
        decoded = runner.decode_rows(3, past, ids)
        logits_by_step.append(decoded.logits().copy())
        ids_by_step.append(decoded.next_ids.tolist())
        ids = decoded.next_ids.tolist()
        past = [p + 1 for p in past]
    held = [store.written_tokens(r) for r in range(store.rows)]
    stats = runner.step_stats
    store.close()
    return logits_by_step, ids_by_step, held, stats


def test_a_padded_bucket_gives_the_unpadded_batchs_tokens_bit_for_bit(tiny):
    spec, session = tiny
    # Three rows in a bucket of 4 (row 3 is a free row run as padding), at the row's whole
    # width, against three rows exactly at the step's own width.
    padded = _decode_three(spec, session, DecodeShapes((1, 2, 4, 8), True, False), steps=6)
    exact = _decode_three(spec, session, DecodeShapes(tuple(range(1, 9)), False, False),
                          steps=6)
    for got, want in zip(padded[0], exact[0], strict=True):
        assert np.array_equal(got, want)  # bit for bit, not within a tolerance
    assert padded[1] == exact[1]
    # The device's choice is the host's first maximum of the same logits.
    assert padded[1] == [np.argmax(step, axis=1).tolist() for step in padded[0]]
    # The padding is charged to nobody: three live rows, each holding its own tokens.
    assert padded[2] == exact[2] == [len(p) + 6 for p in PROMPTS]
    stats: StepStats = padded[3]
    assert stats.padded_rows == 6 and exact[3].padded_rows == 0
    assert stats.uncaptured_by_reason == {"no capture on this device": 6}


def test_the_capture_path_runs_on_the_cpu_and_gives_the_same_tokens(tiny):
    """The CUDA plumbing (warm-up runs per bucket under its graph id, captured runs counted)
    forced on CPU device rows, where the CPU provider ignores the graph option: the code a
    GPU takes runs, and its tokens are the plain path's."""
    spec, session = tiny
    captured = _decode_three(spec, session, DecodeShapes((1, 2, 4, 8), True, True), steps=3)
    exact = _decode_three(spec, session, DecodeShapes(tuple(range(1, 9)), False, False),
                          steps=3)
    assert captured[1] == exact[1]
    assert all(np.array_equal(g, w) for g, w in zip(captured[0], exact[0], strict=True))
    stats: StepStats = captured[3]
    assert stats.captured_steps == 3 and stats.uncaptured_steps == 0


def test_capture_refuses_a_store_with_rows_and_names_why(tiny):
    spec, session = tiny
    store = DeviceRows(spec, 4, "cpu")
    try:
        runner = OrtRows(session, spec, store, max_chunk_tokens=16,
                             shapes=DecodeShapes((1, 2, 4), True, True))
        store.allocate(8)
        with pytest.raises(RuntimeError, match="before any sequence has a row"):
            runner.warm_graphs()
    finally:
        store.close()


def test_warm_up_makes_every_buckets_buffers_and_measures_the_capture_with_the_probe(tiny):
    """The CUDA measurement path on CPU device rows with a fake free-memory probe: the
    buffers of every bucket exist before the first step (their bytes known at start) and the
    capture's cost is the drop in free memory read before and after it."""
    spec, session = tiny
    store = DeviceRows(spec, 8, "cpu")
    try:
        runner = OrtRows(session, spec, store, max_chunk_tokens=16,
                             shapes=DecodeShapes((1, 2, 4, 8), True, True))
        readings = iter([10_000_000, 9_250_000])  # free bytes before, after
        asked = []

        def free_bytes() -> int:
            asked.append(len(asked))
            return next(readings)
        assert runner.warm_graphs(free_bytes) == [1, 2, 4, 8]
        stats = runner.step_stats
        assert len(asked) == 2 and stats.capture_bytes == 750_000
        expected = sum(runner.buckets.buffers(b, False).nbytes for b in (1, 2, 4, 8))
        assert stats.graph_bytes == expected > 8 * spec.vocab_size * 4
        assert runner.buckets.charged_bytes == expected + 750_000
    finally:
        store.close()


def test_uncaptured_device_rows_still_make_their_buffers_at_start_and_the_arena_none(tiny):
    spec, session = tiny
    store = DeviceRows(spec, 4, "cpu")
    try:
        runner = OrtRows(session, spec, store, max_chunk_tokens=16)
        assert runner.warm_graphs(lambda: 1 / 0) == []  # no capture: the probe is not asked
        assert runner.step_stats.graph_bytes > 0 and runner.step_stats.capture_bytes == 0
    finally:
        store.close()
    arena = KVArena(spec, max_rows=4, capacity_bytes=2**30)
    runner = OrtRows(session, spec, arena, max_chunk_tokens=16)
    assert runner.warm_graphs() == [] and runner.buckets.charged_bytes == 0


def test_counts_in_the_masks_first_column_give_the_rows_of_ones_tokens_bit_for_bit(tiny):
    """The builder graph reads the mask only as row sums and its width (mask_counts.py):
    each row's length as a count in column 0 gives the same logits as right-padded rows of
    ones, bit for bit, and the step writes one int64 per row."""
    spec, session = tiny
    shapes = DecodeShapes((1, 2, 4, 8), True, False)
    counted = _decode_three(spec, session, shapes, steps=6, mask_counts=True)
    ones = _decode_three(spec, session, shapes, steps=6, mask_counts=False)
    for got, want in zip(counted[0], ones[0], strict=True):
        assert np.array_equal(got, want)
    assert counted[1] == ones[1] and counted[2] == ones[2]
    # By default the runner reads the graph and counts (tiny-llama is a builder graph).
    store = DeviceRows(spec, 4, "cpu")
    try:
        runner = OrtRows(session, spec, store, max_chunk_tokens=16)
        assert runner.buckets.mask_counts
        runner.warm_graphs()
        row = store.allocate(32)
        runner.prefill(row, 0, PROMPTS[0])
        runner.decode_rows(1, [len(PROMPTS[0])], [7])
        mask = runner.buckets.buffers(1, False).mask.host
        assert mask[0, 0] == len(PROMPTS[0]) + 1 and not mask[0, 1:].any()
    finally:
        store.close()
