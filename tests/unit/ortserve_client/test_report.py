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
