"""Prompt chunks held to the decoding streams' gap goal (core/prefill_budget.py), with fakes:
the budget function, the measured pace, and the step scheduler's plan with and without a
goal (no model, no clock: the costs are given)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.unit.worker_service.core.test_step_scheduler import FakeSeq, run_step
from worker_service.core.prefill_budget import (
    GOAL_SHARE,
    PrefillPace,
    prefill_budget_tokens,
    strictest_goal_ms,
)
from worker_service.core.step_scheduler import MIN_PREFILL_BUDGET_TOKENS, StepScheduler


@dataclass(eq=False)
class GoalSeq(FakeSeq):
    max_itl_ms: int = 0


def test_the_module_imports_no_onnxruntime_nor_grpc():
    probe = ("import sys, worker_service.core.prefill_budget; "
             "sys.exit('onnxruntime' in sys.modules or 'grpc' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe]).returncode == 0


def test_the_budget_is_what_the_goal_leaves_after_the_decode_step_at_the_token_cost():
    # 200 ms goal: 160 ms aimed at, 60 ms of it the decode, 100 ms at 0.5 ms a token.
    assert GOAL_SHARE == 0.8
    assert prefill_budget_tokens(200, 0.060, 0.0005, 512) == 200
    # A chunk's own run (20 ms) comes off first: 80 ms at 0.5 ms a token.
    assert prefill_budget_tokens(200, 0.060, 0.0005, 512, chunk_s=0.020) == 160
    # Room for more than the configured chunk: the chunk, never more.
    assert prefill_budget_tokens(200, 0.010, 0.0001, 512) == 512


def test_no_goal_or_no_measured_prompt_cost_keeps_the_configured_chunk():
    assert prefill_budget_tokens(0, 0.060, 0.0005, 512) == 512
    assert prefill_budget_tokens(200, 0.060, None, 512) == 512
    assert prefill_budget_tokens(200, None, 0.0005, 512) == 320  # decode unmeasured: 0


def test_a_decode_step_at_or_past_the_goal_leaves_the_floor_that_still_moves_a_prompt():
    assert prefill_budget_tokens(50, 0.045, 0.0005, 512) == MIN_PREFILL_BUDGET_TOKENS
    assert prefill_budget_tokens(50, 0.300, 0.0005, 512) == MIN_PREFILL_BUDGET_TOKENS
    assert prefill_budget_tokens(50, 0.035, 0.0005, 512) == 10  # 5 ms at 0.5 ms a token


def test_the_strictest_goal_is_the_smallest_set_one():
    assert strictest_goal_ms([0, 200, 80, 0]) == 80
    assert strictest_goal_ms([0, 0]) == 0
    assert strictest_goal_ms([]) == 0


def test_the_pace_splits_a_step_into_its_decode_and_its_chunks():
    pace = PrefillPace(weight=0.5)
    assert pace.decode_step_s(4) is None and pace.prompt_token_s is None and pace.chunk_s == 0
    pace.record(rows=4, chunks=1, prompt_tokens=100, seconds=0.5)  # no decode mean: unknown split
    assert pace.prompt_token_s is None
    pace.record(rows=4, chunks=0, prompt_tokens=0, seconds=0.040)
    pace.record(rows=4, chunks=1, prompt_tokens=100, seconds=0.140)
    assert pace.decode_step_s(4) == pytest.approx(0.040)
    # One size of chunk seen: its cost cannot be split yet, so all of it is per token.
    assert pace.prompt_token_s == pytest.approx(0.001) and pace.chunk_s == 0.0


def test_chunks_of_several_sizes_tell_a_chunks_own_cost_from_its_tokens():
    # A chunk costs 10 ms of its own plus 0.1 ms a token: a 3-token chunk is mostly its run.
    pace = PrefillPace()
    pace.record(rows=2, chunks=0, prompt_tokens=0, seconds=0.030)
    for tokens in (3, 500, 40, 3, 200, 3, 120) * 3:
        pace.record(rows=2, chunks=1, prompt_tokens=tokens, seconds=0.030 + 0.010 + 0.0001 * tokens)
    assert pace.chunk_s == pytest.approx(0.010) and pace.prompt_token_s == pytest.approx(0.0001)
    # 160 ms aimed at within 200: 30 decode, 10 the chunk's run, 120 ms / 0.1 ms: 1,200 -> 512.
    assert pace.budget_tokens(200, 2, 512) == 512
    assert pace.budget_tokens(60, 2, 512) == 80  # 48 - 30 - 10 = 8 ms: 80 tokens
    # Floor-sized chunks alone from now on: the split cannot be told, the last fit stands
    # (a per-token cost measured on them would read as 3.4 ms a token and keep them small).
    for _ in range(200):
        pace.record(rows=2, chunks=1, prompt_tokens=3, seconds=0.030 + 0.010 + 0.0003)
    assert pace.prompt_token_s == pytest.approx(0.0001, rel=0.05)
    assert pace.budget_tokens(60, 2, 512) == pytest.approx(80, abs=5)


def test_a_step_over_more_rows_than_measured_splits_against_the_fewer_rows_mean():
    pace = PrefillPace()
    pace.record(rows=4, chunks=0, prompt_tokens=0, seconds=0.040)
    pace.record(rows=6, chunks=1, prompt_tokens=100, seconds=0.240)  # 4 rows' mean stands in
    assert pace.prompt_token_s == pytest.approx(0.002)
    pace.record(rows=2, chunks=1, prompt_tokens=100, seconds=5.0)  # nothing at or below 2
    assert pace.prompt_token_s == pytest.approx(0.002)
    # A step faster than its decode mean (noise) counts as a free chunk, never a negative one.
    pace.record(rows=4, chunks=1, prompt_tokens=10, seconds=0.030)
    assert pace.prompt_token_s is not None and pace.prompt_token_s >= 0


def test_an_unmeasured_row_count_takes_the_nearest_scaled_up_never_down():
    pace = PrefillPace()
    pace.record(rows=2, chunks=0, prompt_tokens=0, seconds=0.020)
    assert pace.decode_step_s(8) == pytest.approx(0.080)  # proportional above
    assert pace.decode_step_s(1) == pytest.approx(0.020)  # the nearest's below
    assert pace.budget_tokens(0, 8, 512) == 512


def goal_budget(pace: PrefillPace, max_tokens: int):
    return lambda decodes: pace.budget_tokens(
        strictest_goal_ms(s.max_itl_ms for s in decodes), len(decodes), max_tokens)


def decoding(goals_ms: list[int]) -> list[GoalSeq]:
    """Sequences past their prompt, each with one pending token (a decode)."""
    return [GoalSeq(prompt_tokens=4, num_tokens=5, num_computed_tokens=4, max_itl_ms=g)
            for g in goals_ms]


def chunks_of_a_long_prompt(goals_ms: list[int], prompt_tokens: int = 1_000) -> list[int]:
    """The chunks a long prompt runs in while streams with these goals decode (a 2-row
    decode costs 40 ms here, a prompt token 0.5 ms)."""
    pace = PrefillPace()
    pace.record(rows=len(goals_ms), chunks=0, prompt_tokens=0, seconds=0.040)
    pace.record(rows=0, chunks=1, prompt_tokens=100, seconds=0.050)
    scheduler = StepScheduler(max_prefill_tokens=512, prefill_budget=goal_budget(pace, 512))
    scheduler.running.extend(decoding(goals_ms))
    long = GoalSeq(prompt_tokens=prompt_tokens)
    scheduler.add(long)
    chunks = []
    while long.in_prefill:
        plan = run_step(scheduler)
        assert len(plan.decodes) == len(goals_ms)  # every stream decodes every step
        chunks += [c.num_tokens for c in plan.prefills if c.seq is long]
        for seq in plan.decodes:  # keep them decoding: one pending token each step
            seq.num_tokens = seq.num_computed_tokens + 1
    return chunks


def test_with_a_goal_among_the_decodes_a_long_prompt_runs_in_chunks_within_it():
    # 200 ms: 160 aimed at, 40 the decode, 120 ms / 0.5 ms = 240 tokens a step.
    assert chunks_of_a_long_prompt([0, 200]) == [240, 240, 240, 240, 40]
    # The strictest goal binds: 100 ms leaves 40 ms, 80 tokens.
    assert chunks_of_a_long_prompt([100, 200])[:3] == [80, 80, 80]


def test_with_no_goal_among_the_decodes_the_chunks_are_todays():
    assert chunks_of_a_long_prompt([0, 0]) == [512, 488]
    # The same as a scheduler built without the budget at all.
    scheduler = StepScheduler(max_prefill_tokens=512)
    scheduler.running.extend(decoding([0, 0]))
    long = FakeSeq(prompt_tokens=1_000)
    scheduler.add(long)
    assert [c.num_tokens for c in run_step(scheduler).prefills] == [512]
    assert scheduler.budget_tokens == 512


def test_a_goal_the_decode_already_passes_still_moves_the_prompt_and_never_one_token_over_a_past():
    chunks = chunks_of_a_long_prompt([30, 30], prompt_tokens=20)
    # 3 tokens a step (the floor), the last cut leaving two, never a one-token run over a past.
    assert sum(chunks) == 20 and all(n >= 2 for n in chunks)
    assert max(chunks) == MIN_PREFILL_BUDGET_TOKENS


def test_a_step_with_no_decode_spends_the_configured_chunk():
    pace = PrefillPace()
    pace.record(rows=0, chunks=1, prompt_tokens=100, seconds=10.0)  # dear prompt tokens
    scheduler = StepScheduler(max_prefill_tokens=512, prefill_budget=goal_budget(pace, 512))
    long = GoalSeq(prompt_tokens=1_000, max_itl_ms=10)  # its own goal: no gap before its token
    scheduler.add(long)
    assert [c.num_tokens for c in run_step(scheduler).prefills] == [512]


def test_the_budget_leaves_room_for_the_decode_steps_tail_not_their_mean():
    # At 4 rows most decodes take 30 ms, one in five 90 ms (the machine's other work): a
    # budget held to the mean (~42 ms) would put every slow decode's step with a full chunk
    # beside it past the 200 ms goal; held to the p90 (90 ms) the slow steps stay within it.
    pace = PrefillPace()
    for _ in range(8):
        for seconds in (0.030, 0.030, 0.030, 0.030, 0.090):
            pace.record(rows=4, chunks=0, prompt_tokens=0, seconds=seconds)
    mean_s = pace.decode_step_s(4)
    assert mean_s is not None and mean_s < 0.060
    pace.record(rows=4, chunks=1, prompt_tokens=100, seconds=mean_s + 0.050)  # 0.5 ms a token
    assert pace.prompt_token_s == pytest.approx(0.0005)
    # 160 ms aimed at, 90 of it the decode's tail: 70 ms at 0.5 ms a token.
    assert pace.budget_tokens(200, 4, 512) == pytest.approx(140, abs=1)
    assert pace.decode_tail_s(4) == pytest.approx(0.090)
    # Above the measured rows the tail scales as the mean does (proportional).
    assert pace.decode_tail_s(8) == pytest.approx(0.180)


def test_the_decode_tail_is_over_a_recent_window_so_a_past_slow_spell_fades():
    pace = PrefillPace(window=16)
    for _ in range(16):
        pace.record(rows=2, chunks=0, prompt_tokens=0, seconds=0.120)
    assert pace.decode_tail_s(2) == pytest.approx(0.120)
    for _ in range(16):
        pace.record(rows=2, chunks=0, prompt_tokens=0, seconds=0.020)
    assert pace.decode_tail_s(2) == pytest.approx(0.020)
    with pytest.raises(ValueError, match="tail"):
        PrefillPace(tail=0)
    with pytest.raises(ValueError, match="window"):
        PrefillPace(window=0)
