"""Llama 3.1 JSON and Mistral tool calls: the grammar that enforces each, and its parser."""

from __future__ import annotations

import json

import pytest

from ortserve.output import constraint_grammar, tool_formats
from ortserve.output.tool_output import CallArguments, CallStart, TextEvent
from ortserve.v1 import types_pb2

WEATHER = types_pb2.Tool(name="get_weather", parameters_json=json.dumps(
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}))
NOW = types_pb2.Tool(name="now")


def feed(fmt, chunks):
    parser = tool_formats.parser(fmt)
    events = [e for c in chunks for e in parser.push(c)] + parser.close()
    return events, parser.calls


@pytest.mark.parametrize("source, fmt", [
    ("{{ '<|python_tag|>' }}{{ tools }}", "llama3_json"),
    ("[AVAILABLE_TOOLS]{{ tools }}[/AVAILABLE_TOOLS][TOOL_CALLS]", "mistral"),
    ("<tool_call>{{ tools }}</tool_call>", "hermes"),
    ("{{ messages }}", "hermes"),
])
def test_the_format_comes_from_the_template(source, fmt):
    assert tool_formats.format_of_template(source) == fmt


@pytest.mark.parametrize("fmt", ["llama3_json", "mistral"])
@pytest.mark.parametrize("kw", [{}, {"parallel": True}, {"function_name": "now"},
                                {"allow_text": True, "parallel": True}])
def test_every_grammar_compiles(fmt, kw):
    grammar = tool_formats.grammar(fmt, [WEATHER, NOW], **kw)
    constraint_grammar.check(constraint_grammar.ConstraintSpec("grammar", grammar))
    if "function_name" in kw:
        assert "get_weather" not in grammar


@pytest.mark.parametrize("fmt, output", [
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "now", "parameters": {}}'),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
                    '; {"name": "now", "parameters": {}}'),
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "now", "arguments": {}}]'),
])
def test_calls_are_parsed_at_any_split(fmt, output):
    for size in (1, 3, len(output)):
        events, calls = feed(fmt, [output[i:i + size] for i in range(0, len(output), size)])
        assert [(c.name, json.loads(c.arguments), c.complete) for c in calls] == [
            ("get_weather", {"city": "Paris"}, True), ("now", {}, True)]
        assert [type(e) for e in events] == [CallStart, CallArguments] * 2


@pytest.mark.parametrize("fmt", ["llama3_json", "mistral"])
def test_text_passes_as_it_comes_and_a_cut_call_is_incomplete(fmt):
    parser = tool_formats.parser(fmt)
    assert parser.push("  ") == [] and parser.push("Hello") == [TextEvent("  Hello")]
    assert parser.push(" there") == [TextEvent(" there")] and parser.close() == []
    cut = ('{"name": "get_weather", "parameters": {"ci' if fmt == "llama3_json"
           else '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"ci')
    _, calls = feed(fmt, [cut])
    assert calls[0].name == "get_weather" and not calls[0].complete
    assert calls[0].arguments == '{"ci'


def test_an_output_that_only_looks_like_a_call_stays_text():
    events, calls = feed("llama3_json", ["{not json at all"])
    assert not calls and events == [TextEvent("{not json at all")]
