"""The per-request `metrics` object (vLLM's field names) from a choice's Admission and
Finished, who asks for it, and the gateway's flag."""

from __future__ import annotations

import pytest

from gateway.__main__ import parse_config
from gateway.request_metrics import asked, body_metrics
from ortserve.v1 import types_pb2


def finished(tokens: int) -> types_pb2.Finished:
    return types_pb2.Finished(
        usage=types_pb2.Usage(prompt_tokens=10, generated_tokens=tokens),
        timings=types_pb2.Timings(queue_ms=2.0, prefill_ms=30.0, ttft_ms=40.0, decode_ms=90.0,
                                  decode_tokens_per_s=(tokens - 1) / 0.09 if tokens > 1 else 0,
                                  total_ms=130.0))


def test_fields_count_from_prefill_and_queue_time_adds_the_schedulers_queue():
    m = body_metrics(types_pb2.Admission(queue_wait_ms=5.5), finished(10))
    assert m == {"time_to_first_token_ms": 38.0, "generation_time_ms": 90.0,
                 "queue_time_ms": 7.5, "mean_itl_ms": 10.0, "tokens_per_second": 100.0}


def test_one_token_has_no_inter_token_figures():
    m = body_metrics(types_pb2.Admission(), finished(1))
    assert (m["mean_itl_ms"], m["tokens_per_second"]) == (None, None)


@pytest.mark.parametrize(("default", "header", "expected"), [
    (False, None, False), (False, "true", True), (False, "1", True), (False, "no", False),
    (True, None, True), (True, "false", True),  # the gateway's setting covers every request
])
def test_who_asks(default, header, expected):
    assert asked(default, header) is expected


def test_the_flag_and_its_variable(monkeypatch):
    monkeypatch.delenv("ORTSERVE_GATEWAY_PER_REQUEST_METRICS", raising=False)
    assert parse_config([]).per_request_metrics is False
    assert parse_config(["--per-request-metrics"]).per_request_metrics is True
    monkeypatch.setenv("ORTSERVE_GATEWAY_PER_REQUEST_METRICS", "1")
    assert parse_config([]).per_request_metrics is True
    assert parse_config(["--no-per-request-metrics"]).per_request_metrics is False
