"""What real clients hit (issue 52), end to end through real processes and the real SmolLM2:
a chat_template_kwargs name the template does not read, accepted and named on the three
APIs; the gateway's --tenant-header reaching the scheduler on every route, the Messages
API's included; a 400 naming the caller's field, not the proto's; and gateway.md's
two-turn Responses example, run as written, its follow-up on the first's kept KV."""

from __future__ import annotations

import contextlib
import io
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from devtools.cluster import stop_service
from tests.e2e.gateway.test_gateway_e2e import FRANCE, MODEL, openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TENANT_HEADER = "X-Team"
ASK = [{"role": "user", "content": FRANCE}]
# The body of each API asking for a few tokens, with `extra` keys.
BODIES = {
    "/v1/chat/completions": lambda extra: {"model": MODEL, "messages": ASK, "max_tokens": 3,
                                           **extra},
    "/v1/responses": lambda extra: {"model": MODEL, "input": FRANCE, "max_output_tokens": 3,
                                    "store": False, **extra},
    "/v1/messages": lambda extra: {"model": MODEL, "messages": ASK, "max_tokens": 3, **extra},
}


@pytest.fixture(scope="module")
def gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address, ("--tenant-header", TENANT_HEADER))
    yield service
    stop_service(service)


def post(gateway, path: str, body: dict, headers: dict | None = None):
    """(status, headers, JSON body) of a POST."""
    request = urllib.request.Request(f"http://{gateway.address}{path}", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_template_variable_the_template_does_not_read_is_accepted_and_named(gateway, path):
    # SmolLM2's template has no enable_thinking: vLLM and SGLang pass it, and so does ortserve.
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    status, headers, body = post(gateway, path, BODIES[path](kwargs))
    assert status == 200, body
    assert headers["x-ortserve-template-kwargs-unread"] == "enable_thinking"
    assert body["ortserve"]["template_kwargs_unread"] == ["enable_thinking"]
    # Without it: the same prompt (it changed nothing), and nothing named.
    status, headers, plain = post(gateway, path, BODIES[path]({}))
    assert status == 200 and "x-ortserve-template-kwargs-unread" not in headers
    assert plain["ortserve"]["template_kwargs_unread"] == []
    assert plain["ortserve"]["prompt_tokens"] == body["ortserve"]["prompt_tokens"]


@pytest.mark.parametrize("path", sorted(BODIES))
def test_a_variable_ortserve_sets_is_a_400_naming_the_callers_field(gateway, path):
    status, _, body = post(gateway, path, BODIES[path](
        {"chat_template_kwargs": {"add_generation_prompt": False}}))
    assert status == 400, body
    message = body["error"]["message"]
    assert "set by ortserve itself" in message
    assert message.startswith("chat_template_kwargs.add_generation_prompt: "), message
    assert "template_kwargs_json" not in message


ROUTES = {  # every route that calls the scheduler for a caller, and a body it takes
    **{path: make({}) for path, make in BODIES.items()},
    "/v1/completions": {"model": MODEL, "prompt": "Hi", "max_tokens": 3},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": ASK},
    "/tokenize": {"model": MODEL, "prompt": "Hi"},
    "/detokenize": {"model": MODEL, "tokens": [42]},
}


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_the_tenant_header_reaches_the_scheduler_on_every_route(gateway, path):
    # This scheduler has no tenants file, so it trusts no ortserve-tenant metadata and
    # refuses a call that carries one, naming it (tenants.md: never silently ignored):
    # the refusal shows the gateway passed the header on.
    status, _, body = post(gateway, path, ROUTES[path], {TENANT_HEADER: "batch"})
    assert status == 400, (path, body)
    assert "does not trust ortserve-tenant metadata" in body["error"]["message"], body
    status, _, body = post(gateway, path, ROUTES[path])
    assert status == 200, (path, body)


def gateway_md_example() -> str:
    """The first python block under gateway.md's "The Responses API" heading."""
    text = (Path(__file__).parents[3] / "docs" / "gateway.md").read_text()
    section = text[text.index("## The Responses API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_gateway_mds_two_turn_responses_example_continues_its_session(gateway):
    code = gateway_md_example().replace("http://127.0.0.1:8000/v1",
                                        f"http://{gateway.address}/v1")
    assert f"http://{gateway.address}/v1" in code
    names: dict = {}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "docs/gateway.md", "exec"), names)  # noqa: S102 - the docs' own code
    first, second = names["first"], names["second"]
    try:
        # What its comment promises: the follow-up on the KV the first response kept (in
        # the prefix cache), the first turn of the session it opens.
        assert printed.getvalue().split()[-1] == str(
            second.usage.input_tokens_details.cached_tokens)
        assert second.usage.input_tokens_details.cached_tokens > 0
        session = second.model_extra["ortserve"]["session"]
        assert session["kept"] and session["turn"] == 1, session
    finally:
        client = openai_client(gateway)
        for response in (second, first):
            client.responses.delete(response.id)  # the session's lease goes at once
