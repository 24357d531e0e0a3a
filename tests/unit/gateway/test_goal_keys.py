"""The latency goals (`max_itl_ms`, `max_ttft_ms`: docs/features/time-budget.md) on every API
that generates: chat, completions, Responses and Messages each carry them to the scheduler in
GenerateRequest's fields, and each refuses a bad one with a 400 naming the key, in its own
error shape. The real app over ASGI; only the scheduler is a fake (test_one_path.py's)."""

from __future__ import annotations

import asyncio

import pytest

from gateway import app as app_module
from gateway.config import GatewayConfig
from tests.unit.gateway.test_one_path import BODIES, FakeUpstream, _call

GOALS = {"max_itl_ms": 40, "max_ttft_ms": 2_000}


def _post_all(monkeypatch, extra: dict) -> dict:
    monkeypatch.setattr(app_module, "Upstream", FakeUpstream)
    FakeUpstream.opened = []
    app = app_module.build_app(GatewayConfig(direct_to_workers=False))

    async def run():
        async with app.router.lifespan_context(app):
            return {path: await _call(app, path, {**body, **extra}, {})
                    for path, body in BODIES.items()}

    return asyncio.run(run())


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_api_carries_the_goal_keys_to_the_scheduler(monkeypatch, path):
    answers = _post_all(monkeypatch, GOALS)
    assert answers[path][0] == 200, answers[path]
    request, _ = FakeUpstream.opened[list(BODIES).index(path)]
    assert (request.max_itl_ms, request.max_ttft_ms) == (40, 2_000)


@pytest.mark.parametrize("key", sorted(GOALS))
@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_api_refuses_a_bad_goal_naming_the_key(monkeypatch, path, key):
    answers = _post_all(monkeypatch, {key: -5})
    status, _, body = answers[path]
    assert status == 400 and FakeUpstream.opened == []
    if path == "/v1/messages":  # Anthropic's shape: the message names the field
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"].startswith(f"{key}: must be a whole number of")
    else:
        assert body["error"]["param"] == key
        assert "whole number of milliseconds" in body["error"]["message"]
