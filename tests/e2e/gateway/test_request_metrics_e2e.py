"""Per-request numbers and the GenAI semantic-convention histograms through the real openai
client: a gateway with --per-request-metrics puts vLLM's `metrics` object in every answer,
one without it only in answers to requests that ask (X-Ortserve-Request-Metrics: true); the
gateway's /metrics counts each finished request in gen_ai_server_* histograms."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.cluster import stop_service
from gateway.request_metrics import TTFT_BUCKETS_S
from tests.e2e.gateway.test_gateway_e2e import FRANCE, MODEL, openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

FIELDS = {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
          "tokens_per_second"}
ASK = {"X-Ortserve-Request-Metrics": "true"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": FRANCE}], "max_tokens": 12,
        "temperature": 0, "extra_body": {"min_tokens": 4}}


@pytest.fixture(scope="module")
def gateways(roomy, tmp_path_factory):
    plain = start_gateway(tmp_path_factory, roomy.address)
    always = start_gateway(tmp_path_factory, roomy.address, ("--per-request-metrics",))
    yield plain, always
    stop_service(plain)
    stop_service(always)


def check(metrics: dict, completion_tokens: int) -> None:
    assert set(metrics) == FIELDS
    assert metrics["time_to_first_token_ms"] > 0 and metrics["queue_time_ms"] >= 0
    assert completion_tokens >= 4 and metrics["generation_time_ms"] > 0
    assert metrics["mean_itl_ms"] == pytest.approx(
        metrics["generation_time_ms"] / (completion_tokens - 1), abs=0.01)
    assert metrics["tokens_per_second"] == pytest.approx(
        (completion_tokens - 1) / metrics["generation_time_ms"] * 1e3, rel=0.01)


def histograms(gateway) -> dict[str, dict]:
    text = urllib.request.urlopen(f"http://{gateway.address}/metrics", timeout=10).read().decode()
    return {f.name: f for f in text_string_to_metric_families(text)
            if f.name.startswith("gen_ai_server_") and f.type == "histogram"}


def chat_count(family) -> float:
    """The family's count of successful chats (the other test's completions aside)."""
    (sample,) = [s for s in family.samples if s.name.endswith("_count")
                 and s.labels["gen_ai_operation_name"] == "chat"
                 and s.labels.get("error_type", "") == ""]
    return sample.value


def test_the_body_carries_metrics_when_the_gateway_or_the_request_asks(gateways):
    plain, always = gateways
    client = openai_client(plain)
    unasked = client.chat.completions.create(**CHAT)
    assert "metrics" not in (unasked.model_extra or {})
    asked = client.chat.completions.create(**CHAT, extra_headers=ASK)
    check(asked.model_extra["metrics"], asked.usage.completion_tokens)
    every = openai_client(always).chat.completions.create(**CHAT)
    check(every.model_extra["metrics"], every.usage.completion_tokens)
    # Streamed: each choice's last chunk (the one with its finish_reason) carries them.
    chunks = list(client.chat.completions.create(**CHAT, stream=True, extra_headers=ASK,
                                                  stream_options={"include_usage": True}))
    (last,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c for c in chunks if "metrics" in (c.model_extra or {})] == [last]
    check(last.model_extra["metrics"], chunks[-1].usage.completion_tokens)
    # A completion too.
    text = client.completions.create(model=MODEL, prompt=FRANCE, max_tokens=8,
                                     extra_body={"min_tokens": 4}, extra_headers=ASK)
    check(text.model_extra["metrics"], text.usage.completion_tokens)


def test_genai_histograms_count_each_finished_request_beside_ortserves_own(gateways):
    plain, _ = gateways
    before = histograms(plain)
    counted = {name: chat_count(f) if f.samples else 0.0 for name, f in before.items()}
    client = openai_client(plain)
    client.chat.completions.create(**CHAT)
    list(client.chat.completions.create(**CHAT, stream=True))
    after = histograms(plain)
    assert set(after) == {"gen_ai_server_time_to_first_token_seconds",
                          "gen_ai_server_time_per_output_token_seconds",
                          "gen_ai_server_request_duration_seconds"}
    for name, family in after.items():
        assert family.type == "histogram"
        assert chat_count(family) == counted.get(name, 0.0) + 2, name
    ttft = after["gen_ai_server_time_to_first_token_seconds"]
    (sample,) = [s for s in ttft.samples if s.name.endswith("_count")
                 and s.labels["gen_ai_operation_name"] == "chat"]
    assert sample.labels == {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "ortserve",
                             "gen_ai_request_model": MODEL, "gen_ai_response_model": MODEL}
    bounds = sorted(float(s.labels["le"]) for s in ttft.samples
                    if s.name.endswith("_bucket") and s.labels["le"] != "+Inf"
                    and s.labels["gen_ai_operation_name"] == "chat")
    assert bounds == list(TTFT_BUCKETS_S)  # the conventions' explicit boundaries
    # ortserve's own request histogram is still there, beside them.
    text = urllib.request.urlopen(f"http://{plain.address}/metrics", timeout=10).read().decode()
    assert "ortserve_gateway_request_duration_seconds_count" in text
