"""ortserve.process.tracing: off unless asked for, asked for the standard ways, a no-op when off.

The trace itself, through real processes, is tests/e2e/operations/test_tracing_e2e.py.
"""

from __future__ import annotations

import pytest

from gateway.__main__ import parse_config as gateway_config
from ortserve.process import tracing
from scheduler_service.__main__ import parse_config as scheduler_config
from worker_service.__main__ import parse_config as worker_config


@pytest.mark.parametrize(("flag", "environ", "on"), [
    ("", {}, False),
    ("http://collector:4317", {}, True),
    ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"}, True),
    ("", {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4317"}, True),
    ("", {"OTEL_TRACES_EXPORTER": "console"}, True),
    ("", {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, False),
    ("http://collector:4317", {"OTEL_SDK_DISABLED": "true"}, False),
])
def test_on_only_when_asked_for(flag, environ, on):
    assert tracing.wanted(flag, environ) is on


def test_an_unknown_exporter_is_refused_by_name():
    with pytest.raises(ValueError, match="'zipkin'.*otlp.*console"):
        tracing._exporters("", {"OTEL_TRACES_EXPORTER": "zipkin"})


def test_every_helper_is_a_no_op_when_off():
    assert not tracing.enabled()  # nothing in the test process turned it on
    tracing.annotate(decision="capped")
    tracing.record("prefill", 1, 2, prompt_tokens=3)
    with tracing.span("claim", lease_id="l"):
        pass
    assert tracing.trace_context() == {}  # a RelayRequest carries nothing
    with tracing.span_from({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}, "x"):
        pass


def test_each_service_takes_vllms_flag_and_its_environment_variable(monkeypatch, tmp_path):
    url = "http://collector:4317"
    assert scheduler_config(["--otlp-traces-endpoint", url]).otlp_traces_endpoint == url
    assert gateway_config(["--otlp-traces-endpoint", url]).otlp_traces_endpoint == url
    assert worker_config(["--model-dir", str(tmp_path), "--otlp-traces-endpoint", url]
                         ).otlp_traces_endpoint == url
    monkeypatch.setenv("ORTSERVE_GATEWAY_OTLP_TRACES_ENDPOINT", url)
    assert gateway_config([]).otlp_traces_endpoint == url
    assert scheduler_config([]).otlp_traces_endpoint == ""
