"""The step scheduler alone: factories instead of a model (no onnxruntime import)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from worker_service.core.step_scheduler import StepScheduler, prompt_chunk_tokens


@dataclass(eq=False)
class FakeSeq:
    """What the scheduler reads of a sequence, and what a step would do to it."""

    prompt_tokens: int
    num_tokens: int = 0
    num_computed_tokens: int = 0

    def __post_init__(self) -> None:
        self.num_tokens = self.num_tokens or self.prompt_tokens

    @property
    def num_pending_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < self.prompt_tokens


def run_step(scheduler: StepScheduler):
    """Schedule, then apply the plan as the engine would (every finished prompt samples)."""
    plan = scheduler.schedule()
    for seq in plan.decodes:
        seq.num_computed_tokens += 1
        seq.num_tokens += 1
    for chunk in plan.prefills:
        chunk.seq.num_computed_tokens += chunk.num_tokens
        if not chunk.seq.in_prefill:
            chunk.seq.num_tokens += 1  # the first generated token
    return plan


def test_the_step_scheduler_imports_no_onnxruntime():
    probe = ("import sys, worker_service.core.step_scheduler; "
             "sys.exit('onnxruntime' in sys.modules or 'grpc' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe]).returncode == 0


def test_every_decoding_sequence_runs_in_one_batch():
    scheduler = StepScheduler(max_prefill_tokens=512)
    seqs = [FakeSeq(prompt_tokens=10 + i) for i in range(8)]
    for seq in seqs:
        scheduler.add(seq)
    first = run_step(scheduler)
    assert [c.num_tokens for c in first.prefills] == [10 + i for i in range(8)]
    assert first.decodes == ()
    second = run_step(scheduler)
    assert set(second.decodes) == set(seqs) and second.prefills == ()


def test_a_long_prompt_takes_at_most_one_chunk_a_step_while_others_decode():
    scheduler = StepScheduler(max_prefill_tokens=16)
    decoders = [FakeSeq(prompt_tokens=4) for _ in range(4)]
    for seq in decoders:
        scheduler.add(seq)
    run_step(scheduler)
    long = FakeSeq(prompt_tokens=100)
    scheduler.add(long)
    chunks = []
    while long.in_prefill:
        plan = run_step(scheduler)
        assert set(plan.decodes) == set(decoders)  # never stalled
        assert sum(c.num_tokens for c in plan.prefills) <= 16
        chunks += [c.num_tokens for c in plan.prefills if c.seq is long]
    assert chunks == [16] * 6 + [4]


def test_waiting_sequences_join_in_arrival_order_and_a_blocked_head_is_not_overtaken():
    startable = {"ok": False}
    big, small = FakeSeq(prompt_tokens=8), FakeSeq(prompt_tokens=2)
    scheduler = StepScheduler(max_prefill_tokens=64,
                              can_start=lambda seq, starting: seq is not big or startable["ok"])
    scheduler.add(big)
    scheduler.add(small)
    assert run_step(scheduler).empty  # the head cannot start: nobody passes it
    startable["ok"] = True
    plan = run_step(scheduler)
    assert [c.seq for c in plan.prefills] == [big, small]


def test_can_start_counts_the_sequences_starting_in_the_same_step():
    """Rows are taken when the step runs: three free rows start three of five, not five."""
    rows_free = 3
    seqs = [FakeSeq(prompt_tokens=2) for _ in range(5)]
    scheduler = StepScheduler(max_prefill_tokens=64,
                              can_start=lambda seq, starting: len(starting) < rows_free)
    for seq in seqs:
        scheduler.add(seq)
    plan = run_step(scheduler)
    assert [c.seq for c in plan.prefills] == seqs[:3]
    assert list(scheduler.waiting) == seqs[3:]


def test_remove_takes_a_sequence_out_wherever_it_is():
    scheduler = StepScheduler(max_prefill_tokens=4)
    running, waiting = FakeSeq(prompt_tokens=2), FakeSeq(prompt_tokens=9)
    scheduler.add(running)
    run_step(scheduler)
    scheduler.add(waiting)
    scheduler.remove(running)
    scheduler.remove(waiting)
    scheduler.remove(waiting)  # idempotent
    assert not scheduler.has_work and run_step(scheduler).empty


def test_max_batch_bounds_the_decode_run():
    scheduler = StepScheduler(max_prefill_tokens=64, max_batch=3)
    for _ in range(5):
        scheduler.add(FakeSeq(prompt_tokens=1))
    run_step(scheduler)
    assert len(run_step(scheduler).decodes) == 3


def test_a_budget_below_three_tokens_is_refused():
    for budget in (0, 2):
        with pytest.raises(ValueError, match="max_prefill_tokens must be >= 3"):
            StepScheduler(max_prefill_tokens=budget)


def test_no_prompt_run_over_a_past_is_one_token():
    """A cut that would leave one token leaves two; a budget that fits one token over a
    past waits (one-token runs over a past compute other floats than longer runs)."""
    scheduler = StepScheduler(max_prefill_tokens=16)
    long = FakeSeq(prompt_tokens=33)
    scheduler.add(long)
    chunks = []
    while long.in_prefill:
        chunks += [c.num_tokens for c in run_step(scheduler).prefills]
    assert chunks == [16, 15, 2]
    assert prompt_chunk_tokens(FakeSeq(prompt_tokens=9, num_computed_tokens=5), 1) == 0
    assert prompt_chunk_tokens(FakeSeq(prompt_tokens=9, num_computed_tokens=5), 3) == 2
    assert prompt_chunk_tokens(FakeSeq(prompt_tokens=9), 1) == 1  # no past: a first prompt
    assert prompt_chunk_tokens(FakeSeq(prompt_tokens=2), 1) == 0  # it would leave one
    # A session turn that reuses all but one token: nothing better exists, it runs.
    assert prompt_chunk_tokens(FakeSeq(prompt_tokens=9, num_computed_tokens=8), 16) == 1


def test_a_waiting_sequence_the_rest_of_the_budget_would_cut_badly_waits_its_turn():
    scheduler = StepScheduler(max_prefill_tokens=16)
    first, hit = FakeSeq(prompt_tokens=15), FakeSeq(prompt_tokens=40, num_computed_tokens=32)
    behind = FakeSeq(prompt_tokens=1)
    for seq in (first, hit, behind):
        scheduler.add(seq)
    plan = run_step(scheduler)  # one token of budget left: the hit would run one over a past
    assert [(c.seq, c.num_tokens) for c in plan.prefills] == [(first, 15)]
    assert list(scheduler.waiting) == [hit, behind]  # FIFO: nobody passes it
    plan = run_step(scheduler)
    assert [(c.seq, c.num_tokens) for c in plan.prefills] == [(hit, 8), (behind, 1)]
