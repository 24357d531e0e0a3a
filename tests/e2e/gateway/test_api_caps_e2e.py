"""End to end: a capped request through the Responses and Messages APIs says so as chat does
(the X-Ortserve-* headers, the `ortserve` object before the first token and at the end), on
a worker whose budget holds one short chat (real processes, the real SmolLM2)."""

from __future__ import annotations

import anthropic
import pytest

from devtools.cluster import stop_service
from tests.e2e.conftest import start_cluster
from tests.e2e.gateway.test_gateway_e2e import (
    BPT,
    ESSAY,
    MODEL,
    TIGHT_BUDGET_TOKENS,
    openai_client,
    start_gateway,
    wait_reserved_zero,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "tight-apis",
                            kv_capacities=[str(TIGHT_BUDGET_TOKENS * BPT)])
    service = start_gateway(tmp_path_factory, cluster.address)
    yield cluster, service
    stop_service(service)
    cluster.stop()


def cap_header(cap: dict) -> str:
    return (f"requested_max_tokens={cap['requested_max_new_tokens']}, "
            f"admitted_max_tokens={cap['admitted_max_new_tokens']}, "
            f"requested_bytes={cap['requested_bytes']}, admitted_bytes={cap['admitted_bytes']}")


def test_a_capped_stored_response_streams_its_cap_first_and_ends_incomplete(tight):
    cluster, gateway = tight
    client = openai_client(gateway)
    with client.responses.with_streaming_response.create(
            model=MODEL, input=ESSAY, max_output_tokens=400, temperature=0, stream=True,
            extra_body={"min_tokens": 16}) as response:
        assert response.headers["x-ortserve-decision"] == "CAPPED"
        events = list(response.parse())
    created = events[0].response.model_extra["ortserve"]
    cap = created["budget_cap"]
    assert events[0].type == "response.created" and created["decision"] == "CAPPED"
    assert response.headers["x-ortserve-budget-cap"] == cap_header(cap)
    assert cap["requested_max_new_tokens"] == 400
    assert cap["admitted_max_new_tokens"] < 400
    final = events[-1].response
    assert events[-1].type == "response.incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.usage.output_tokens == cap["admitted_max_new_tokens"]
    assert final.model_extra["ortserve"]["finished"]["budget_cap"] == cap
    # A one-shot stored response keeps no session: nothing stays charged (issue 55).
    assert final.model_extra["ortserve"]["session"]["kept"] is False
    assert wait_reserved_zero(cluster.address) == 0
    client.responses.delete(final.id)


def test_a_capped_message_says_so_in_the_header_and_ends_max_tokens(tight):
    cluster, gateway = tight
    messages = anthropic.Anthropic(base_url=f"http://{gateway.address}", api_key="unused",
                                   timeout=120).messages
    raw = messages.with_raw_response.create(
        model=MODEL, max_tokens=400, messages=[{"role": "user", "content": ESSAY}],
        extra_body={"temperature": 0, "min_tokens": 16})
    body = raw.parse()
    cap = body.model_extra["ortserve"]["budget_cap"]
    assert raw.headers["x-ortserve-decision"] == "CAPPED"
    assert raw.headers["x-ortserve-budget-cap"] == cap_header(cap)
    assert body.stop_reason == "max_tokens"
    assert body.usage.output_tokens == cap["admitted_max_new_tokens"] < 400
    with messages.stream(model=MODEL, max_tokens=400,
                         messages=[{"role": "user", "content": ESSAY}],
                         extra_body={"temperature": 0, "min_tokens": 16}) as stream:
        events = list(stream)
    start = events[0].message.model_extra["ortserve"]
    assert start["decision"] == "CAPPED" and start["budget_cap"] == cap
    delta = [e for e in events if e.type == "message_delta"][0]
    assert delta.delta.stop_reason == "max_tokens"
    assert delta.model_extra["ortserve"]["finished"]["budget_cap"] == cap
    assert wait_reserved_zero(cluster.address) == 0
