"""Batched first chunks: several waiting prompts prefill in one run (right-padded), and the
greedy tokens are those of each prompt run alone; joins and leaves mid-prefill included, and
the arena's pages stay within the charges after every step."""

from __future__ import annotations

import threading

import pytest

from tests.models import prepared_model_dir
from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest
from worker_service.core.step_scheduler import first_chunk_groups
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine

# --- the grouping policy (pure) --------------------------------------------------


def test_similar_first_chunks_share_one_run_longest_first():
    assert first_chunk_groups([10, 12, 11], [99, 99, 99], 512) == [[1, 2, 0]]


def test_a_long_chunk_does_not_drag_short_ones_to_its_width():
    # 100 + 3 x 10 real tokens padded to 4 x 100: far over 1.5x the real ones.
    assert first_chunk_groups([10, 100, 10, 10], [999] * 4, 512) == [[1], [0, 2, 3]]


def test_a_group_stays_within_the_padded_token_bound():
    groups = first_chunk_groups([40] * 8, [99] * 8, 128)
    assert [len(g) for g in groups] == [3, 3, 2]


def test_padding_never_writes_past_a_rows_reservation():
    # Row 1 reserves 12 tokens: padding it to 20 would touch pages it was not charged for.
    assert first_chunk_groups([20, 8, 18], [40, 12, 40], 512) == [[0, 2], [1]]


# --- the engine ------------------------------------------------------------------

def _prompts(n: int, base: int) -> list[tuple[int, ...]]:
    return [tuple((i * 7 + j * 13) % 400 + 5 for i in range(base + 3 * j)) for j in range(n)]


def _alone(model_dir, prompts, new_tokens) -> list[tuple[int, ...]]:
    """Each prompt run alone (one sequence in the engine at a time): the reference."""
    with Engine(EngineConfig(model_dir=model_dir, intra_op_threads=2, prefill_chunk_tokens=64,
                             kv_capacity_bytes=64 * 2**20, prefix_cache_bytes=0)) as eng:
        return [eng.generate(SequenceRequest(f"a{i}", p, new_tokens, min_new_tokens=new_tokens),
                             300).token_ids for i, p in enumerate(prompts)]


def _batched(model_dir, waves, new_tokens, cancel_at_step=None):
    """Submit wave 0 at once (held under the engine's lock so one step sees them all), each
    later wave from the step hook after that many steps (joins while wave 0 prefills);
    optionally cancel the longest prompt of wave 0 mid-prefill. Checks the physical KV
    after every step; returns {sequence id: tokens or None (cancelled)} and figures."""
    eng = Engine(EngineConfig(model_dir=model_dir, intra_op_threads=2, prefill_chunk_tokens=64,
                              kv_capacity_bytes=64 * 2**20, prefix_cache_bytes=0))
    results: dict[str, tuple[int, ...] | None] = {}
    done = threading.Event()
    total = sum(len(w) for w in waves)
    handles = {}
    runs = {"first_batches": 0, "largest_first_batch": 0, "steps": 0, "cancelled_mid_prefill": 0}
    physical = []

    def on_event(event) -> None:
        if isinstance(event, TERMINAL):
            results[event.sequence_id] = (tuple(event.token_ids) if isinstance(event, Completed)
                                          else None)
            if len(results) == total:
                done.set()

    def submit(wave: int) -> None:
        for i, p in enumerate(waves[wave]):
            sid = f"w{wave}-{i}"
            handles[sid] = eng.submit(SequenceRequest(sid, p, new_tokens, min_new_tokens=new_tokens),
                                      on_event)

    batch = eng.runner.batch
    prefill_first = batch.prefill_first

    def counted_prefill_first(start_row, chunks, **kwargs):
        runs["first_batches"] += 1
        runs["largest_first_batch"] = max(runs["largest_first_batch"], len(chunks))
        return prefill_first(start_row, chunks, **kwargs)

    batch.prefill_first = counted_prefill_first
    step = eng.step

    def checked_step():
        step()  # the engine thread: nothing frees between the step and the reads below
        runs["steps"] += 1
        arena = eng.runtime.rows
        physical.append((arena.kernel_committed_bytes(), arena.committed_bytes(), eng.held_bytes()))
        if runs["steps"] in range(1, len(waves)):
            submit(runs["steps"])
        if cancel_at_step is not None and runs["steps"] == cancel_at_step:
            longest = max(range(len(waves[0])), key=lambda i: len(waves[0][i]))
            victim = eng._live.get(f"w0-{longest}")
            if victim is not None and victim.in_prefill:
                runs["cancelled_mid_prefill"] += 1
                handles[f"w0-{longest}"].cancel()

    eng.step = checked_step
    try:
        with eng._cond:  # the engine thread takes them together
            submit(0)
        assert done.wait(600), f"only {len(results)} of {total} sequences ended"
        assert eng.held_bytes() == 0 and eng.runtime.rows.kernel_committed_bytes() == 0
    finally:
        eng.close()
    assert physical and all(kernel <= held and counted <= held for kernel, counted, held in physical)
    return results, runs


@pytest.mark.parametrize("model", ["tiny-llama", "smollm2-135m-instruct-fp32"])
def test_batched_first_chunks_give_the_tokens_of_each_prompt_alone(model):
    model_dir = prepared_model_dir(model)
    new_tokens = 6
    # Wave 0: five prompts of 10-22 tokens (one chunk each, batched); wave 1 joins after one
    # step with two prompts longer than a chunk (64), so they prefill over several steps
    # beside wave 0's decode; wave 2 joins while wave 1 is still mid-prefill.
    waves = [_prompts(5, 10), _prompts(2, 90), _prompts(3, 9)]
    want = _alone(model_dir, [p for w in waves for p in w], new_tokens)
    got, runs = _batched(model_dir, waves, new_tokens)
    ids = [f"w{w}-{i}" for w, wave in enumerate(waves) for i in range(len(wave))]
    assert [got[sid] for sid in ids] == want
    assert runs["largest_first_batch"] >= 3  # wave 0 really ran batched


def test_a_leave_mid_prefill_leaves_the_others_tokens_unchanged(tiny_dir):
    new_tokens = 5
    # Wave 0's longest prompt (150 tokens) takes three steps of 64-token chunks: cancelled
    # after the first, while the others decode and wave 1 joins.
    waves = [[*_prompts(3, 8), tuple((i * 11) % 300 + 5 for i in range(150))], _prompts(3, 12)]
    want = _alone(tiny_dir, [p for w in waves for p in w], new_tokens)
    got, runs = _batched(tiny_dir, waves, new_tokens, cancel_at_step=1)
    assert runs["cancelled_mid_prefill"] == 1 and got["w0-3"] is None
    ids = [f"w{w}-{i}" for w, wave in enumerate(waves) for i in range(len(wave))]
    for sid, tokens in zip(ids, want, strict=True):
        if sid != "w0-3":
            assert got[sid] == tokens, sid
    assert runs["first_batches"] >= 2
