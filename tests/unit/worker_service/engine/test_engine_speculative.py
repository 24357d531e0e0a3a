"""Speculative decoding in the engine: greedy output token for token the speculation-off
output, on the real model folders, with the KV inside each sequence's reservation."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from ortserve.output.constraint_grammar import ConstraintSpec
from tests.models import prepared_model_dir
from worker_service.core import speculative
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine

PASSAGE = (
    "The committee met on Tuesday to review the budget for the new library. After a long "
    "discussion, the members agreed that the reading room would open in March, that the "
    "children's section would move to the ground floor, and that the archive would stay "
    "closed until the roof is repaired. The chair thanked the volunteers for their work.")
COPY = f"Repeat this passage exactly, word for word:\n\n{PASSAGE}"
PERSON = {"type": "object", "properties": {"summary": {"type": "string"}},
          "required": ["summary"], "additionalProperties": False}


def engines(model_dir, **config):
    return [Engine(EngineConfig(model_dir=model_dir, intra_op_threads=2, speculative=mode,
                                kv_capacity_bytes=64 * 2**20, **config))
            for mode in ("off", "ngram")]


@pytest.fixture(scope="module")
def tiny_pair(tiny_dir):
    pair = engines(tiny_dir)
    yield pair
    for engine in pair:
        engine.close()


def checked(engine: Engine, limits: list[str]):
    """Wrap the engine's step: after every step, what the arena holds is within what was
    charged, and no row was written past its sequence's prompt + max_new_tokens."""
    step = engine.step

    def checked_step():
        step()
        arena = engine.runtime.rows
        assert arena.kernel_committed_bytes() <= engine.held_bytes()
        assert arena.committed_bytes() <= arena.charged_bytes()
        for row, seq in enumerate(engine.runner._by_row):
            if arena.table.entry(row).touched_tokens > seq.req.max_tokens:
                limits.append(f"{seq.sequence_id}: {arena.table.entry(row).touched_tokens} > "
                              f"{seq.req.max_tokens}")

    engine.step = checked_step


def run_both(pair, prompt_ids, max_new, **fields) -> tuple[Completed, Completed]:
    off, on = (engine.generate(SequenceRequest(f"s-{engine.speculative}", tuple(prompt_ids),
                                               max_new, **fields), timeout_s=600)
               for engine in pair)
    assert on.token_ids == off.token_ids
    assert (on.text, on.finish_reason, on.stop_sequence) == (off.text, off.finish_reason,
                                                             off.stop_sequence)
    assert (off.speculative_mode, off.draft_proposed_tokens) == ("off", 0)
    assert on.speculative_mode == "ngram"
    return off, on


def test_tiny_greedy_equals_speculation_off_and_proposals_are_kept(tiny_pair):
    limits: list[str] = []
    checked(tiny_pair[1], limits)
    ids = tiny_pair[0].tokenizer.encode_chat([("user", COPY)])
    off, on = run_both(tiny_pair, ids, 40)
    assert on.draft_accepted_tokens > 0 and on.draft_proposed_tokens >= on.draft_accepted_tokens
    assert not limits


@pytest.mark.parametrize("max_new", [1, 2, 3, 7])
def test_a_small_ceiling_clamps_proposals_to_the_reservation(tiny_pair, max_new):
    limits: list[str] = []
    checked(tiny_pair[1], limits)
    ids = tiny_pair[0].tokenizer.encode_chat([("user", COPY)])
    off, on = run_both(tiny_pair, ids, max_new)
    assert on.generated_tokens == max_new
    assert not limits


def test_a_request_that_opts_out_runs_without_speculation(tiny_pair):
    ids = tiny_pair[0].tokenizer.encode_chat([("user", COPY)])
    done = tiny_pair[1].generate(SequenceRequest("opt-out", tuple(ids), 20, speculative=False))
    assert (done.speculative_mode, done.draft_proposed_tokens) == ("off", 0)


def test_rows_that_speculate_and_rows_that_do_not_share_steps(tiny_pair):
    """Several sequences at once, some opted out (they ride the shared run while the others
    verify beside it), each equal to its speculation-off output."""
    limits: list[str] = []
    off_engine, on_engine = tiny_pair
    checked(on_engine, limits)
    # Every proposal verified, whatever the measured costs say (the tiny model's shared
    # run costs about what a verification does, so the cost rule would decline them).
    costs = on_engine._costs
    on_engine._costs = VerifyAll()
    tok = on_engine.tokenizer
    prompts = [tok.encode_chat([("user", f"{COPY} ({i})")]) for i in range(4)]
    results: dict[str, Completed] = {}
    done = threading.Event()

    def on_event(event):
        if isinstance(event, TERMINAL):
            results[event.sequence_id] = event
            if len(results) == len(prompts):
                done.set()

    with on_engine._cond:  # the engine thread takes them together
        for i, ids in enumerate(prompts):
            on_engine.submit(SequenceRequest(f"m{i}", tuple(ids), 30 + i,
                                             speculative=i % 2 == 0), on_event)
    assert done.wait(600)
    on_engine._costs = costs
    for i, ids in enumerate(prompts):
        alone = off_engine.generate(SequenceRequest(f"o{i}", tuple(ids), 30 + i))
        assert results[f"m{i}"].token_ids == alone.token_ids, i
        assert (results[f"m{i}"].draft_proposed_tokens > 0) == (i % 2 == 0)
    assert on_engine.held_bytes() == 0
    assert not limits


class VerifyAll(speculative.VerifyCosts):
    """Costs that verify every proposal (the measurements are kept, never consulted)."""

    def chosen(self, rows, gains):
        return len(gains)


def test_a_greedy_penalty_and_min_new_tokens_are_applied_per_verified_position(tiny_pair):
    ids = tiny_pair[0].tokenizer.encode_chat([("user", COPY)])
    run_both(tiny_pair, ids, 24, min_new_tokens=10,
             sampling=SamplingConfig(repetition_penalty=1.3, frequency_penalty=0.5,
                                     logit_bias=((11, 2.0),)))


def test_logprobs_come_with_each_verified_token(tiny_pair):
    ids = tiny_pair[0].tokenizer.encode_chat([("user", COPY)])
    off, on = run_both(tiny_pair, ids, 16, top_logprobs=2)
    assert on.draft_accepted_tokens > 0


def test_sampled_rows_speculate_and_end_within_their_ceiling(tiny_pair):
    ids = tiny_pair[0].tokenizer.encode_chat([("user", COPY)])
    done = tiny_pair[1].generate(SequenceRequest(
        "sampled", tuple(ids), 30, sampling=SamplingConfig(temperature=0.7, top_p=0.9, seed=5)))
    assert done.generated_tokens == 30 and done.speculative_mode == "ngram"


def test_a_constrained_row_verifies_only_what_the_grammar_allows(tiny_pair):
    ids = tiny_pair[0].tokenizer.encode_chat([("user", COPY)])
    off, on = run_both(tiny_pair, ids, 40,
                       constraint=ConstraintSpec("regex", "(the library )+"))
    assert on.draft_accepted_tokens > 0


def test_speculation_is_off_where_verification_drifts_from_decode(tiny_dir):
    """The start-up probe: a verification run's logits against single-token runs'. The
    tiny model's drift is ~1e-7; a limit below it turns speculation off, with the reason."""
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2, speculative="ngram",
                             speculative_max_logit_drift=1e-12)) as engine:
        assert engine.speculative == "off" and 0 < engine.verify_drift < 1e-4
        assert "differ from single-token runs' by up to" in engine.speculative_note
        done = engine.generate(SequenceRequest("x", (1, 2, 3, 1, 2), 8))
        assert (done.speculative_mode, done.draft_proposed_tokens) == ("off", 0)
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2, speculative="ngram",
                             kv_layout="static")) as engine:
        assert engine.speculative == "off" and "static" in engine.speculative_note


@pytest.mark.slow
def test_int4_speculation_resolves_off_for_its_drift():
    """int4's MatMulNBits quantize activations: the attention path's last-bit differences
    become whole steps (~0.5 logits measured), so greedy tokens would change."""
    with Engine(EngineConfig(model_dir=prepared_model_dir("smollm2-135m-instruct-int4"),
                             intra_op_threads=2, speculative="ngram")) as engine:
        assert engine.speculative == "off" and engine.verify_drift > 0.01


@pytest.fixture(scope="module")
def smollm2():
    pair = engines(prepared_model_dir("smollm2-135m-instruct-fp32"))
    yield pair
    for engine in pair:
        engine.close()


@pytest.mark.slow
def test_smollm2_greedy_copy_equals_speculation_off(smollm2):
    limits: list[str] = []
    checked(smollm2[1], limits)
    ids = smollm2[0].tokenizer.encode_chat([("user", COPY)])
    off, on = run_both(smollm2, ids, 80)
    assert on.draft_accepted_tokens > 20
    assert not limits


@pytest.mark.slow
def test_smollm2_greedy_with_a_stop_string_equals_speculation_off(smollm2):
    ids = smollm2[0].tokenizer.encode_chat([("user", COPY)])
    off, on = run_both(smollm2, ids, 80, stop=("reading room",))
    assert off.stop_sequence == "reading room"


@pytest.mark.slow
def test_smollm2_greedy_json_schema_equals_speculation_off(smollm2):
    ids = smollm2[0].tokenizer.encode_chat([("user", f"Put this passage, verbatim, in the "
                                                     f"summary field of a JSON object:\n\n"
                                                     f"{PASSAGE}")])
    off, on = run_both(smollm2, ids, 90,
                       constraint=ConstraintSpec("json_schema", json.dumps(PERSON)))
    assert on.constraint_satisfied == off.constraint_satisfied


@pytest.mark.slow
def test_smollm2_a_sessions_later_turn_equals_speculation_off(smollm2):
    outputs = []
    for engine in smollm2:
        tok = engine.tokenizer
        engine.open_session("s")
        done = []
        for turn in range(2):
            history = [("user", COPY)]
            if turn:
                history += [("assistant", done[0].text), ("user", "Now repeat it once more.")]
            ids = tok.encode_chat(history)
            finished = threading.Event()
            box: list = []

            def on_event(event, box=box, finished=finished):
                if isinstance(event, TERMINAL):
                    box.append(event)
                    finished.set()

            engine.submit(SequenceRequest(f"t{turn}", tuple(ids), 60), on_event, session_id="s")
            assert finished.wait(600)
            done.append(box[0])
        engine.close_session("s")
        outputs.append(done)
    (off1, off2), (on1, on2) = outputs
    assert on1.token_ids == off1.token_ids and on2.token_ids == off2.token_ids
    assert on2.reused_prompt_tokens == off2.reused_prompt_tokens > 0
    assert on2.draft_accepted_tokens > 0


# Four tokens made the only candidates (logit_bias + top_k 4) and a prompt whose 2-grams
# propose one of them after each: the second token is always verified against a draft.
CANDIDATES = (262, 284, 290, 314)
PROMPT = (1000, 262, 284, 1000, 284, 290, 1000, 290, 314, 1000, 314, 262, 1000)
TRIALS = 600


def pair_counts(engine: Engine, seed: int) -> tuple[np.ndarray, int]:
    counts = np.zeros((4, 4))
    proposed = 0
    sampling = dict(temperature=1.0, top_k=4, logit_bias=tuple((t, 30.0) for t in CANDIDATES))
    for trial in range(TRIALS):
        done = engine.generate(SequenceRequest(
            f"d{trial}", PROMPT, 2, sampling=SamplingConfig(seed=seed * 10_007 + trial,
                                                            **sampling)))
        t1, t2 = done.token_ids
        counts[CANDIDATES.index(t1), CANDIDATES.index(t2)] += 1
        proposed += done.draft_proposed_tokens
    return counts, proposed


def two_sample_chi_square(a: np.ndarray, b: np.ndarray) -> float:
    both = a + b
    seen = both > 0
    expected_a = both * a.sum() / both.sum()
    expected_b = both * b.sum() / both.sum()
    return float((((a - expected_a) ** 2 / np.where(seen, expected_a, 1))[seen]).sum()
                 + (((b - expected_b) ** 2 / np.where(seen, expected_b, 1))[seen]).sum())


@pytest.fixture
def fresh_tiny_pair(tiny_dir):
    """Engines of this test's own: the module's pair carries the step checks other tests
    wrapped around it, one more per test, which 1,800 generations would pay for each."""
    pair = engines(tiny_dir)
    yield pair
    for engine in pair:
        engine.close()


def test_tiny_sampled_pairs_are_distributed_as_without_speculation(fresh_tiny_pair, monkeypatch):
    """Temperature 1 on the tiny model: the (first, second) token pairs with speculation
    and without come from one distribution (two-sample chi-square, 15 degrees of freedom:
    37.7 is its 0.999 quantile); with the rejection rule broken, they do not."""
    tiny_pair = fresh_tiny_pair
    # The acceptance rule is under test, not the cost rule: verify every proposal, whatever
    # the run times measured on a loaded machine say.
    monkeypatch.setattr(tiny_pair[1]._costs, "chosen", lambda rows, gains: len(gains))
    off, _ = pair_counts(tiny_pair[0], seed=1)
    on, proposed = pair_counts(tiny_pair[1], seed=2)
    assert proposed >= TRIALS  # the second token was verified against a draft every time
    assert two_sample_chi_square(off, on) < 37.7

    def broken(weights, draft_index, uniform, pick):  # the residual replaced by p
        if draft_index is not None and uniform() * weights.sum() < weights[draft_index]:
            return draft_index
        return pick(weights, uniform())

    monkeypatch.setattr(speculative, "accept_point_draft", broken)
    wrong, _ = pair_counts(tiny_pair[1], seed=3)
    assert two_sample_chi_square(off, wrong) > 37.7
