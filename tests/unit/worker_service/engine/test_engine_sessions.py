"""Engine sessions: K/V kept between turns, reused by token prefix, swapped out and back.

The reference for every turn is a fresh sequence over the whole conversation:
reuse must never change a token.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.models import prepared_model_dir
from worker_service.core.errors import CapacityExceeded, ContextWindowFull
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import TERMINAL, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.kv_pool import KVPool
from worker_service.runtime.session_kv import (
    HeldKV,
    SessionBusy,
    SessionNotFound,
    SessionState,
    SessionTable,
    common_prefix,
)

SAMPLED = SamplingConfig(temperature=1.0, seed=5)  # any logit difference shows in the tokens


@pytest.fixture(scope="module")
def engine(tiny_dir):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2, prefill_chunk_tokens=7,
                             kv_capacity_bytes=4 * 2**20, session_swap_bytes=2**20)) as engine:
        yield engine


def turn(engine: Engine, session_id: str, prompt, max_new: int = 12, lease: str = "t",
         sampling: SamplingConfig = SAMPLED):
    done = threading.Event()
    out = []

    def on_event(event):
        if isinstance(event, TERMINAL):
            out.append(event)
            done.set()

    engine.submit(SequenceRequest(lease, tuple(prompt), max_new, sampling=sampling), on_event,
                  session_id=session_id)
    assert done.wait(60)
    return out[0]


def fresh(engine: Engine, prompt, max_new: int = 12, sampling: SamplingConfig = SAMPLED):
    return engine.generate(SequenceRequest("fresh", tuple(prompt), max_new, sampling=sampling))


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([9], [1]) == 0


def test_turn_two_prefills_only_new_tokens_and_equals_a_fresh_run(engine):
    tok = engine.tokenizer
    p1 = tok.encode_chat([("user", "Name three rivers.")])
    engine.open_session("s1")
    t1 = turn(engine, "s1", p1)
    assert list(t1.token_ids) == list(fresh(engine, p1).token_ids)
    assert t1.reused_prompt_tokens == 0
    info = engine.session_info("s1")
    # The last sampled token was never run through the model: it is not held.
    assert info.state is SessionState.RESIDENT and info.held_tokens == len(p1) + 12 - 1
    assert info.charged_bytes == engine.kv.bytes_for(info.held_tokens) == engine.held_bytes()
    p2 = [*p1, *t1.token_ids, *tok.encode(" And three mountains?")]
    t2 = turn(engine, "s1", p2)
    assert t2.reused_prompt_tokens == info.held_tokens
    assert list(t2.token_ids) == list(fresh(engine, p2).token_ids)
    assert engine.close_session("s1") == engine.kv.bytes_for(len(p2) + 12 - 1)
    assert engine.held_bytes() == 0


def test_a_diverging_prompt_rewinds_to_the_common_prefix(engine):
    tok = engine.tokenizer
    p1 = tok.encode("The quick brown fox jumps over the lazy dog again and again")
    engine.open_session("rw")
    turn(engine, "rw", p1)
    p2 = [*p1[:5], *tok.encode(" cat sleeps all afternoon")]
    assert common_prefix(p1, p2) >= 5
    t2 = turn(engine, "rw", p2)
    assert t2.reused_prompt_tokens == common_prefix(p1, p2)
    assert list(t2.token_ids) == list(fresh(engine, p2).token_ids)
    # A prompt equal to what is held still computes its last token (its logits start the turn).
    held = engine.session_info("rw").held_tokens
    p3 = [*p2, *t2.token_ids][:held]
    t3 = turn(engine, "rw", p3)
    assert t3.reused_prompt_tokens == len(p3) - 1
    assert list(t3.token_ids) == list(fresh(engine, p3).token_ids)
    engine.close_session("rw")


def test_swap_out_frees_the_charge_and_swap_in_continues_identically(engine):
    tok = engine.tokenizer
    p1 = tok.encode_chat([("user", "Count to five.")])
    engine.open_session("sw")
    t1 = turn(engine, "sw", p1)
    held = engine.session_info("sw").held_tokens
    assert engine.swap_out_session("sw") == engine.kv.bytes_for(held)
    info = engine.session_info("sw")
    assert info.state is SessionState.SWAPPED and info.charged_bytes == 0
    assert info.swapped_bytes == held * engine.spec.bytes_per_token
    assert engine.held_bytes() == 0 and engine.sessions.swap_used_bytes == info.swapped_bytes
    assert engine.swap_out_session("sw") == 0  # already out: nothing more to free
    p2 = [*p1, *t1.token_ids, *tok.encode(" Now to ten.")]
    t2 = turn(engine, "sw", p2)
    assert t2.reused_prompt_tokens == held
    assert list(t2.token_ids) == list(fresh(engine, p2).token_ids)
    assert engine.sessions.swap_used_bytes == 0
    assert engine.session_info("sw").state is SessionState.RESIDENT
    engine.close_session("sw")
    assert engine.held_bytes() == 0


def test_swap_beyond_the_store_limit_drops_the_copy_and_the_next_turn_recomputes(tiny_dir):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2,
                             session_swap_bytes=0)) as engine:
        p1 = engine.tokenizer.encode("Recompute when the copy is gone")
        engine.open_session("d")
        t1 = turn(engine, "d", p1)
        assert engine.swap_out_session("d") > 0
        assert engine.session_info("d").state is SessionState.EMPTY
        assert engine.session_info("d").held_tokens == 0 and engine.held_bytes() == 0
        p2 = [*p1, *t1.token_ids, 7, 8, 9]
        t2 = turn(engine, "d", p2)
        assert t2.reused_prompt_tokens == 0
        assert list(t2.token_ids) == list(fresh(engine, p2).token_ids)


def test_turns_run_one_at_a_time_and_unknown_sessions_are_refused(engine):
    engine.open_session("busy")
    started = threading.Event()
    done = threading.Event()

    def on_event(event):
        started.set()
        if isinstance(event, TERMINAL):
            done.set()

    prompt = tuple(engine.tokenizer.encode("a long turn"))
    engine.submit(SequenceRequest("b1", prompt, 200), on_event, session_id="busy")
    with pytest.raises(SessionBusy, match="one at a time"):
        engine.submit(SequenceRequest("b2", prompt, 4), lambda e: None, session_id="busy")
    with pytest.raises(SessionBusy):
        engine.close_session("busy")
    with pytest.raises(SessionBusy):
        engine.swap_out_session("busy")
    assert done.wait(60)
    engine.close_session("busy")
    with pytest.raises(SessionNotFound):
        engine.submit(SequenceRequest("b3", prompt, 4), lambda e: None, session_id="busy")
    assert engine.held_bytes() == 0


def test_a_turn_that_does_not_fit_changes_nothing(engine):
    tok = engine.tokenizer
    engine.open_session("big")
    p1 = tok.encode("small first turn")
    turn(engine, "big", p1)
    before = engine.session_info("big")
    context = engine.spec.context_length
    with pytest.raises(ContextWindowFull, match="context window"):
        turn(engine, "big", [*p1, *([5] * context)])
    # Another sequence holds nearly everything: the turn's growth does not fit.
    other = engine.kv.allocate(engine.kv.block_tokens)
    engine.kv.resize(other, engine.kv.capacity_bytes // engine.spec.bytes_per_token
                     - before.held_tokens - engine.kv.block_tokens)
    try:
        with pytest.raises(CapacityExceeded):
            turn(engine, "big", [*p1, 5, 6], max_new=64)
    finally:
        engine.kv.free(other)
    assert engine.session_info("big") == before
    assert engine.held_bytes() == before.charged_bytes
    engine.close_session("big")


@pytest.mark.slow
def test_default_model_turn_two_equals_a_fresh_run():
    model = prepared_model_dir("smollm2-135m-instruct-fp32")
    with Engine(EngineConfig(model_dir=model, kv_capacity_bytes=256 * 2**20)) as engine:
        tok = engine.tokenizer
        greedy = SamplingConfig()
        p1 = tok.encode_chat([("user", "What is the capital of France?")])
        engine.open_session("m")
        t1 = turn(engine, "m", p1, max_new=24, sampling=greedy)
        p2 = tok.encode_chat([("user", "What is the capital of France?"),
                              ("assistant", t1.text), ("user", "And of Italy?")])
        t2 = turn(engine, "m", p2, max_new=24, sampling=greedy)
        assert t2.reused_prompt_tokens >= len(p1)
        assert list(t2.token_ids) == list(fresh(engine, p2, 24, greedy).token_ids)


class _Layout:
    block_tokens = 4

    def bytes_for(self, n: int) -> int:
        return -(-n // 4) * 4 * 8


def _held(n: int) -> HeldKV:
    # 1 layer, 1 head, head_dim 1, float32: 8 bytes/token for K and V together.
    return HeldKV(tuple(range(n)), [np.ones((1, n, 1), np.float32)], [np.ones((1, n, 1), np.float32)])


def test_a_rewound_turn_keeps_only_the_reused_prefix_in_memory():
    pool = KVPool(_Layout(), capacity_bytes=10_000)
    table = SessionTable(pool, swap_limit_bytes=0)
    table.open("s")
    first = table.begin_turn("s", tuple(range(100)), 110, "")
    table.end_turn("s", first.allocation, _held(100))
    assert pool.held_bytes() == _Layout().bytes_for(100)
    # The new prompt shares 10 tokens: the turn is charged for 10 + 5 + 3 tokens,
    # so the other 90 tokens' K/V must not stay alive behind a view.
    start = table.begin_turn("s", (*range(10), 77, 78, 79, 80, 81), 18, "")
    assert start.reused_tokens == 10
    arrays = [*start.resume.keys, *start.resume.values]
    assert all(a.base is None for a in arrays)
    assert sum(a.nbytes for a in arrays) == 10 * 8 <= start.allocation.nbytes
    table.end_turn("s", start.allocation, None)  # a failed turn: everything goes
    assert pool.held_bytes() == 0 and table.info("s").state is SessionState.EMPTY


def test_on_a_device_pool_parked_and_swapped_copies_count_against_the_host_budget():
    """CUDA rows are device memory: a session's copy between turns is host memory beside
    them, so it counts against the pool's host budget (and is dropped when that is full)."""
    from worker_service.runtime.kv_pool import HostBudget

    pool = KVPool(_Layout(), capacity_bytes=10_000, host=HostBudget(100 * 8),
                  parks_on_host=True)
    table = SessionTable(pool)
    table.open("a"), table.open("b")
    first = table.begin_turn("a", tuple(range(60)), 70, "")
    table.end_turn("a", first.allocation, _held(60))
    info = table.info("a")
    assert info.state is SessionState.RESIDENT and pool.host.used_bytes == 60 * 8
    assert pool.held_bytes() == _Layout().bytes_for(60)  # the next turn's room on the device
    second = table.begin_turn("b", tuple(range(50)), 60, "")
    table.end_turn("b", second.allocation, _held(50))  # 60 + 50 tokens > the host's 100
    assert table.info("b").state is SessionState.EMPTY and pool.held_bytes() == _Layout().bytes_for(60)
    assert table.swap_out("a") == _Layout().bytes_for(60)
    assert table.info("a").state is SessionState.SWAPPED and pool.host.used_bytes == 60 * 8
    again = table.begin_turn("a", tuple(range(65)), 75, "")  # swapped in: host bytes back
    assert again.reused_tokens == 60 and pool.host.used_bytes == 0
    table.end_turn("a", again.allocation, None)
    table.close("a")
    assert pool.held_bytes() == 0 and pool.host.used_bytes == 0


def test_on_the_cpu_only_swapped_copies_count_against_the_host_budget():
    from worker_service.runtime.kv_pool import HostBudget

    pool = KVPool(_Layout(), capacity_bytes=10_000, host=HostBudget(100 * 8))
    table = SessionTable(pool)
    table.open("a")
    first = table.begin_turn("a", tuple(range(60)), 70, "")
    table.end_turn("a", first.allocation, _held(60))
    assert pool.host.used_bytes == 0  # resident: the arena is host memory, charged there
    table.swap_out("a")
    assert pool.host.used_bytes == 60 * 8 and table.swap_used_bytes == 60 * 8
    table.close("a")
    assert pool.host.used_bytes == 0
