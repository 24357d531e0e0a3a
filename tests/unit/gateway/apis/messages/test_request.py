"""The Messages API's translation and shapes (gateway/apis/messages/request.py, gateway/apis/messages/reply.py): pure."""

from __future__ import annotations

import json

import pytest

from gateway.apis.messages import reply as ar
from gateway.apis.messages import request as am
from gateway.reply.errors import HttpError
from gateway.reply.output_parts import CallArgumentsPiece, CallStartPiece, Reasoning, Text
from gateway.request.param_error import ParamError
from ortserve.v1 import types_pb2

TOOL = {"name": "get_weather", "description": "weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}


def parse(body: dict):
    return am.parse({"model": "m", "max_tokens": 9, **body})[0]


def test_system_blocks_tool_use_and_tool_results_become_chat_turns():
    parsed = parse({"system": [{"type": "text", "text": "Be brief."}], "tools": [TOOL],
                    "stop_sequences": ["END"], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": ""},
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
             "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "sunny"}]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "boom",
             "is_error": True},
            {"type": "text", "text": "Thanks"}]}]})
    messages = parsed.generate.chat.messages
    assert [(m.role, m.content) for m in messages] == [
        ("system", "Be brief."), ("user", "Weather?"), ("assistant", "Looking."),
        ("tool", "sunny"), ("tool", "Error: boom"), ("user", "Thanks")]
    call = messages[2].tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments_json)) == (
        "toolu_1", "get_weather", {"city": "Paris"})
    assert [m.tool_call_id for m in messages[3:5]] == ["toolu_1", "toolu_2"]
    assert list(parsed.generate.stop) == ["END"] and parsed.generate.max_new_tokens == 9
    assert parsed.tool_calls


@pytest.mark.parametrize(("choice", "function", "parallel", "allow_text"), [
    ({"type": "auto"}, "", True, True),
    ({"type": "any", "disable_parallel_tool_use": True}, "", False, False),
    ({"type": "tool", "name": "get_weather"}, "get_weather", False, False),
])
def test_tool_choice_is_enforced_as_chats(choice, function, parallel, allow_text):
    call = parse({"messages": [{"role": "user", "content": "x"}], "tools": [TOOL],
                  "tool_choice": choice}).generate.constraint.tool_call
    assert (call.function_name, call.parallel, call.allow_text) == (function, parallel,
                                                                    allow_text)


def test_tool_choice_none_offers_no_tools():
    parsed = parse({"messages": [{"role": "user", "content": "x"}], "tools": [TOOL],
                    "tool_choice": {"type": "none"}})
    assert not parsed.tool_calls and not parsed.generate.chat.tools


@pytest.mark.parametrize(("body", "param"), [
    ({"max_tokens": None}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stop": ["x"]}, "stop"),
    ({"stop_sequences": "x"}, "stop_sequences"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}]}]},
     "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ({"tools": [dict(TOOL, input_schema=[1])]}, "tools[0].input_schema"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "nope"}}, "tool_choice"),
    ({"thinking": {"type": "enabled", "budget_tokens": 9}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "enabled", "budget_tokens": 4, "display": "omitted"}},
     "thinking.display"),
    ({"thinking": {"type": "adaptive"}}, "thinking.type"),
    ({"thinking": {"type": "disabled", "budget_tokens": 4}}, "thinking.budget_tokens"),
    ({"thinking": {"type": "disabled"}, "chat_template_kwargs": {"enable_thinking": True}},
     "thinking"),
    ({"output_config": {"format": {"type": "json_schema"}, "task_budget": 1}},
     "output_config.task_budget"),
    ({"temprature": 0}, "temprature"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The"}]},
     "messages[1]"),
])
def test_refusals_name_the_messages_field(body, param):
    with pytest.raises(ParamError) as err:
        am.parse({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}],
                  **body})
    assert err.value.param == param, err.value


def test_error_body_is_anthropics_shape_naming_the_field():
    body = am.error_body(HttpError(400, "is not true", "invalid_request_error", "x", "stream"))
    assert body == {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": "stream: is not true"}}
    assert am.error_body(HttpError(429, "busy", "rate_limit_error", "budget_busy"))["error"][
        "type"] == "rate_limit_error"
    assert am.error_body(HttpError(503, "no worker", "x", "y"))["error"]["type"] == \
        "overloaded_error"


def test_stop_reasons_and_the_cap():
    fin = types_pb2.Finished
    assert ar.stop_reason(fin(finish_reason=types_pb2.EOS), False) == ("end_turn", None)
    assert ar.stop_reason(fin(finish_reason=types_pb2.EOS), True) == ("tool_use", None)
    assert ar.stop_reason(fin(finish_reason=types_pb2.STOP_SEQUENCE, stop_sequence="X"),
                          False) == ("stop_sequence", "X")
    # A cut call is no call: the limit is what ended it (the cap's, when capped).
    assert ar.stop_reason(fin(finish_reason=types_pb2.LENGTH), True) == ("max_tokens", None)


def test_usage_counts_cache_reads_apart_from_input():
    usage = ar.usage_dict(types_pb2.Usage(prompt_tokens=50, generated_tokens=4,
                                          cached_tokens=16))
    assert usage == {"input_tokens": 34, "output_tokens": 4, "cache_creation_input_tokens": 0,
                     "cache_read_input_tokens": 16}


def test_blocks_stream_their_events_and_end_as_the_whole_content():
    blocks = ar.ContentBlocks()
    events = blocks.add([Reasoning("hmm"), Text("Hi"), CallStartPiece(0, "toolu_1", "f"),
                         CallArgumentsPiece(0, '{"a":'), CallArgumentsPiece(0, " 1}")])
    events += blocks.close()
    assert [(kind, data.get("index")) for kind, data in events] == [
        ("content_block_start", 0), ("content_block_delta", 0), ("content_block_stop", 0),
        ("content_block_start", 1), ("content_block_delta", 1), ("content_block_stop", 1),
        ("content_block_start", 2), ("content_block_delta", 2), ("content_block_delta", 2),
        ("content_block_stop", 2)]
    assert events[1][1]["delta"] == {"type": "thinking_delta", "thinking": "hmm"}
    assert events[7][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"a":'}
    assert blocks.blocks == [{"type": "thinking", "thinking": "hmm", "signature": ""},
                             {"type": "text", "text": "Hi"},
                             {"type": "tool_use", "id": "toolu_1", "name": "f",
                              "input": {"a": 1}}]


def test_thinking_disabled_switches_the_template_off_and_enabled_says_what_the_budget_is():
    messages = [{"role": "user", "content": "x"}]
    parsed, _, kind = am.parse({"model": "m", "max_tokens": 9, "messages": messages,
                                "thinking": {"type": "disabled"}})
    assert kind == "disabled"
    assert json.loads(parsed.generate.chat.template_kwargs_json) == {"enable_thinking": False}
    parsed, _, kind = am.parse({"model": "m", "max_tokens": 9, "messages": messages,
                                "thinking": {"type": "enabled", "budget_tokens": 4}})
    assert kind == "enabled" and not parsed.generate.chat.template_kwargs_json
    assert "not a separate limit" in parsed.resolved["thinking.budget_tokens"]
    # The worker's refusal of a template without the switch names the Messages field.
    assert am.chat_param("chat_template_kwargs.enable_thinking") == "thinking"
