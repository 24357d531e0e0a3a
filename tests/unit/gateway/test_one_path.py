"""One generation path (gateway/generation.py) under every API: a request to each of
chat, completions, Responses and Messages reaches the scheduler with the same caller
metadata (key and --tenant-header), the same placement hint (--model-server-worker-id)
and stream interval, and answers with the same per-request numbers (the X-Ortserve-*
headers, the `ortserve` object's admission, the `metrics` object when asked, the GenAI
histograms). The app is the real one, driven over
ASGI; only the scheduler is a fake (Upstream, patched where app.py opens it)."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway import app as app_module
from gateway.config import GatewayConfig
from gateway.reply.ortserve_numbers import CAP_HEADER, DECISION_HEADER, MAX_TOKENS_HEADER
from gateway.upstream import OpenStream
from ortserve.v1 import scheduler_pb2, types_pb2

ASK = [{"role": "user", "content": "Hi"}]
BODIES = {  # every API that generates, and a body it takes
    "/v1/chat/completions": {"model": "m", "messages": ASK, "max_tokens": 8},
    "/v1/completions": {"model": "m", "prompt": "Hi", "max_tokens": 8},
    "/v1/responses": {"model": "m", "input": "Hi", "max_output_tokens": 8, "store": False},
    "/v1/messages": {"model": "m", "messages": ASK, "max_tokens": 8},
}


class _Call:
    def __init__(self) -> None:
        self.cancelled = False
        self._events = [
            types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(text="Paris", token_ids=[7])),
            types_pb2.GenerateEvent(finished=types_pb2.Finished(
                finish_reason=types_pb2.LENGTH, worker_id="w2",
                usage=types_pb2.Usage(prompt_tokens=5, generated_tokens=1)))]

    async def read(self):
        return self._events.pop(0)

    def cancel(self) -> None:
        self.cancelled = True


class FakeUpstream:
    """The scheduler: admits every request capped, answers one token."""

    opened: list[tuple[types_pb2.GenerateRequest, tuple]] = []

    def __init__(self, address, timeout_s, models_cache_s, credentials=None) -> None:
        self.address, self.tls, self.timeout_s = address, False, timeout_s

    async def resolve_adapter(self, request, metadata=()) -> None:
        pass

    async def open(self, request, metadata=()) -> OpenStream:
        FakeUpstream.opened.append((request, tuple(metadata)))
        cap = types_pb2.BudgetCap(requested_max_new_tokens=8, admitted_max_new_tokens=1,
                                  requested_bytes=800, admitted_bytes=100,
                                  reason="the budget holds 1 token; lower max_new_tokens")
        return OpenStream(_Call(), types_pb2.Admission(
            decision=types_pb2.CAPPED, request_id=request.request_id, worker_id="w2",
            model="m", prompt_tokens=5, max_new_tokens=1, reserved_bytes=100,
            max_new_tokens_source=types_pb2.MAX_NEW_TOKENS_FROM_REQUEST, budget_cap=cap))

    async def budget(self):
        return scheduler_pb2.Budget()  # /metrics in front of one worker asks it

    async def close(self) -> None:
        pass


async def _call(app, path: str, body: dict | None, headers: dict[str, str]):
    """(status, headers, body) of one POST (GET without a body) through the app's ASGI
    interface; a JSON body parsed."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST" if body is not None else "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
             "root_path": "", "query_string": b"", "server": ("test", 80),
             "client": ("caller", 1), "app": app,
             "headers": [(b"content-type", b"application/json"),
                         *((k.lower().encode(), v.encode()) for k, v in headers.items())]}
    incoming = [{"type": "http.request", "body": json.dumps(body or {}).encode(),
                 "more_body": False}]
    sent: list[dict] = []

    async def receive():
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # the client stays: no disconnect

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    answer = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return (start["status"], headers,
            json.loads(answer) if "json" in headers["content-type"] else answer.decode())


@pytest.fixture
def answers(monkeypatch):
    monkeypatch.setattr(app_module, "Upstream", FakeUpstream)
    FakeUpstream.opened = []
    app = app_module.build_app(GatewayConfig(
        direct_to_workers=False, tenant_header="X-Team", model_server_worker_id="w2",
        stream_interval_ms=40))

    async def run():
        out = {}
        async with app.router.lifespan_context(app):
            for path, body in BODIES.items():
                out[path] = await _call(app, path, body, {
                    "Authorization": "Bearer k", "X-Team": "batch",
                    "X-Ortserve-Request-Metrics": "true"})
            out["/metrics"] = await _call(app, "/metrics", None, {})
        return out

    return asyncio.run(run())


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_api_sends_the_callers_tenant_and_the_placement_hint(answers, path):
    request, metadata = FakeUpstream.opened[list(BODIES).index(path)]
    assert answers[path][0] == 200, answers[path]
    assert metadata == (("authorization", "Bearer k"), ("ortserve-tenant", "batch"))
    assert request.preferred_worker_id == "w2"  # --model-server-worker-id
    assert request.stream_interval_ms == 40  # the gateway's, the body set none


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_api_answers_the_per_request_numbers_chat_answers(answers, path):
    status, headers, body = answers[path]
    assert headers[DECISION_HEADER.lower()] == "CAPPED"
    assert headers[MAX_TOKENS_HEADER.lower()] == "max_tokens=1, source=request"
    assert headers[CAP_HEADER.lower()].startswith(
        "requested_max_tokens=8, admitted_max_tokens=1, requested_bytes=800")
    ortserve = body["ortserve"]
    assert (ortserve["decision"], ortserve["worker_id"], ortserve["reserved_bytes"]) == (
        "CAPPED", "w2", 100)
    # The cap's reason in the API's own name for max_new_tokens.
    word = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    assert ortserve["budget_cap"]["reason"].endswith(f"lower {word}")


@pytest.mark.parametrize("path", sorted(BODIES))
def test_every_api_answers_the_per_request_metrics_when_asked(answers, path):
    metrics = answers[path][2]["metrics"]
    assert set(metrics) == {"time_to_first_token_ms", "generation_time_ms", "queue_time_ms",
                            "mean_itl_ms", "tokens_per_second"}


def test_every_api_is_counted_in_the_genai_histograms(answers):
    exposition = answers["/metrics"][2]
    counted = [line for line in exposition.splitlines()
               if line.startswith("gen_ai_server_request_duration_seconds_count")]
    # chat, Responses and Messages are "chat" by the conventions, completions text_completion
    assert any('gen_ai_operation_name="chat"' in line and line.endswith(" 3.0")
               for line in counted), counted
    assert any('gen_ai_operation_name="text_completion"' in line and line.endswith(" 1.0")
               for line in counted), counted

