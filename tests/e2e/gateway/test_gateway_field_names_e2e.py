"""Through the gateway, the scheduler's remedies and cap reasons name the parameters each
route's callers set (chat/completions: max_tokens; /v1/responses: max_output_tokens;
/v1/messages: max_tokens; min_tokens on all), never GenerateRequest's max_new_tokens.
Real processes on a worker whose budget holds one short chat (docs/gateway.md)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from devtools.cluster import stop_service
from tests.e2e.conftest import start_cluster
from tests.e2e.gateway.test_gateway_e2e import BPT, ESSAY, MODEL, TIGHT_BUDGET_TOKENS, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "tight-names",
                            kv_capacities=[str(TIGHT_BUDGET_TOKENS * BPT)])
    service = start_gateway(tmp_path_factory, cluster.address)
    yield cluster, service
    stop_service(service)
    cluster.stop()


# route -> (path, the body asking for `n` new tokens, the name its callers set)
ROUTES = {
    "chat": ("/v1/chat/completions", lambda n, extra: {
        "model": MODEL, "messages": [{"role": "user", "content": ESSAY}], "max_tokens": n,
        **extra}, "max_tokens"),
    "completions": ("/v1/completions", lambda n, extra: {
        "model": MODEL, "prompt": ESSAY, "max_tokens": n, **extra}, "max_tokens"),
    "responses": ("/v1/responses", lambda n, extra: {
        "model": MODEL, "input": ESSAY, "max_output_tokens": n, "store": False, **extra},
        "max_output_tokens"),
    "messages": ("/v1/messages", lambda n, extra: {
        "model": MODEL, "messages": [{"role": "user", "content": ESSAY}], "max_tokens": n,
        **extra}, "max_tokens"),
}


def post(gateway, path: str, body: dict) -> tuple[int, dict[str, str], str]:
    """(status, headers, body text) of a JSON POST to the gateway."""
    request = urllib.request.Request(f"http://{gateway.address}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_refusal_names_the_routes_own_parameter(tight, route):
    _, gateway = tight
    path, body, name = ROUTES[route]
    status, _, text = post(gateway, path, body(400, {"cap_policy": "strict", "min_tokens": 16}))
    assert status in (400, 429), text
    assert f"{name} <=" in text, text  # the remedy: ask for fewer, in the caller's words
    assert "max_new_tokens <=" not in text and "min_new_tokens" not in text.replace(
        '"min_new_tokens"', ""), text


@pytest.mark.parametrize("route", list(ROUTES))
def test_a_caps_reason_names_the_routes_own_parameter(tight, route):
    _, gateway = tight
    path, body, name = ROUTES[route]
    status, headers, text = post(gateway, path, body(400, {"min_tokens": 16, "temperature": 0}))
    assert status == 200, text
    assert {k.lower(): v for k, v in headers.items()}["x-ortserve-decision"] == "CAPPED"
    reason = json.loads(text)["ortserve"]["budget_cap"]["reason"]
    assert f"capped to {name} " in reason and "max_new_tokens" not in reason, reason
