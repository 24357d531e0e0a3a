"""A gateway whose scheduler is not listening answers 503 `scheduler_unavailable`, naming
the address it calls and the next step (docs/gateway.md), on the relayed and the direct
path, for chat (whole and streamed), /v1/responses and /v1/messages. A real gateway
process; nothing listens on its --scheduler port."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from devtools.cluster import start_service, stop_service
from tests.e2e.conftest import BIN

pytestmark = [pytest.mark.e2e]

MODEL = "smollm2-135m-instruct-fp32"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4}
REQUESTS = {
    "chat": ("/v1/chat/completions", CHAT),
    "chat streamed": ("/v1/chat/completions", {**CHAT, "stream": True}),
    "responses": ("/v1/responses", {"model": MODEL, "input": "Hi.", "max_output_tokens": 4}),
    "messages": ("/v1/messages", CHAT),
}


def closed_port() -> str:
    """A loopback address nothing listens on (bound for a moment, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def post(address: str, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{address}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture(scope="module", params=["relayed", "direct"])
def gateway(request, tmp_path_factory):
    scheduler = closed_port()
    args = ("--direct-to-workers",) if request.param == "direct" else ()
    service = start_service("gateway", [str(BIN / "ortserve-gateway"), "--port", "0",
                                        "--scheduler", scheduler, *args],
                            tmp_path_factory.mktemp("logs-gateway"))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # bound and announced; wait until uvicorn answers
        try:
            post(service.address, "/v1/models", {})
            break
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.1)
    yield service, scheduler
    stop_service(service)


@pytest.mark.parametrize("name", list(REQUESTS))
def test_no_scheduler_is_503_scheduler_unavailable_naming_its_address(gateway, name):
    service, scheduler = gateway
    path, body = REQUESTS[name]
    status, answer = post(service.address, path, body)
    assert status == 503, answer
    error = answer["error"]
    if name == "messages":  # Anthropic's shape: its type for a 503, no code
        assert error["type"] == "overloaded_error", error
    else:
        assert error["type"] == "service_unavailable"
        assert error["code"] == "scheduler_unavailable", error
    assert f"the scheduler at {scheduler}" in error["message"]
    assert "--scheduler" in error["message"] and "retry" in error["message"]
    assert error["ortserve"]["reason"] == "SCHEDULER_UNAVAILABLE"
    assert error["ortserve"]["metadata"] == {"scheduler_address": scheduler}
