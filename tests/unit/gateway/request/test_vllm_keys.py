"""vLLM's extra_body keys -> the GenerateRequest (gateway/request/vllm_keys.py), with no server."""

from __future__ import annotations

import json

import pytest

from gateway.request.translate import ParamError, parse_request

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def chat(**kw):
    return {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **kw}


@pytest.mark.parametrize("body, kind, text", [
    ({"guided_json": SCHEMA}, "json_schema", json.dumps(SCHEMA)),
    ({"guided_json": json.dumps(SCHEMA)}, "json_schema", json.dumps(SCHEMA)),
    ({"guided_regex": "[0-9]+"}, "regex", "[0-9]+"),
    ({"guided_grammar": 'start: "yes" | "no"'}, "grammar", 'start: "yes" | "no"'),
    ({"guided_choice": ["yes", "no", 'say "hi"']}, "grammar", 'start: "yes" | "no" | "say \\"hi\\""\n'),
    ({"structured_outputs": {"json": SCHEMA}}, "json_schema", json.dumps(SCHEMA)),
    ({"structured_outputs": {"regex": "a|b"}}, "regex", "a|b"),
    ({"structured_outputs": {"choice": ["x"]}}, "grammar", 'start: "x"\n'),
    ({"structured_outputs": {"grammar": 'start: "z"'}}, "grammar", 'start: "z"'),
    ({"structured_outputs": {"json_object": True}}, "json_object", True),
])
def test_structured_output_keys_become_the_constraint(body, kind, text):
    for endpoint, base in (("chat", chat()), ("completion", {"model": "m", "prompt": "Hi"})):
        req = parse_request(endpoint, {**base, **body}).generate
        assert req.constraint.WhichOneof("kind") == kind
        assert getattr(req.constraint, kind) == text


@pytest.mark.parametrize("body, param, words", [
    ({"guided_regex": "(unclosed"}, "guided_regex", "cannot compile"),
    ({"guided_grammar": "no start rule here"}, "guided_grammar", "cannot compile"),
    ({"guided_json": "{not json"}, "guided_json", "not JSON"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
    ({"guided_choice": ["a", 1]}, "guided_choice", "non-empty list"),
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "cannot be combined"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex",
     "response_format"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ({"structured_outputs": {"structural_tag": "{}"}}, "structured_outputs.structural_tag",
     "not supported"),
    ({"structured_outputs": {"jsn": {}}}, "structured_outputs.jsn", "not a structured_outputs key"),
    ({"skip_special_tokens": False}, "skip_special_tokens", "always leaves special tokens out"),
    ({"priority": "high"}, "priority", "not an integer"),
    ({"stop_token_ids": [1, -2]}, "stop_token_ids", "token ids"),
    ({"stop_token_ids": list(range(17))}, "stop_token_ids", "more than"),
    ({"ignore_eos": "yes"}, "ignore_eos", "true or false"),
    ({"stream": True, "stream_options": {"continuous_usage_stats": True}},
     "stream_options.continuous_usage_stats", "include_usage"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_key(body, param, words):
    with pytest.raises(ParamError) as info:
        parse_request("chat", chat(**body))
    assert info.value.param == param and words in info.value.message


def test_guided_output_with_tools_is_refused_naming_the_key():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(ParamError) as info:
        parse_request("chat", chat(tools=tools, guided_regex="a"))
    assert info.value.param == "guided_regex" and "tools" in info.value.message


def test_generation_and_output_keys_are_carried():
    parsed = parse_request("chat", chat(ignore_eos=True, stop_token_ids=[2, 7], priority=0,
                                        skip_special_tokens=True, include_stop_str_in_output=True,
                                        stream=True, stream_options={
                                            "include_usage": True, "continuous_usage_stats": True}))
    assert parsed.generate.ignore_eos and list(parsed.generate.stop_token_ids) == [2, 7]
    assert parsed.include_stop_str and parsed.continuous_usage and parsed.include_usage
    plain = parse_request("chat", chat())
    assert not plain.generate.ignore_eos and not plain.include_stop_str
    assert not plain.continuous_usage


def test_chat_template_kwargs_and_reasoning_effort_become_template_variables():
    req = parse_request("chat", chat(chat_template_kwargs={"enable_thinking": False},
                                     reasoning_effort="low")).generate
    assert json.loads(req.chat.template_kwargs_json) == {"enable_thinking": False,
                                                         "reasoning_effort": "low"}
    assert not parse_request("chat", chat()).generate.chat.template_kwargs_json
    for body, param in (({"chat_template_kwargs": ["x"]}, "chat_template_kwargs"),
                        ({"reasoning_effort": 3}, "reasoning_effort"),
                        ({"reasoning_effort": "low",
                          "chat_template_kwargs": {"reasoning_effort": "high"}}, "reasoning_effort")):
        with pytest.raises(ParamError) as info:
            parse_request("chat", chat(**body))
        assert info.value.param == param
    with pytest.raises(ParamError) as info:  # completions have no template
        parse_request("completion", {"model": "m", "prompt": "x", "reasoning_effort": "low"})
    assert info.value.param == "reasoning_effort"


def test_latency_goals_are_carried_and_a_bad_one_is_refused_naming_the_key():
    parsed = parse_request("completion", {"model": "m", "prompt": "Hi", "max_itl_ms": 250,
                                          "max_ttft_ms": 2_000})
    assert parsed.generate.max_itl_ms == 250 and parsed.generate.max_ttft_ms == 2_000
    assert parse_request("chat", chat()).generate.max_itl_ms == 0  # the server's default
    for bad in (-1, 2.5, "fast", 2**32):
        with pytest.raises(ParamError) as info:
            parse_request("chat", chat(max_ttft_ms=bad))
        assert info.value.param == "max_ttft_ms" and "milliseconds" in info.value.message
