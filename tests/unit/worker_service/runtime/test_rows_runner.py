"""The runners hand back what a step changed and leave the sequences as they were."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from worker_service.core.sequence import Sequence, SequenceRequest
from worker_service.core.step_scheduler import PrefillChunk, StepPlan
from worker_service.core.tokenizer import Tokenizer
from worker_service.runtime.kv_arena import KVArena
from worker_service.runtime.kv_pool import KVPool, StaticSharedKV
from worker_service.runtime.model import load_model_spec
from worker_service.runtime.rows_runner import RowsRunner
from worker_service.runtime.runner import Runner
from worker_service.runtime.static_model_runner import StaticModelRunner

PROMPT = tuple(range(3, 15))


@pytest.fixture(scope="module")
def parts(tiny_dir):
    spec = load_model_spec(tiny_dir)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(spec.model_file), options,
                                   providers=["CPUExecutionProvider"])
    return spec, session, Tokenizer(tiny_dir)


def sequence(spec, tokenizer, name: str, prompt=PROMPT) -> Sequence:
    return Sequence(SequenceRequest(name, prompt, 4), lambda event: None, tokenizer,
                    spec.vocab_size, spec.eos_token_ids)


def state(seq: Sequence) -> tuple:
    return (seq.num_computed_tokens, list(seq.token_ids), seq.resume, seq.kv, seq.done)


def test_the_static_runner_reports_the_tokens_it_wrote_and_changes_no_sequence(parts):
    spec, session, tokenizer = parts
    pool = KVPool(StaticSharedKV(spec), 2**24)
    runner: Runner = StaticModelRunner(session, spec, pool)
    seq = sequence(spec, tokenizer, "s")
    seq.charged(pool.allocate(seq.req.max_tokens))
    before = state(seq)
    out = runner.run(StepPlan(prefills=(PrefillChunk(seq, 5),)))
    assert state(seq) == before
    step = out.steps["s"]
    assert (step.computed_tokens, step.logits, step.error) == (5, None, None)  # more prompt to go
    seq.computed(step.computed_tokens)
    out = runner.run(StepPlan(prefills=(PrefillChunk(seq, len(PROMPT) - 5),)))
    assert out.steps["s"].logits.shape == (spec.vocab_size,)
    runner.forget(seq)
    pool.free(seq.kv)


def test_the_batched_runner_restores_a_session_prefix_without_touching_the_sequence(parts):
    spec, session, tokenizer = parts
    arena = KVArena(spec, max_rows=2, capacity_bytes=2**24)
    pool = KVPool(arena, 2**24)
    runner: Runner = RowsRunner(session, spec, arena, max_chunk_tokens=64)
    try:
        # A first turn computes the prompt; parking it hands back its K/V.
        first = sequence(spec, tokenizer, "t1")
        first.charged(pool.allocate(first.req.max_tokens))
        out = runner.run(StepPlan(prefills=(PrefillChunk(first, len(PROMPT)),)))
        assert out.steps["t1"].computed_tokens == len(PROMPT)
        assert not out.steps["t1"].prefix_restored
        first.computed(out.steps["t1"].computed_tokens)
        held = runner.park(first)
        assert held is not None and held.tokens == PROMPT
        assert runner.park(first) is None  # no row any more
        pool.free(first.kv)

        # The next turn reuses that prefix: its row takes the K/V; the sequence keeps
        # its copy until the engine applies the step output.
        prompt = (*PROMPT, 20, 21, 22)
        second = sequence(spec, tokenizer, "t2", prompt)
        second.continue_session("sess", pool.allocate(len(prompt) + 4), len(PROMPT), held)
        before = state(second)
        out = runner.run(StepPlan(prefills=(PrefillChunk(second, 3),)))
        assert state(second) == before and second.resume is held
        step = out.steps["t2"]
        assert step.prefix_restored and step.error is None
        assert step.computed_tokens == 3 and step.logits.shape == (spec.vocab_size,)
        second.prefix_restored()
        assert second.resume is None and second.take_unused_prefix() is None

        # The restored prefix gives the logits of computing everything in one row.
        fresh = sequence(spec, tokenizer, "t3", prompt)
        fresh.charged(pool.allocate(len(prompt) + 4))
        runner.forget(second)
        reference = runner.run(StepPlan(prefills=(PrefillChunk(fresh, len(prompt)),)))
        np.testing.assert_allclose(reference.steps["t3"].logits, step.logits, atol=1e-4)
        runner.forget(fresh)
    finally:
        arena.close()


def test_a_prefilling_row_advances_only_in_its_own_chunks(parts):
    """In a step whose budget went elsewhere, a prompt in the middle of its prefill rides the
    batched decode without computing a token: its prompt never runs one token at a time
    over a past (those floats differ from its chunks')."""
    spec, session, tokenizer = parts
    arena = KVArena(spec, max_rows=2, capacity_bytes=2**24)
    pool = KVPool(arena, 2**24)
    runner: Runner = RowsRunner(session, spec, arena, max_chunk_tokens=64)
    try:
        decoding, prefilling = sequence(spec, tokenizer, "d", (3, 4)), sequence(spec, tokenizer, "p")
        for seq in (decoding, prefilling):
            seq.charged(pool.allocate(seq.req.max_tokens))
        out = runner.run(StepPlan(prefills=(PrefillChunk(decoding, 2), PrefillChunk(prefilling, 5))))
        decoding.computed(2)
        decoding.token_ids.append(7)  # its first sampled token
        prefilling.computed(out.steps["p"].computed_tokens)
        out = runner.run(StepPlan(decodes=(decoding,)))
        assert out.steps["d"].computed_tokens == 1 and out.steps["d"].logits is not None
        assert "p" not in out.steps  # nothing computed, nothing to apply
        assert arena.written_tokens(1) == 5
        # Alone and mid-prompt with no chunk this step: no run at all.
        runner.forget(decoding)
        runs = runner.batch.runs
        assert runner.run(StepPlan()).steps == {} and runner.batch.runs == runs
    finally:
        arena.close()
