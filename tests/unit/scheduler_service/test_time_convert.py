"""The time budget on the wire: heartbeat samples in (a bad one refused naming its field),
GetBudget's time fields out (scheduler_service/convert.py)."""

from __future__ import annotations

import pytest

from ortserve.status.errors import InvalidField
from ortserve.v1 import scheduler_pb2
from scheduler_service import convert
from scheduler_service.ledger.ledger import AdmissionRequest, Ledger, WorkerGeometry
from scheduler_service.ledger.step_model import StepSample
from scheduler_service.ledger.time_budget import TimeGoals
from scheduler_service.model_server_metrics import ledger_budget


def test_heartbeat_timings_become_samples_and_a_bad_one_names_its_field():
    ok = [scheduler_pb2.StepTiming(rows=2, steps=5, seconds=0.1, tail_seconds=0.03)]
    assert convert.step_samples(ok) == [StepSample(rows=2, steps=5, seconds=0.1,
                                                   tail_seconds=0.03)]
    bad = ok + [scheduler_pb2.StepTiming(rows=0, steps=1, seconds=0.1)]
    with pytest.raises(InvalidField) as info:
        convert.step_samples(bad)
    assert info.value.field == "step_timings[1]" and "rows >= 1" in info.value.message


def test_get_budget_shows_each_worker_s_time_beside_its_bytes():
    ledger = Ledger()
    ledger.time_goals = TimeGoals(max_itl_ms=250, max_ttft_ms=0)
    for worker_id in ("measured", "fresh"):
        ledger.register(WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model="m",
                                       context_length=1_024, bytes_per_token=8,
                                       capacity_bytes=1 << 20))
    ledger.heartbeat("measured", steps=[StepSample(rows=1, steps=4, seconds=0.08)])
    ledger.admit(AdmissionRequest("r", prompt_tokens=4, max_new_tokens=4, model="m",
                                  preferred_worker="measured"))
    budget = ledger_budget(ledger, None)
    assert budget.max_itl_ms == 250 and budget.max_ttft_ms == 0
    by_id = {w.worker_id: w for w in budget.workers}
    measured, fresh = by_id["measured"], by_id["fresh"]
    assert measured.time_measured and measured.steps_measured == 4
    assert measured.streams == 1 and measured.itl_goal_ms == 250
    assert measured.step_ms == pytest.approx(20.0) and measured.next_step_ms == pytest.approx(40.0)
    assert [(m.rows, round(m.seconds * 1e3, 3)) for m in measured.step_means] == [(1, 20.0)]
    assert not fresh.time_measured and fresh.next_step_ms == 0 and fresh.streams == 0


def test_get_budget_shows_the_prompt_pace_each_worker_last_reported():
    from scheduler_service.ledger.step_model import PromptPace

    ledger = Ledger()
    for worker_id in ("paced", "fresh"):
        ledger.register(WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model="m",
                                       context_length=1_024, bytes_per_token=8,
                                       capacity_bytes=1 << 20))
    ledger.heartbeat("paced", prefill=PromptPace(0.25, chunk_tokens=256, chunk_ms=4.5))
    by_id = {w.worker_id: w for w in ledger_budget(ledger, None).workers}
    paced, fresh = by_id["paced"], by_id["fresh"]
    assert (paced.prompt_token_ms, paced.prefill_chunk_tokens, paced.prompt_chunk_ms) == (
        0.25, 256, 4.5)
    assert (fresh.prompt_token_ms, fresh.prefill_chunk_tokens, fresh.prompt_chunk_ms) == (0, 0, 0)
    # Through the heartbeat's own fields: a worker that does not name its chunk reads as 512.
    ledger.heartbeat("fresh", prefill=convert.prefill_pace(scheduler_pb2.HeartbeatRequest(
        worker_id="fresh", prompt_token_ms=0.5, prompt_chunk_ms=1.0)))
    fresh = next(w for w in ledger_budget(ledger, None).workers if w.worker_id == "fresh")
    assert (fresh.prompt_token_ms, fresh.prefill_chunk_tokens, fresh.prompt_chunk_ms) == (
        0.5, 512, 1.0)

