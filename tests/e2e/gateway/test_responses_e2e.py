"""End to end: the openai client's Responses API -> gateway -> scheduler -> worker (real
processes, the real SmolLM2): plain, streamed, a tool round trip, previous_response_id on
the session's KV, and refusals naming the field."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from devtools.cluster import stop_service
from ortserve.v1 import scheduler_pb2
from tests.e2e.conftest import reserved_bytes, scheduler_stub
from tests.e2e.gateway.test_gateway_e2e import (
    FRANCE,
    MODEL,
    openai_client,
    start_gateway,
    wait_reserved_zero,
)
from tests.e2e.gateway.test_gateway_sampling_e2e import _post
from tests.e2e.gateway.test_tools_e2e import WEATHER

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TOOLS = [{"type": "function", "name": "get_weather", "description": "The current weather in a city",
          "parameters": WEATHER}]
ASK = "What is the weather in Paris right now?"


@pytest.fixture(scope="module")
def gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address)
    yield service
    stop_service(service)


def test_plain_and_streamed_give_the_same_text_usage_and_admission(gateway):
    client = openai_client(gateway)
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=FRANCE, instructions="Answer briefly.", max_output_tokens=24,
        temperature=0, store=False)
    plain = raw.parse()
    assert raw.headers["x-ortserve-decision"] == "ADMITTED"
    assert plain.status in ("completed", "incomplete") and plain.output_text
    assert plain.model == MODEL and plain.instructions == "Answer briefly."
    assert plain.usage.input_tokens > 10 and 0 < plain.usage.output_tokens <= 24
    assert plain.model_extra["ortserve"]["decision"] == "ADMITTED"
    assert plain.model_extra["ortserve"]["session"] == {"kept": False, "reason": "store is false"}

    kinds, deltas, final = [], [], None
    for event in client.responses.create(model=MODEL, input=FRANCE, instructions="Answer briefly.",
                                         max_output_tokens=24, temperature=0, store=False,
                                         stream=True):
        kinds.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert kinds[-1] == f"response.{plain.status}"
    assert "".join(deltas) == final.output_text == plain.output_text
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.model_extra["ortserve"]["finished"]["finish_reason"]


def test_previous_response_id_continues_the_session_on_its_kv(roomy, gateway):
    client = openai_client(gateway)
    first = client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=24,
                                    temperature=0)
    assert first.model_extra["ortserve"]["session"]["kept"] is False
    assert first.usage.input_tokens_details.cached_tokens == 0
    # One-shot so far: its prompt and answer wait in the prefix cache, no session charged.
    assert wait_reserved_zero(roomy.address) == 0
    second = client.responses.create(model=MODEL, previous_response_id=first.id,
                                     input="And of Italy?", max_output_tokens=24, temperature=0)
    session = second.model_extra["ortserve"]["session"]
    assert session["kept"] and session["turn"] == 1  # the follow-up opened the session
    assert second.previous_response_id == first.id
    # Its start came from the prefix cache (whole 16-token blocks), not a prefill.
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached > 0 and second.usage.input_tokens > cached, (cached, second.usage)
    # Idle, the session's KV stays charged to its lease: the ledger shows it.
    assert reserved_bytes(roomy.address) > 0
    third = client.responses.create(model=MODEL, previous_response_id=second.id,
                                    input="And of Spain?", max_output_tokens=8, temperature=0)
    again = third.model_extra["ortserve"]["session"]
    assert again["id"] == session["id"] and again["turn"] == 2
    # The third turn prefilled only what it added: the second's prompt and answer were kept.
    assert third.usage.input_tokens_details.cached_tokens > second.usage.input_tokens - 8
    # The stateless equivalent (the whole conversation as input) answers the same.
    whole = client.responses.create(
        model=MODEL, store=False, max_output_tokens=24, temperature=0,
        input=[{"role": "user", "content": FRANCE}, *[o.model_dump() for o in first.output],
               {"role": "user", "content": "And of Italy?"}])
    assert whole.output_text == second.output_text
    assert whole.usage.input_tokens == second.usage.input_tokens
    # Stored responses can be read back; deleting them closes the session (the lease goes).
    assert client.responses.retrieve(second.id).output_text == second.output_text
    for response in (third, second, first):
        client.responses.delete(response.id)
    assert wait_reserved_zero(roomy.address) == 0


def test_a_tool_round_trip_through_previous_response_id(roomy, gateway):
    client = openai_client(gateway)
    first = client.responses.create(model=MODEL, input=ASK, tools=TOOLS, tool_choice="required",
                                    parallel_tool_calls=False, max_output_tokens=120,
                                    temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].status == "completed"
    # A one-shot stored response: no session names the call yet (a random chat-style id).
    assert calls[0].call_id.startswith("call_")
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    final = client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=TOOLS, tool_choice="none",
        max_output_tokens=40, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                "output": json.dumps({"temperature": 21, "sky": "sunny"})}])
    # tool_choice "none" is not the first turn's tools: a new session, the whole conversation.
    assert final.output_text and not [o for o in final.output if o.type == "function_call"]
    status, asked = _post(gateway, "/tokenize", {"model": MODEL, "messages": [
        {"role": "user", "content": ASK}]})
    assert status == 200
    assert final.usage.input_tokens > asked["count"] + 20  # the call and its result are in it
    client.responses.delete(final.id)
    client.responses.delete(first.id)
    assert wait_reserved_zero(roomy.address) == 0


def test_a_streamed_tool_call_sends_the_item_then_argument_deltas(gateway):
    client = openai_client(gateway)
    events = list(client.responses.create(
        model=MODEL, input=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=120, temperature=0, store=False, stream=True))
    added = [e for e in events if e.type == "response.output_item.added"
             and e.item.type == "function_call"]
    assert len(added) == 1 and added[0].item.name == "get_weather"
    arguments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert done[0].arguments == arguments
    jsonschema.validate(json.loads(arguments), WEATHER)
    assert events[-1].type == "response.completed"


def test_text_format_json_schema_is_enforced(gateway):
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"], "additionalProperties": False}
    answer = openai_client(gateway).responses.create(
        model=MODEL, input=FRANCE, max_output_tokens=60, temperature=0, store=False,
        text={"format": {"type": "json_schema", "name": "capital", "schema": schema}})
    jsonschema.validate(json.loads(answer.output_text), schema)


def test_refusals_are_400s_naming_the_responses_field_and_reserve_nothing(roomy, gateway):
    client = openai_client(gateway, max_retries=0)
    cases = [
        ({"input": FRANCE, "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
         "input[0].content[0]"),
        ({"input": FRANCE, "previous_response_id": "resp_nope"}, "previous_response_id"),
        ({"input": FRANCE, "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": FRANCE, "text": {"format": {"type": "json_schema", "name": "x",
                                               "schema": {"type": "nope"}}}},
         "text.format.schema"),
        ({"input": FRANCE, "max_tokens": 8}, "max_tokens"),
    ]
    for kwargs, param in cases:
        extra = {k: kwargs.pop(k) for k in ("max_tokens",) if k in kwargs}
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.create(model=MODEL, extra_body=extra, **kwargs)
        assert err.value.param == param, err.value
    assert scheduler_stub(roomy.address).GetBudget(
        scheduler_pb2.GetBudgetRequest(), timeout=5).total_reserved_bytes == 0


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_a_stored_response_frees_its_session(roomy, gateway, stream):
    from tests.e2e.gateway.test_gateway_e2e import ESSAY

    long = dict(model=MODEL, input=ESSAY, max_output_tokens=2000, temperature=0,
                extra_body={"min_tokens": 2000})
    if stream:
        events = openai_client(gateway).responses.create(stream=True, **long)
        for i, _event in enumerate(events):
            if i == 6:
                break
        # 2,000 tokens take minutes here: a zero within seconds is the cancel, not the end.
        assert reserved_bytes(roomy.address) > 0
        events.close()
    else:
        impatient = openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused",
                                  timeout=1.5, max_retries=0)
        with pytest.raises(openai.APITimeoutError):
            impatient.responses.create(**long)
    # The turn was cut short: its new session is closed, not left charged until its TTL.
    assert wait_reserved_zero(roomy.address, timeout_s=15) == 0


def test_a_streamed_follow_up_through_the_sdks_stream_helper(roomy, gateway):
    client = openai_client(gateway)
    first = client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=16,
                                    temperature=0)
    with client.responses.stream(model=MODEL, previous_response_id=first.id,
                                 input="And of Italy?", max_output_tokens=16,
                                 temperature=0) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert text and text == final.output_text
    assert final.model_extra["ortserve"]["session"]["turn"] == 1  # the follow-up opened it
    assert final.usage.input_tokens_details.cached_tokens > 0  # from the prefix cache
    client.responses.delete(final.id)
    assert wait_reserved_zero(roomy.address) == 0


def test_both_apis_through_the_direct_path(roomy, tmp_path_factory):
    import anthropic

    direct = start_gateway(tmp_path_factory, roomy.address, ("--direct-to-workers",))
    try:
        client = openai_client(direct)
        plain = client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=8,
                                        temperature=0, store=False)
        stored = client.responses.create(model=MODEL, input=FRANCE, max_output_tokens=8,
                                         temperature=0)
        # The same tokens whether stored (its prefix kept in the cache) or not.
        assert plain.output_text == stored.output_text
        assert stored.model_extra["ortserve"]["session"]["kept"] is False
        message = anthropic.Anthropic(base_url=f"http://{direct.address}", api_key="unused",
                                      timeout=120).messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": FRANCE}],
            extra_body={"temperature": 0})
        assert message.content[0].text == plain.output_text
        client.responses.delete(stored.id)
        assert wait_reserved_zero(roomy.address) == 0
    finally:
        stop_service(direct)
