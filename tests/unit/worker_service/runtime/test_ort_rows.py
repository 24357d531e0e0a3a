"""Batched decode over the KV arena gives the tokens (and logits) of decoding each sequence alone."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from tests.models import prepared_model_dir
from worker_service.runtime.kv_arena import KVArena
from worker_service.runtime.model import ModelSpec, load_model_spec
from worker_service.runtime.ort_rows import OrtRows

CHUNK_TOKENS = 7  # small, so prompts run in several batch-1 chunks


@dataclass
class Plan:
    prompt: list[int]
    new_tokens: int
    join_step: int = 0
    cancel_step: int | None = None  # leaves at this step, before its new_tokens
    forced: list[int] | None = None  # inputs to feed instead of the greedy choice


@dataclass
class Live:
    index: int
    past: int
    next_id: int
    out: list[int] = field(default_factory=list)


def session_for(spec: ModelSpec) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(spec.model_file), options, providers=["CPUExecutionProvider"])


def drive(session, spec, plans, max_rows, check_memory=True, make_store=None):
    """A minimal engine step loop, as the engine's step would run.

    Each step: a joining sequence takes the next row; every prefilling row runs one
    batch-1 prompt chunk; then ONE decode run over all rows [0, n), the rows still
    prefilling riding along inactive; finished and cancelled rows leave.

    Returns per plan (tokens, logits per token) and checks, at every step, that the
    committed KV (kernel and arena) is within the charges. `make_store(spec, max_rows)`: a
    row store of another memory (device rows), checked by what its rows hold instead.
    """
    arena = (KVArena(spec, max_rows=max_rows, capacity_bytes=2**40) if make_store is None
             else make_store(spec, max_rows))
    runner = OrtRows(session, spec, arena, max_chunk_tokens=CHUNK_TOKENS)
    tokens: dict[int, list[int]] = {i: [] for i in range(len(plans))}
    logits: dict[int, list[np.ndarray]] = {i: [] for i in range(len(plans))}
    live: list[Live] = []  # index = arena row
    pending = sorted(range(len(plans)), key=lambda i: plans[i].join_step)
    step = 0
    moves = []  # (old row, new row) of rows compaction moved
    decoding_beside_a_prefill = 0  # most rows decoding in a step while another prefilled

    def accept(state: Live, row_logits: np.ndarray) -> None:
        plan = plans[state.index]
        logits[state.index].append(row_logits.copy())
        token = int(np.argmax(row_logits))
        tokens[state.index].append(token)
        k = len(tokens[state.index])
        state.next_id = plan.forced[k - 1] if plan.forced else token

    def leave(row: int) -> None:
        moved = arena.free(row)
        last = live.pop()
        if moved:
            live[moved[len(live)]] = last
            moves.extend(moved.items())
        runner.invalidate()

    while pending or live:
        while pending and plans[pending[0]].join_step <= step:
            i = pending.pop(0)
            plan = plans[i]
            row = arena.allocate(len(plan.prompt) + plan.new_tokens)
            assert row == len(live)
            live.append(Live(i, 0, -1))
        for row, state in enumerate(live):
            prompt = plans[state.index].prompt
            if state.past < len(prompt):  # one chunk per step, so decoding never stalls long
                chunk = prompt[state.past:state.past + CHUNK_TOKENS]
                chunk_logits = runner.prefill(row, state.past, chunk)
                state.past += len(chunk)
                if state.past == len(prompt):
                    accept(state, chunk_logits)
        if live:
            active = [s.past >= len(plans[s.index].prompt) for s in live]
            batch = runner.decode(len(live), [s.past for s in live],
                                  [s.next_id if a else 0 for s, a in zip(live, active, strict=True)],
                                  active)
            if not all(active):
                decoding_beside_a_prefill = max(decoding_beside_a_prefill, sum(active))
            for b, state in enumerate(live):
                if active[b]:
                    state.past += 1
                    accept(state, batch[b])
        if check_memory and make_store is not None:
            assert arena.held_bytes() <= arena.charged_bytes() <= arena.memory_bytes()
        elif check_memory:
            kernel = arena.kernel_committed_bytes()
            assert arena.committed_bytes() <= arena.charged_bytes()
            assert kernel <= arena.charged_bytes(), f"step {step}: kernel {kernel:,} > charges"
            assert kernel == arena.committed_bytes()  # the arena's accounting is the kernel's
        for row in reversed(range(len(live))):
            plan = plans[live[row].index]
            if len(tokens[live[row].index]) >= plan.new_tokens or plan.cancel_step == step:
                leave(row)
        step += 1
    assert arena.rows == 0 and (make_store is not None or arena.kernel_committed_bytes() == 0)
    largest = runner.largest_batch
    arena.close()
    return tokens, logits, (largest, len(moves), decoding_beside_a_prefill)


def alone(session, spec, plan):
    """The same plan decoded by itself (batch 1 throughout), joining at once."""
    solo = Plan(plan.prompt, plan.new_tokens, 0, None, plan.forced)
    tokens, logits, _ = drive(session, spec, [solo], max_rows=1, check_memory=False)
    return tokens[0], logits[0]


def growing_cache(session, spec, prompt, new_tokens):
    """The textbook loop without IOBinding: every present fed back as the next past."""
    names = [o.name for o in session.get_outputs()]
    empty = np.zeros((1, spec.kv_heads, 0, spec.head_dim), dtype=spec.kv_dtype)
    past = {fmt.format(i=i): empty for i in range(spec.num_layers)
            for fmt in (spec.past_key_name, spec.past_value_name)}
    out, step_ids, total = [], list(prompt), 0
    for _ in range(new_tokens):
        total += len(step_ids)
        feeds = {"input_ids": np.array([step_ids], dtype=np.int64),
                 "attention_mask": np.ones((1, total), dtype=np.int64), **past}
        result = dict(zip(names, session.run(None, feeds), strict=True))
        for i in range(spec.num_layers):
            for p, q in ((spec.past_key_name, spec.present_key_name),
                         (spec.past_value_name, spec.present_value_name)):
                past[p.format(i=i)] = result[q.format(i=i)]
        out.append(int(np.argmax(result["logits"][0, -1])))
        step_ids = [out[-1]]
    return out


def mixed_plans(rng, vocab, forced: bool, new_tokens=12) -> list[Plan]:
    """Five sequences of mixed prompt lengths; they join and leave mid-batch, one is cancelled."""
    # (prompt tokens, join step, cancel step); the 40-token prompt is prefilled in
    # six chunks, one a step, while four others decode.
    shapes = [(3, 0, None), (19, 0, None), (1, 2, None), (30, 4, 9), (11, 5, None),
              (40, 6, None)]
    plans = []
    for n, join, cancel in shapes:
        total = new_tokens + (join % 3)  # different lengths: they leave at different steps
        plans.append(Plan(rng.integers(0, vocab, n).tolist(), total, join, cancel,
                          rng.integers(0, vocab, total).tolist() if forced else None))
    return plans


@pytest.fixture(scope="module")
def tiny():
    spec = load_model_spec(prepared_model_dir("tiny-llama"))
    return spec, session_for(spec)


def test_batched_logits_equal_batch_1_with_joins_leaves_and_a_cancel(tiny):
    # The tiny random model's greedy output repeats one token, so feed given inputs
    # (teacher forcing) and compare every logit row: a far stronger check than tokens.
    spec, session = tiny
    plans = mixed_plans(np.random.default_rng(1), spec.vocab_size, forced=True)
    tokens, logits, (largest, moves, beside) = drive(session, spec, plans, max_rows=6)
    assert largest >= 5 and moves >= 1  # rows moved by compaction go on below
    assert beside >= 4  # a long prompt went in chunks while four others decoded
    for i, plan in enumerate(plans):
        solo_tokens, solo_logits = alone(session, spec, plan)
        if plan.cancel_step is None:
            assert len(tokens[i]) == plan.new_tokens
        # A cancelled sequence's tokens are a prefix of its solo run; others are unchanged.
        assert tokens[i] == solo_tokens[:len(tokens[i])]
        for step, (got, want) in enumerate(zip(logits[i], solo_logits, strict=False)):
            np.testing.assert_allclose(got, want, atol=1e-4, err_msg=f"seq {i} token {step}")


def test_greedy_tokens_equal_a_growing_cache_loop(tiny):
    spec, session = tiny
    plans = mixed_plans(np.random.default_rng(2), spec.vocab_size, forced=False, new_tokens=6)
    tokens, _, _ = drive(session, spec, plans, max_rows=6)
    for i, plan in enumerate(plans):
        want = growing_cache(session, spec, plan.prompt, plan.new_tokens)
        assert tokens[i] == want[:len(tokens[i])]


def test_runner_refuses_runs_beyond_a_rows_charge_or_with_a_wrong_past(tiny):
    spec, session = tiny
    arena = KVArena(spec, max_rows=2, capacity_bytes=2**30)
    runner = OrtRows(session, spec, arena, max_chunk_tokens=8)
    row = arena.allocate(4)
    with pytest.raises(ValueError, match="charged for 4"):
        runner.prefill(row, 0, [5] * 5)
    runner.prefill(row, 0, [5] * 3)
    with pytest.raises(ValueError, match="holds 3 tokens"):
        runner.decode(1, [2], [7])
    runner.decode(1, [3], [7])
    with pytest.raises(ValueError, match="charged for 4"):
        runner.decode(1, [4], [7])
    with pytest.raises(ValueError, match="1 live rows"):
        runner.decode(2, [4, 0], [7, 7])


@pytest.mark.slow
def test_default_fp32_model_batched_greedy_equals_alone():
    spec = load_model_spec(prepared_model_dir("smollm2-135m-instruct-fp32"))
    session = session_for(spec)
    tok = Tokenizer.from_file(str(spec.model_dir / "tokenizer.json"))
    texts = ["What is the capital of France? Answer in one sentence. " * 3,
             "Write a haiku about the sea.",
             "List three prime numbers.",
             "Explain what a hash table is, briefly, to a child who likes trains.",
             "Hi"]
    plans = [Plan(tok.encode(t).ids, 10 + i % 3, join, cancel)
             for i, (t, join, cancel) in enumerate(zip(texts, [0, 0, 2, 4, 6],
                                                       [None, None, None, 5, None], strict=True))]
    tokens, logits, (largest, moves, beside) = drive(session, spec, plans, max_rows=6)
    assert largest >= 4 and moves >= 1  # rows moved by compaction go on below
    assert beside >= 3  # the long prompt went in chunks while others decoded
    for i, plan in enumerate(plans):
        solo_tokens, solo_logits = alone(session, spec, plan)
        assert tokens[i] == solo_tokens[:len(tokens[i])], f"sequence {i}"
        diff = max((float(np.abs(a - b).max()) for a, b in zip(logits[i], solo_logits, strict=False)),
                   default=0.0)  # one is cancelled mid-prefill, before any token
        assert diff < 1e-3, f"sequence {i}: max logit difference {diff}"
    assert tokens[0] == growing_cache(session, spec, plans[0].prompt, plans[0].new_tokens)
