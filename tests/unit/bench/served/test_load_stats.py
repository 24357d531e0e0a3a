"""Goodput counts only the requests that met the goal; every outcome is counted and said."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench.served.load_stats import Goal, RequestRecord, percentile, summarize


def record(i, ttft_s=0.1, gaps_s=(0.05,) * 4, outcome="done", wanted=5, tokens=5, **kw):
    r = RequestRecord(i, 10, wanted, t_send=100.0, outcome=outcome, tokens=tokens, **kw)
    if outcome in ("done", "capped"):
        t = 100.0 + ttft_s
        r.t_first, r.chunk_times = t, [t]
        for g in gaps_s:
            t += g
            r.chunk_times.append(t)
        r.t_end = t
    else:
        r.t_end = 100.01
    return r


def test_percentile_is_numpy_s_linear_interpolation():
    values = [3.0, 1.0, 7.5, 2.0, 10.0, 4.0]
    for q in (0, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_a_request_meets_the_goal_only_with_a_fast_first_token_short_gaps_and_every_token():
    goal = Goal(ttft_ms=2_000, itl_p99_ms=200)
    assert record(0).met(goal)
    assert not record(1, ttft_s=2.5).met(goal)
    assert not record(2, gaps_s=(0.05, 0.05, 0.05, 0.9)).met(goal)  # one long stall: its p99
    assert not record(3, outcome="capped", tokens=3, admitted_tokens=3).met(goal)
    assert record(3, outcome="capped", tokens=3, admitted_tokens=3).met(Goal(all_tokens=False))
    assert not record(4, outcome="refused").met(goal)
    assert not record(5, outcome="timed_out").met(goal)


def test_summary_counts_every_outcome_and_goodput_over_the_run_s_duration():
    refused = record(3, outcome="refused", status=429, reason="queue_full: the queue holds 8",
                     retry_after_s=2.0)
    recs = [record(0), record(1, ttft_s=3.0), record(2, outcome="capped", wanted=9, tokens=5,
                                                     admitted_tokens=5),
            refused, record(4, outcome="timed_out"), record(5, outcome="error", reason="boom")]
    doc = summarize(recs, Goal(), offered_rate_per_s=3.0, duration_s=2.0)
    assert doc["outcomes"] == {"done": 2, "capped": 1, "refused": 1, "timed_out": 1, "error": 1}
    assert doc["good_requests"] == 1 and doc["goodput_per_s"] == pytest.approx(0.5)
    assert doc["completed_per_s"] == pytest.approx(1.5)
    assert doc["ttft_ms"]["n"] == 3 and doc["ttft_ms"]["p50"] == pytest.approx(100)
    assert doc["itl_ms"]["p50"] == pytest.approx(50)
    assert doc["refused"]["by_reason"] == {"429 queue_full": 1}
    assert doc["refused"]["with_retry_after"] == 1 and doc["refused"]["time_to_refusal_ms"]["n"] == 1
    assert doc["capped"] == {"tokens_short": 4, "first": {"wanted": 9, "admitted": 5}}
    assert doc["errors_first"] == ["boom"]
    assert doc["missed_goal"] == {"ttft": 1, "itl": 0, "short": 1}


def test_an_empty_figure_is_null_not_nan_so_the_json_stays_standard():
    doc = summarize([record(0, outcome="refused", status=503, reason="no_worker: none")], Goal(),
                    None, 0.0)
    assert doc["ttft_ms"]["p50"] is None and doc["goodput_per_s"] == 0.0
    json.loads(json.dumps(doc), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))


def test_refused_with_a_remedy_is_counted_beside_timed_out():
    told = record(0, outcome="refused", status=429, retry_after_s=3.0,
                  reason="time_busy: rejected (time_busy): one more stream ...; retry in 3.0 s")
    bare = record(1, outcome="refused", status=503, reason="503: Service Unavailable")
    doc = summarize([told, bare, record(2, outcome="timed_out"), record(3, outcome="timed_out")],
                    Goal(), 1.0, 10.0)
    assert doc["refused"]["with_remedy"] == 1
    assert doc["refused_with_remedy_vs_timed_out"] == [1, 2]


def test_the_sweep_sends_the_goodput_goal_as_ortserve_s_admission_goals():
    from bench.served.load_sweep import admission_goals

    assert admission_goals(Goal(ttft_ms=2_000, itl_p99_ms=200)) == {"max_itl_ms": 200,
                                                                   "max_ttft_ms": 2_000}
