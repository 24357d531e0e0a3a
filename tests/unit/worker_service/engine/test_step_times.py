"""The engine's decoding steps by rows, summed until a heartbeat drains them (the scheduler's
time budget: docs/features/time-budget.md)."""

from __future__ import annotations

import asyncio

import pytest

from ortserve.v1 import scheduler_pb2
from worker_service.core.sequence import SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.engine.step_times import StepTimes
from worker_service.scheduler_link import SchedulerLink


@pytest.fixture(scope="module")
def tiny_engine(tiny_dir):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as engine:
        yield engine


def test_steps_are_summed_by_rows_and_a_drain_empties_them():
    times = StepTimes()
    times.record(2, 0.010)
    times.record(1, 0.004)
    times.record(2, 0.030)
    times.record(0, 0.5)  # a prompt-only step: no stream waited on it for a token
    # A step with prompt chunks beside its decodes: held to the goal by the chunks' budget,
    # so admission reads the decode step alone.
    times.record(2, 0.9, prompt_tokens=512)
    assert times.drain() == [(1, 1, 0.004), (2, 2, pytest.approx(0.040))]
    assert times.drain() == []


def test_the_engine_records_its_decoding_steps(tiny_engine):
    tiny_engine.step_times.drain()
    tiny_engine.generate(SequenceRequest("timed", (1, 2, 3), 8))
    drained = tiny_engine.step_times.drain()
    assert [rows for rows, _, _ in drained] == [1]
    (_, steps, seconds), = drained
    assert steps >= 7 and seconds > 0  # 8 tokens: the first from the prompt's step


def test_the_heartbeat_carries_the_drained_steps():
    sent: list[scheduler_pb2.HeartbeatRequest] = []

    class Stub:
        async def Heartbeat(self, request, timeout):
            sent.append(request)
            return scheduler_pb2.HeartbeatResponse(known=True)

    async def run():
        link = SchedulerLink("127.0.0.1:1", scheduler_pb2.RegisterWorkerRequest(worker_id="w"),
                             lambda: [])
        link._stub = Stub()
        link.step_timings = lambda: [(3, 10, 0.25)]
        link.decode_tail_s = lambda rows: 0.04 if rows == 3 else 0.0
        await link._heartbeat([])
        await link._channel.close()

    asyncio.run(run())
    (timing,) = sent[0].step_timings
    assert (timing.rows, timing.steps, timing.seconds) == (3, 10, 0.25)
    assert timing.tail_seconds == pytest.approx(0.04)  # the chunks' margin at those rows
