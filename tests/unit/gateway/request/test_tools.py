"""The gateway's tools: OpenAI's tools / tool_choice -> the proto, refusals naming the
parameter, and the output as OpenAI's tool_calls (whole and streamed deltas)."""

from __future__ import annotations

import json

import pytest

from gateway.request.tools import ToolCallChoice
from gateway.request.translate import ParamError, parse_request
from ortserve.output import tool_calls

MODEL = "smollm2-135m-instruct-fp32"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]


def chat(**kw) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "tools": TOOLS, **kw}


@pytest.mark.parametrize("choice,name,allow_text", [
    (None, "", True), ("auto", "", True), ("required", "", False),
    ({"type": "function", "function": {"name": "get_time"}}, "get_time", False),
])
def test_tool_choice_becomes_the_tool_call_constraint(choice, name, allow_text):
    parsed = parse_request("chat", chat(tool_choice=choice, parallel_tool_calls=False))
    req = parsed.generate
    assert parsed.tool_calls
    assert [t.name for t in req.chat.tools] == ["get_weather", "get_time"]
    assert json.loads(req.chat.tools[0].parameters_json) == WEATHER
    assert req.chat.tools[1].parameters_json == ""
    tc = req.constraint.tool_call
    assert (tc.function_name, tc.allow_text, tc.parallel) == (name, allow_text, False)
    assert parse_request("chat", chat(tool_choice="required")).generate.constraint.tool_call.parallel
    named = {"type": "function", "function": {"name": "get_time"}}  # one call of it
    assert not parse_request("chat", chat(tool_choice=named)).generate.constraint.tool_call.parallel


def test_tool_choice_none_offers_nothing_and_parses_nothing():
    parsed = parse_request("chat", chat(tool_choice="none", response_format={"type": "json_object"}))
    assert not parsed.tool_calls and not parsed.generate.chat.tools
    assert parsed.generate.constraint.json_object


def test_response_format_beside_tools_under_auto_is_calls_or_the_structured_answer():
    # An agent with tools and an output type (the OpenAI Agents SDK) sends both;
    # this was a 400 "cannot be combined with tools".
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    parsed = parse_request("chat", chat(response_format={
        "type": "json_schema", "json_schema": {"name": "c", "schema": schema}}))
    choice = parsed.generate.constraint.tool_call
    assert parsed.tool_calls and choice.allow_text
    assert json.loads(choice.answer_json_schema) == schema
    any_object = parse_request("chat", chat(response_format={"type": "json_object"}))
    assert json.loads(any_object.generate.constraint.tool_call.answer_json_schema) == \
        {"type": "object"}
    plain = parse_request("chat", chat(response_format={"type": "text"}))
    assert plain.generate.constraint.tool_call.answer_json_schema == ""


@pytest.mark.parametrize("kw,param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
     "tools[0].function.parameters"),
    ({"tools": [TOOLS[1], {"type": "function", "function": {"name": "a b"}}]},
     "tools[1].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]},
     "tools[0].function.extra"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": {"name": "f"}}, "tools"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"tools": [], "tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"tools": [], "tool_choice": "sometimes"}, "tool_choice"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"response_format": {"type": "json_object"}, "tool_choice": "required"}, "response_format"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
])
def test_refusals_name_the_parameter(kw, param):
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(**kw))
    assert err.value.param == param


def test_deprecated_functions_name_their_replacement():
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(functions=[{"name": "f"}]))
    assert "`tools`" in err.value.message and err.value.code == "unsupported_parameter"


def test_a_round_trip_history_travels_in_the_proto():
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "21 C"}]
    req = parse_request("chat", chat(messages=messages)).generate
    turn = req.chat.messages[1]
    assert (turn.role, turn.content, turn.tool_calls[0].id, turn.tool_calls[0].name,
            turn.tool_calls[0].arguments_json) == ("assistant", "", "call_1", "get_weather",
                                                   '{"city":"Paris"}')
    assert (req.chat.messages[2].role, req.chat.messages[2].tool_call_id) == ("tool", "call_1")
    bad = [*messages[:2], {**messages[1], "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{nope"}}]}]
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(messages=bad))
    assert err.value.param == "messages[2].tool_calls[0].function.arguments"


def test_output_becomes_tool_calls_whole_and_streamed():
    text = (tool_calls.call_text("get_weather", '{"city":"Paris"}') + "\n"
            + tool_calls.call_text("get_time", "{}"))
    message = ToolCallChoice().message(text)
    assert message["content"] is None
    calls = message["tool_calls"]
    assert [(c["type"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("function", "get_weather", '{"city":"Paris"}'), ("function", "get_time", "{}")]
    assert all(c["id"].startswith("call_") for c in calls) and calls[0]["id"] != calls[1]["id"]

    stream = ToolCallChoice()
    deltas = [d for i in range(0, len(text), 3) for d in stream.deltas(text[i:i + 3])]
    deltas += stream.deltas("", final=True)
    assert all("content" not in d for d in deltas)
    pieces = [d["tool_calls"][0] for d in deltas]
    assert pieces[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert pieces[0]["id"].startswith("call_") and pieces[0]["type"] == "function"
    assert all("name" not in p["function"] for p in pieces[1:] if "id" not in p)
    args = ["".join(p["function"]["arguments"] for p in pieces if p["index"] == i) for i in (0, 1)]
    assert args == ['{"city":"Paris"}', "{}"] and stream.called


def test_text_without_calls_stays_content():
    assert ToolCallChoice().message("Hello <b>") == {"role": "assistant", "content": "Hello <b>"}
