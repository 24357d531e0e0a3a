"""The disk tier on the real engine (tiny model): a thousand parked sessions leave the KV
capacity untouched, and a turn after the disk round trip equals one that kept its KV."""

from __future__ import annotations

import pytest

from tests.unit.worker_service.engine.test_engine_sessions import fresh, turn
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.session_kv import SessionState


@pytest.fixture(scope="module")
def engine(tiny_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("sessions")
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2, prefill_chunk_tokens=64,
                             kv_capacity_bytes=4 * 2**20, session_swap_bytes=0,
                             session_dir=str(folder), session_disk_bytes=2**30)) as engine:
        yield engine


def test_a_thousand_sessions_on_disk_leave_the_kv_capacity_untouched(engine):
    capacity = engine.capacity_bytes
    for i in range(1_000):
        sid = f"many-{i}"
        engine.open_session(sid)
        turn(engine, sid, [1, 2, 3 + i % 50], max_new=1)
        freed, file_bytes = engine.session_turns.to_disk(sid)
        assert freed > 0 and file_bytes > 0
    table = engine.sessions
    assert engine.held_bytes() == 0 and engine.capacity_bytes == capacity
    assert table.disk_used_bytes == sum(d for _, d in table.tier_bytes().values())
    assert table.info("many-999").state is SessionState.ON_DISK
    for i in range(1_000):
        engine.close_session(f"many-{i}")
    assert table.disk_used_bytes == 0 and not list(table.disk.folder.glob("*.session"))


def test_a_turn_after_the_disk_round_trip_equals_a_fresh_run(engine):
    tok = engine.tokenizer
    p1 = tok.encode_chat([("user", "Name three rivers.")])
    engine.open_session("d1")
    t1 = turn(engine, "d1", p1)
    engine.session_turns.to_disk("d1")
    assert engine.session_info("d1").state is SessionState.ON_DISK and engine.held_bytes() == 0
    p2 = [*p1, *t1.token_ids, *tok.encode_chat([("user", "And three mountains.")])[1:]]
    t2 = turn(engine, "d1", p2)
    assert t2.reused_prompt_tokens == len(p1) + len(t1.token_ids) - 1
    assert list(t2.token_ids) == list(fresh(engine, p2).token_ids)
    assert engine.sessions.disk_used_bytes == 0  # read back: its file is gone
    engine.close_session("d1")
