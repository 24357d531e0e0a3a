"""A sequence ended early: cancelled by its caller, stopped for a lease the ledger did not
take back, or failed by the engine closing; each frees its KV and sends one terminal event."""

from __future__ import annotations

import time

import pytest

from tests.unit.worker_service.event_recorder import Recorder
from worker_service.core.errors import EngineError, LeaseNotRestored
from worker_service.core.sequence import (
    Cancelled,
    Completed,
    Failed,
    SequenceRequest,
    TokenDelta,
)
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


def test_cancel_frees_the_buffer_within_a_step_and_sends_one_cancelled(engine, prompt):
    rec = Recorder()
    handle = engine.submit(SequenceRequest("cancel-me", prompt, 1800), rec)
    for _ in range(3):
        assert rec.tokens.acquire(timeout=5)
    assert engine.held_bytes() > 0
    handle.cancel()
    assert wait_for(lambda: engine.held_bytes() == 0 and rec.done.is_set(), 1.0)
    handle.cancel()  # idempotent
    time.sleep(0.05)
    [terminal] = rec.terminal()
    assert isinstance(terminal, Cancelled) and 3 <= terminal.generated_tokens < 1800
    assert isinstance(rec.events[0], TokenDelta) and rec.events[-1] is terminal
    assert engine.active_sequences() == 0


def test_held_bytes_by_key_names_each_live_sequence_and_stopping_one_fails_it(engine, prompt):
    """The worker's Info lists what each lease holds, and a lease the ledger did not take
    back stops its sequence (Failed with the worker's error, not Cancelled) and frees it."""
    running, other = Recorder(), Recorder()
    engine.submit(SequenceRequest("lease-a", prompt, 1800), running)
    engine.submit(SequenceRequest("lease-b", prompt, 40), other)
    assert running.tokens.acquire(timeout=5)
    held = engine.held_bytes_by_key()
    assert set(held) == {"lease-a", "lease-b"} or set(held) == {"lease-a"}  # b may be done
    assert held["lease-a"] == engine.kv.bytes_for(len(prompt) + 1800)
    error = LeaseNotRestored("lease-a", "worker-0")
    assert engine.stop_sequence("lease-a", error)
    assert wait_for(lambda: running.done.is_set(), 5.0)
    [terminal] = running.terminal()
    assert isinstance(terminal, Failed) and terminal.error is error
    assert other.done.wait(5) and isinstance(other.terminal()[0], Completed)
    assert wait_for(lambda: engine.held_bytes() == 0)
    assert engine.held_bytes_by_key() == {}
    assert not engine.stop_sequence("lease-a", error)  # ended: nothing to stop


def test_cancelling_a_finished_sequence_is_a_no_op(engine, prompt):
    rec = Recorder()
    handle = engine.submit(SequenceRequest("short", prompt, 3), rec)
    assert rec.done.wait(5)
    handle.cancel()
    time.sleep(0.05)
    assert [type(e) for e in rec.terminal()] == [Completed]


def test_close_fails_what_is_in_flight_and_refuses_more(tiny_dir, prompt):
    eng = Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2))
    rec = Recorder()
    eng.submit(SequenceRequest("long", prompt, 1800), rec)
    assert rec.tokens.acquire(timeout=5)
    eng.close()
    [terminal] = rec.terminal()
    assert isinstance(terminal, Failed) and "closed" in str(terminal.error)
    assert eng.held_bytes() == 0
    with pytest.raises(EngineError, match="closed"):
        eng.submit(SequenceRequest("late", prompt, 2), Recorder())
    eng.close()
