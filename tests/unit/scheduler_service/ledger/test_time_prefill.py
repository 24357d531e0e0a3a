"""The first token's time counts the prompt's chunks (time_budget.py): beside streams with a
gap goal a step runs only the prompt tokens that keep it within the goal
(ortserve/rules/prefill_math.py, the worker's own rule), so a long prompt takes more steps.
Synthetic steps (10 ms + 10 ms a row), a prompt token at 0.5 ms, a fake clock."""

from __future__ import annotations

import pytest

from ortserve.rules.prefill_math import prefill_budget_tokens, prefill_s
from ortserve.status.errors import InvalidField
from ortserve.v1 import scheduler_pb2
from scheduler_service import convert
from scheduler_service.ledger.ledger import AdmissionRequest, Cause, Decision
from scheduler_service.ledger.queue import AdmissionQueue, Ticket
from scheduler_service.ledger.step_model import PromptPace, StepSample
from tests.unit.scheduler_service.ledger.test_time_admission import measured_ledger

PROMPT_TOKEN_MS = 0.5


def paced_ledger():
    ledger = measured_ledger()
    assert ledger.heartbeat("w1", prefill=PromptPace(PROMPT_TOKEN_MS, chunk_tokens=512))
    return ledger


def ask(request_id, prompt_tokens=10, max_itl_ms=0, max_ttft_ms=0, max_new_tokens=100):
    return AdmissionRequest(request_id, prompt_tokens=prompt_tokens,
                            max_new_tokens=max_new_tokens, model="m", max_itl_ms=max_itl_ms,
                            max_ttft_ms=max_ttft_ms)


def two_streams(ledger, max_itl_ms: int, max_new_tokens: int = 100) -> None:
    for name in ("a", "b"):
        assert ledger.admit(ask(name, max_itl_ms=max_itl_ms,
                                max_new_tokens=max_new_tokens)).decision is Decision.ADMITTED


def test_the_chunks_pace_is_the_workers_rule():
    # Beside 2 streams (a 30 ms step) with a 50 ms goal: 40 ms aimed at, 10 ms left, 20
    # tokens a step; a 1,000-token prompt takes 50 steps: 50 x 30 ms + 1,000 x 0.5 ms.
    assert prefill_budget_tokens(50, 0.030, 0.0005, 512) == 20
    assert prefill_s(1_000, 50, 0.030, 0.0005, 512) == pytest.approx(2.0)
    # No goal: two chunks of the configured 512.
    assert prefill_s(1_000, 0, 0.030, 0.0005, 512) == pytest.approx(0.56)
    # A chunk's own run (5 ms) leaves 5 ms, 10 tokens a step: 100 steps of 35 ms + 0.5 s.
    assert prefill_budget_tokens(50, 0.030, 0.0005, 512, chunk_s=0.005) == 10
    assert prefill_s(1_000, 50, 0.030, 0.0005, 512, chunk_s=0.005) == pytest.approx(4.0)
    # Room left for a 35 ms p90 decode: 5 ms, 10 tokens a step; the steps still take the
    # mean's 30 ms: 100 steps of 30 ms + 0.5 s. A tail below the mean reads as the mean.
    assert prefill_s(1_000, 50, 0.030, 0.0005, 512, decode_tail_s=0.035) == pytest.approx(3.5)
    assert prefill_s(1_000, 50, 0.030, 0.0005, 512, decode_tail_s=0.010) == pytest.approx(2.0)


def test_a_long_prompt_whose_chunks_beside_goal_streams_pass_its_ttft_goal_is_refused_with_them():
    ledger = paced_ledger()
    two_streams(ledger, max_itl_ms=50)
    # The step with it (40 ms) keeps every gap goal; its first token would not keep 1.5 s:
    # 2.0 s of chunks now, and the streams end in 3 s (100 tokens x 30 ms).
    refused = ledger.admit(ask("long", prompt_tokens=1_000, max_itl_ms=50, max_ttft_ms=1_500))
    assert refused.decision is Decision.REJECTED
    r = refused.rejection
    assert r.cause is Cause.TIME_BUSY and r.first_token_late and not r.time_waits
    assert refused.rejection.retry_after_s == pytest.approx(3.0)
    assert r.estimated_wait_s == pytest.approx(3.0)
    # Now: 20 tokens a step behind a's and b's 10-token prompts (admitted at this instant,
    # not run yet), 1,020 tokens: 2.04 s; at best after both end: 3.0 s + 0.5 s.
    assert r.prefill_ms == pytest.approx(2_040.0) and r.prefill_budget_tokens == 20
    assert r.prompts_ahead_tokens == 20
    assert r.first_token_ms == pytest.approx(3_500.0)
    assert "1,000-token prompt" in r.message and "chunks of 20 tokens" in r.message
    assert "behind 20 prompt tokens admitted before it" in r.message
    assert "max_ttft_ms 1,500" in r.message and "3.5 s" in r.message
    assert "loosen max_ttft_ms" in r.remedy and "shorter prompt" in r.remedy


def test_prompts_admitted_before_it_and_not_yet_run_count_toward_its_first_token():
    # Two 1,000-token prompts admitted just now (goal 50 ms): the worker runs them before a
    # newcomer's, at 20 tokens a step beside 2 streams (500 tokens/s: 4 s for the two).
    ledger = paced_ledger()
    for name in ("p1", "p2"):
        assert ledger.admit(ask(name, prompt_tokens=1_000, max_itl_ms=50,
                                max_ttft_ms=10_000)).decision is Decision.ADMITTED
    # Its own 100 tokens alone would take 0.2 s (5 steps of 30 ms + 50 ms): within 1.5 s.
    # Behind the 2,000 tokens ahead: 4.2 s now, and 3.3 s after both streams' 3 s.
    refused = ledger.admit(ask("new", prompt_tokens=100, max_itl_ms=50, max_ttft_ms=1_500))
    assert refused.decision is Decision.REJECTED
    r = refused.rejection
    assert r.cause is Cause.TIME_BUSY and r.first_token_late
    assert r.prompts_ahead_tokens == 2_000 and r.prefill_ms == pytest.approx(4_200.0)
    assert r.first_token_ms == pytest.approx(3_300.0)
    assert "behind 2,000 prompt tokens admitted before it" in r.message
    # Once their prompts have run (4 s at that pace), the same request is admitted.
    ledger._clock.now += 4.5
    assert ledger.admit(ask("new", prompt_tokens=100, max_itl_ms=50,
                            max_ttft_ms=1_500)).decision is Decision.ADMITTED


def test_the_chunks_pace_leaves_room_for_the_workers_p90_decode_as_the_worker_does():
    # 2 streams with an 80 ms goal, decoding 30 ms on average but 60 ms at their p90: the
    # worker runs (64 - 60) / 0.5 = 8 tokens a step beside them, not (64 - 30) / 0.5 = 68.
    ledger = paced_ledger()
    assert ledger.heartbeat("w1", steps=[StepSample(rows=2, steps=1, seconds=0.030,
                                                    tail_seconds=0.060)])
    two_streams(ledger, max_itl_ms=80)
    # At 68 a step its 400 tokens (and a's and b's 20) would take 0.4 s; at 8: 53 steps of
    # 30 ms + 0.21 s, 1.8 s, past 1.5 s; the streams end in 3 s.
    refused = ledger.admit(ask("new", prompt_tokens=400, max_itl_ms=80, max_ttft_ms=1_500))
    assert refused.decision is Decision.REJECTED
    r = refused.rejection
    assert r.cause is Cause.TIME_BUSY and r.first_token_late
    assert r.prefill_budget_tokens == 8 and r.prefill_ms == pytest.approx(1_800.0)


def test_the_same_prompt_is_admitted_beside_streams_without_a_goal_or_with_a_looser_ttft():
    ledger = paced_ledger()
    two_streams(ledger, max_itl_ms=0)  # full chunks beside them: 0.56 s
    assert ledger.admit(ask("long", prompt_tokens=1_000, max_itl_ms=50,
                            max_ttft_ms=1_500)).decision is Decision.ADMITTED
    ledger = paced_ledger()
    two_streams(ledger, max_itl_ms=50)
    assert ledger.admit(ask("long", prompt_tokens=1_000, max_itl_ms=50,
                            max_ttft_ms=2_500)).decision is Decision.ADMITTED


def test_it_waits_when_a_stream_ending_lets_its_chunks_fit_its_ttft_goal():
    ledger = paced_ledger()
    queue = AdmissionQueue(ledger, max_wait_s=60.0)
    two_streams(ledger, max_itl_ms=50, max_new_tokens=10)  # they end in 0.3 s
    # Beside 2: 2.0 s; after one ends (0.3 s), beside 1 (20 ms, 40 tokens a step): 1.0 s.
    ticket = queue.submit(ask("long", prompt_tokens=1_000, max_itl_ms=50, max_ttft_ms=1_500))
    assert isinstance(ticket, Ticket)


def test_a_request_tried_again_from_the_queue_has_spent_its_time_in_line_of_its_ttft_goal():
    # Two streams with a 35 ms gap goal (30 ms at 2 rows, 40 at 3): a third waits for one to
    # end (3 s), then its 100 tokens beside one (16 a step of 20 ms): 0.19 s, within 5 s.
    def queued(waited_s: float):
        ledger = paced_ledger()
        queue = AdmissionQueue(ledger, max_wait_s=60.0, clock=ledger._clock)
        first = ledger.admit(ask("a", max_itl_ms=35))
        assert ledger.admit(ask("b", max_itl_ms=35)).decision is Decision.ADMITTED
        ticket = queue.submit(ask("new", prompt_tokens=100, max_itl_ms=35, max_ttft_ms=5_000))
        assert isinstance(ticket, Ticket)
        ledger._clock.now += waited_s
        ledger.release(first.lease.lease_id)
        (done,) = queue.pump()
        return done.outcome
    assert queued(4.0).decision is Decision.ADMITTED  # 4 s + 0.19 s: within 5 s
    # 4.96 s in line: 0.19 s now passes 5 s, and at best (once b has ended, its predicted end
    # long past) its chunks alone, 0.05 s, too. Before, it was held to the whole 5 s again
    # (admitted, its first token then past its goal); now refused, naming the wait.
    late = queued(4.96)
    assert late.decision is Decision.REJECTED
    r = late.rejection
    assert r.cause is Cause.TIME_BUSY and r.waited_s == pytest.approx(4.96)
    assert "after the 5.0 s it already waited in line" in r.message


def test_a_prompt_past_its_ttft_goal_even_alone_is_unreachable_with_the_numbers():
    ledger = paced_ledger()
    two_streams(ledger, max_itl_ms=50)
    # 1,000 tokens alone take 0.5 s > 0.4 s: no wait cures it (before, it was admitted and
    # ran at the floor beside the streams: tens of seconds to its first token).
    refused = ledger.admit(ask("long", prompt_tokens=1_000, max_itl_ms=50, max_ttft_ms=400))
    r = refused.rejection
    assert r.cause is Cause.TIME_GOAL_UNREACHABLE and r.first_token_late
    assert r.prefill_ms == pytest.approx(500.0) and r.prefill_budget_tokens == 512
    assert "1,000-token prompt takes about 0.5 s" in r.message
    assert "loosen max_ttft_ms to at least 501" in r.remedy and r.retry_after_s == 0
    # The same prompt with no TTFT goal is not held to one.
    assert ledger.admit(ask("free", prompt_tokens=1_000,
                            max_itl_ms=50)).decision is Decision.ADMITTED


def test_a_worker_that_reports_no_prompt_cost_is_judged_as_before():
    ledger = measured_ledger()
    two_streams(ledger, max_itl_ms=50)
    assert ledger.admit(ask("long", prompt_tokens=1_000, max_itl_ms=50,
                            max_ttft_ms=1_500)).decision is Decision.ADMITTED


def test_a_heartbeats_prompt_pace_is_read_or_refused_naming_the_field():
    assert convert.prefill_pace(scheduler_pb2.HeartbeatRequest()) is None  # not measured
    pace = convert.prefill_pace(scheduler_pb2.HeartbeatRequest(
        prompt_token_ms=0.25, prompt_chunk_ms=4.0))
    assert pace == PromptPace(0.25, chunk_tokens=512, chunk_ms=4.0)  # an unsaid chunk: 512
    with pytest.raises(InvalidField) as err:
        convert.prefill_pace(scheduler_pb2.HeartbeatRequest(prompt_token_ms=0.25,
                                                            prompt_chunk_ms=-1.0))
    assert err.value.metadata["field"] == "prompt_chunk_ms"
    with pytest.raises(InvalidField) as err:
        convert.prefill_pace(scheduler_pb2.HeartbeatRequest(prompt_token_ms=float("nan")))
    assert err.value.metadata["field"] == "prompt_token_ms"


def test_a_stream_with_no_prompt_tokens_adds_nothing_ahead_and_breaks_nothing():
    from scheduler_service.ledger.time_budget import _prompts_ahead
    from scheduler_service.ledger.types import Lease

    def lease(lease_id: str, prompt_tokens: int, at: float) -> Lease:
        return Lease(lease_id=lease_id, worker_id="w", request_id=lease_id,
                     prompt_tokens=prompt_tokens, max_new_tokens=8, reserved_bytes=0,
                     created_at=at)

    # 100 tokens a second: the first prompt runs 10.0-11.0, the empty one has nothing to run
    # (before, it spanned no time and its share was a division by zero), the last 11.0-12.0.
    ahead = _prompts_ahead([lease("a", 100, 10.0), lease("b", 0, 10.5), lease("c", 100, 10.6)],
                           now=10.5, tokens_per_s=100.0)
    assert ahead(10.5) == 50 + 100
    assert ahead(11.5) == 50
    assert ahead(12.0) == 0
