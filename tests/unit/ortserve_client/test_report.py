"""The public notices of ortserve_client.report: the numbers a reader needs, on stderr."""

from __future__ import annotations

from ortserve_client import Admission, BudgetCap, GenerateResult, Timings, Usage, print_stats
from ortserve_client.report import cap_notice, stats_lines

CAP = BudgetCap(requested_max_new_tokens=8_170, admitted_max_new_tokens=120, requested_was_unset=True,
                requested_bytes=377_487_360, admitted_bytes=7_373_824, available_bytes=7_373_824,
                capacity_bytes=7_373_824, bytes_per_token=46_080, prompt_tokens=40,
                worker_id="worker-0", reason="the KV budget holds 160 tokens")


def result(cap: BudgetCap | None) -> GenerateResult:
    admission = Admission("CAPPED" if cap else "ADMITTED", "r1", "l1", "worker-0", "127.0.0.1:1",
                          40, 120, 7_373_824, False, cap)
    return GenerateResult(text="Paris", token_ids=(1, 2), finish_reason="LENGTH", stop_sequence="",
                          budget_cap=cap, usage=Usage(40, 120, 120),
                          timings=Timings(1.0, 2.0, 3.0, 4.0, 5.0, 6.0), admission=admission,
                          worker_id="worker-0", execution_provider="CPUExecutionProvider")


def test_the_cap_notice_names_both_ceilings_the_bytes_and_the_worker():
    text = cap_notice(CAP)
    assert "max_new_tokens 8,170 (unset: the remaining context window) -> 120" in text
    assert "46,080 B/token" in text and "worker-0" in text and CAP.reason in text


def test_stats_carry_a_budget_cap_line_only_when_capped():
    capped, plain = stats_lines(result(CAP)), stats_lines(result(None))
    assert "max_new_tokens=120 (capped from 8,170 by the KV budget)" in capped[0]
    assert capped[-1].startswith("stats: budget_cap requested=8,170 admitted=120")
    assert len(plain) == len(capped) - 1 and not any("budget_cap" in line for line in plain)


def test_print_stats_writes_to_stderr_only(capsys):
    print_stats(result(None))
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "ortserve: stats: finish_reason=LENGTH" in captured.err


def test_a_deadline_cap_and_the_time_budget_are_said_with_their_numbers():
    from ortserve_client.cli import time_line
    from ortserve_client.report import cap_notice
    from ortserve_client.types import BudgetCap

    from ortserve.v1 import scheduler_pb2, types_pb2

    cap = BudgetCap.from_pb(types_pb2.BudgetCap(
        requested_max_new_tokens=1_500, admitted_max_new_tokens=99, worker_id="w1",
        limit=types_pb2.CAP_LIMIT_DEADLINE, predicted_step_ms=23.4, deadline_ms=2_349.0,
        reason="why"))
    assert cap.limit == "deadline"
    line = cap_notice(cap)
    assert line.startswith("CAPPED by the deadline: max_new_tokens 1,500 -> 99")
    assert "23.4 ms" in line and "2.35 s left" in line and line.endswith("why")
    fresh = scheduler_pb2.WorkerBudget(worker_id="w1")
    assert "not measured yet" in time_line(fresh)
    busy = scheduler_pb2.WorkerBudget(worker_id="w1", time_measured=True, streams=3, step_ms=30,
                                      next_step_ms=40, itl_goal_ms=45, steps_measured=1_200)
    assert time_line(busy) == ("time: 3 streams, step 30.0 ms, with one more 40.0 ms, goal 45 ms "
                               "(1,200 steps measured); prompt pace not measured yet")
    busy.prompt_token_ms, busy.prompt_chunk_ms, busy.prefill_chunk_tokens = 0.042, 3.25, 512
    assert time_line(busy).endswith("; prompt 0.042 ms a token + 3.2 ms a chunk, at most 512 "
                                    "tokens a step")
