"""End to end: the anthropic client's Messages API -> gateway -> scheduler -> worker (real
processes, the real SmolLM2): plain, streamed, a tool round trip, stop sequences, and errors
in Anthropic's shape naming the field."""

from __future__ import annotations

import anthropic
import jsonschema
import pytest

from devtools.cluster import stop_service
from tests.e2e.gateway.test_gateway_e2e import FRANCE, MODEL, start_gateway, wait_reserved_zero
from tests.e2e.gateway.test_gateway_sampling_e2e import _post
from tests.e2e.gateway.test_tools_e2e import WEATHER

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TOOLS = [{"name": "get_weather", "description": "The current weather in a city",
          "input_schema": WEATHER}]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]
# The Messages API's sampling keys are gone from the current SDK's signature; the gateway
# takes temperature (Anthropic's default 1.0) as older versions of the API did.
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address)
    yield service
    stop_service(service)


def client(gateway, **kw) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://{gateway.address}", api_key="unused",
                               timeout=120, **kw)


def test_plain_and_streamed_give_the_same_text_and_usage(roomy, gateway):
    raw = client(gateway).messages.with_raw_response.create(
        model=MODEL, max_tokens=24, extra_body=GREEDY, system="Answer briefly.",
        messages=[{"role": "user", "content": FRANCE}])
    plain = raw.parse()
    assert raw.headers["x-ortserve-decision"] == "ADMITTED"
    assert plain.type == "message" and plain.role == "assistant" and plain.model == MODEL
    assert [b.type for b in plain.content] == ["text"] and plain.content[0].text
    assert plain.stop_reason in ("end_turn", "max_tokens")
    assert plain.usage.input_tokens + plain.usage.cache_read_input_tokens > 10
    assert 0 < plain.usage.output_tokens <= 24

    kinds = []
    with client(gateway).messages.stream(
            model=MODEL, max_tokens=24, extra_body=GREEDY, system="Answer briefly.",
            messages=[{"role": "user", "content": FRANCE}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == plain.content[0].text
    assert final.stop_reason == plain.stop_reason
    assert final.usage.output_tokens == plain.usage.output_tokens

    events = list(client(gateway).messages.create(
        model=MODEL, max_tokens=24, extra_body=GREEDY, stream=True,
        messages=[{"role": "user", "content": FRANCE}]))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"}
    assert events[0].message.model_extra["ortserve"]["decision"] == "ADMITTED"
    assert wait_reserved_zero(roomy.address) == 0


def test_count_tokens_counts_the_prompt_as_the_answer_does(gateway):
    body = dict(model=MODEL, system="Answer briefly.", tools=TOOLS, messages=ASK)
    counted = client(gateway).messages.count_tokens(**body)
    answer = client(gateway).messages.create(max_tokens=4, extra_body=GREEDY, **body)
    assert counted.input_tokens == \
        answer.usage.input_tokens + answer.usage.cache_read_input_tokens > 50


def test_a_tool_round_trip_ends_in_an_answer(roomy, gateway):
    first = client(gateway).messages.create(
        model=MODEL, max_tokens=120, extra_body=GREEDY, messages=ASK, tools=TOOLS,
        tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use"
    uses = [b for b in first.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    jsonschema.validate(uses[0].input, WEATHER)
    final = client(gateway).messages.create(
        model=MODEL, max_tokens=40, extra_body=GREEDY, tools=TOOLS, tool_choice={"type": "none"},
        messages=[*ASK, {"role": "assistant", "content": first.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                "content": "21 degrees and sunny"}]}])
    assert [b.type for b in final.content] == ["text"] and final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens")
    # tool_choice "none" offers no tools, but the call and its result are in the prompt.
    status, asked = _post(gateway, "/tokenize", {"model": MODEL, "messages": ASK})
    assert status == 200
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens > asked["count"] + 20
    assert wait_reserved_zero(roomy.address) == 0


def test_a_streamed_tool_use_sends_input_json_deltas(gateway):
    with client(gateway).messages.stream(
            model=MODEL, max_tokens=120, extra_body=GREEDY, messages=ASK, tools=TOOLS,
            tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e for e in events if e.type == "content_block_delta"
              and e.delta.type == "input_json_delta"]
    assert deltas and final.stop_reason == "tool_use"
    jsonschema.validate(final.content[-1].input, WEATHER)


def test_a_stop_sequence_is_the_stop_reason(gateway):
    answer = client(gateway).messages.create(
        model=MODEL, max_tokens=40, extra_body=GREEDY, stop_sequences=["Paris"],
        messages=[{"role": "user", "content": FRANCE}])
    assert answer.stop_reason == "stop_sequence" and answer.stop_sequence == "Paris"
    assert "Paris" not in answer.content[0].text


@pytest.mark.parametrize(("body", "field"), [
    ({"messages": [{"role": "user", "content": "Hi"}]}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 8, "stop": ["x"], "messages": [{"role": "user", "content": "Hi"}]}, "stop"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}],
      "tools": [{"name": "f", "input_schema": {"type": "nope"}}], "tool_choice": {"type": "any"}},
     "tools[0].input_schema"),
])
def test_bad_input_is_a_400_in_anthropics_shape_naming_the_field(gateway, body, field):
    with pytest.raises(anthropic.BadRequestError) as err:
        client(gateway, max_retries=0).post("/v1/messages", cast_to=object,
                                            body={"model": MODEL, **body})
    error = err.value.body
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert error["error"]["message"].startswith(field + ":"), error


def test_closing_the_stream_mid_way_frees_the_lease(roomy, gateway):
    from tests.e2e.conftest import reserved_bytes
    from tests.e2e.gateway.test_gateway_e2e import ESSAY

    stream = client(gateway).messages.create(
        model=MODEL, max_tokens=2000, stream=True, messages=[{"role": "user", "content": ESSAY}],
        extra_body={"temperature": 0, "min_tokens": 2000})
    for i, _event in enumerate(stream):
        if i == 4:
            break
    assert reserved_bytes(roomy.address) > 0
    stream.close()
    assert wait_reserved_zero(roomy.address) == 0


def test_thinking_is_refused_by_a_model_whose_template_cannot_honour_it(roomy, gateway):
    # SmolLM2's template writes no reasoning and has no enable_thinking switch.
    ask = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": FRANCE}]}
    for thinking, why in (({"type": "enabled", "budget_tokens": 4}, "writes no reasoning"),
                          ({"type": "disabled"}, "does not read 'enable_thinking'")):
        with pytest.raises(anthropic.BadRequestError) as err:
            client(gateway, max_retries=0).messages.create(**ask, thinking=thinking)
        message = err.value.body["error"]["message"]
        assert message.startswith("thinking: ") and why in message, message
        if thinking["type"] == "enabled":  # its remedy works here: `disabled` is refused too
            assert message.endswith("leave `thinking` out: its answers have no thinking "
                                    "blocks either way"), message
    assert wait_reserved_zero(roomy.address) == 0  # the admitted one let its lease go
