"""Tool calls: the grammar built from the tools (over the real SmolLM2 tokenizer, which
tiny-llama carries), the rules on tools and turns, the output parser (whole and
streamed), the chat template's tools (its own, or the fallback section)."""

from __future__ import annotations

import json

import pytest

from ortserve.output import tool_calls
from ortserve.output.tool_output import CallArguments, CallStart, TextEvent, ToolCallParser, parse
from ortserve.rules import request_rules
from ortserve.status.errors import InvalidField
from ortserve.v1 import types_pb2
from tests.unit.worker_service.core.test_tokenizer import template_folder
from worker_service import prompt_tokens
from worker_service.core.token_mask import ConstraintCompiler
from worker_service.core.tokenizer import Tokenizer

EOS = 2
WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [types_pb2.Tool(name="get_weather", description="Weather now",
                        parameters_json=json.dumps(WEATHER)),
         types_pb2.Tool(name="get_time")]  # no parameters: exactly {}
PARIS = tool_calls.call_text("get_weather", '{"city":"Paris","unit":"c"}')
TIME = tool_calls.call_text("get_time", "{}")


@pytest.fixture(scope="module")
def tokenizer(tiny_dir) -> Tokenizer:
    return Tokenizer(tiny_dir)


@pytest.fixture(scope="module")
def compiler(tokenizer) -> ConstraintCompiler:
    return ConstraintCompiler(tokenizer.to_json, tokenizer.vocab_size, (EOS,))


def request(tools=TOOLS, **choice) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(
        chat=types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(role="user", content="hi")],
                                    tools=tools),
        constraint=types_pb2.Constraint(tool_call=types_pb2.ToolCallConstraint(**choice)))


def outcome(compiler, tokenizer, req, text: str) -> str:
    """"whole" (a complete match), "prefix" (may go on) or "refused"."""
    request_rules.generate_request(req)
    constraint = compiler.compile(request_rules.constraint_spec(req))
    for token in tokenizer._tok.encode(text, add_special_tokens=False).ids:
        if not constraint.allowed()[token]:
            return "refused"
        constraint.advance(token)
    return "whole" if constraint.satisfied else "prefix"


@pytest.mark.parametrize("choice,expected", [
    # text, one call of each tool, a bad argument, two calls, text then a call
    ({}, ["refused", "whole", "whole", "refused", "refused", "refused"]),
    ({"parallel": True}, ["refused", "whole", "whole", "refused", "whole", "refused"]),
    ({"function_name": "get_time"}, ["refused", "refused", "whole", "refused", "refused",
                                     "refused"]),
    ({"allow_text": True}, ["whole", "whole", "whole", "refused", "refused", "whole"]),
    ({"allow_text": True, "parallel": True}, ["whole", "whole", "whole", "refused", "whole",
                                              "whole"]),
])
def test_the_grammar_allows_exactly_the_chosen_calls(compiler, tokenizer, choice, expected):
    bad = tool_calls.call_text("get_weather", '{"city":"Paris","unit":"k"}')
    texts = ["It is sunny.", PARIS, TIME, bad, PARIS + "\n" + TIME, "Let me look. " + TIME]
    assert [outcome(compiler, tokenizer, request(**choice), t) for t in texts] == expected


CITY = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
        "additionalProperties": False}


@pytest.mark.parametrize("parallel", [False, True])
def test_an_answer_schema_beside_tools_allows_the_calls_or_that_answer_only(
        compiler, tokenizer, parallel):
    # tools with response_format (tool_choice auto): the calls, or the structured answer;
    # no free text, no text before a call, no answer off the schema.
    req = request(allow_text=True, parallel=parallel, answer_json_schema=json.dumps(CITY))
    texts = ['{"city":"Paris"}', PARIS, "It is sunny.", '{"town":"Paris"}',
             "Let me look. " + TIME, PARIS + "\n" + TIME]
    assert [outcome(compiler, tokenizer, req, t) for t in texts] == \
        ["whole", "whole", "refused", "refused", "refused", "whole" if parallel else "refused"]


@pytest.mark.parametrize("mutate,why", [
    (lambda c: setattr(c, "allow_text", False), "needs allow_text"),
    (lambda c: setattr(c, "answer_json_schema", '{"type": "nope"}'), "cannot compile"),
])
def test_a_bad_answer_schema_is_refused_naming_it(mutate, why):
    req = request(allow_text=True, answer_json_schema=json.dumps(CITY))
    mutate(req.constraint.tool_call)
    with pytest.raises(InvalidField) as err:
        request_rules.constraint_spec(req)
    assert err.value.field == "constraint.tool_call.answer_json_schema"
    assert why in str(err.value)


def test_an_answer_schema_is_refused_in_a_format_whose_calls_are_json_too():
    req = request(allow_text=True, answer_json_schema=json.dumps(CITY))
    with pytest.raises(InvalidField, match="llama3_json tool-call format"):
        request_rules.constraint_spec(req, tool_format="llama3_json")


def test_a_single_call_completes_the_constraint(compiler, tokenizer):
    req = request()
    constraint = compiler.compile(request_rules.constraint_spec(req))
    for token in tokenizer._tok.encode(PARIS, add_special_tokens=False).ids:
        constraint.advance(token)
    assert constraint.complete  # nothing may follow: the sequence ends at once


@pytest.mark.parametrize("mutate,field", [
    (lambda r: r.chat.tools.add(name="get_weather"), "chat.tools[2].name"),
    (lambda r: r.chat.tools.add(name="bad name"), "chat.tools[2].name"),
    (lambda r: r.chat.tools.add(name="x", parameters_json='{"type": "nope"}'),
     "chat.tools[2].parameters_json"),
    (lambda r: r.chat.tools.add(name="x", parameters_json='{"type": "string"}'),
     "chat.tools[2].parameters_json"),
    (lambda r: setattr(r.constraint.tool_call, "function_name", "nope"),
     "constraint.tool_call.function_name"),
    (lambda r: r.chat.ClearField("tools"), "constraint.tool_call"),
    (lambda r: r.chat.messages[0].tool_calls.add(name="get_time", arguments_json="{}"),
     "chat.messages[0].tool_calls"),
    (lambda r: r.chat.messages.add(role="assistant").tool_calls.add(name="f", arguments_json="[]"),
     "chat.messages[1].tool_calls[0].arguments_json"),
    (lambda r: setattr(r.chat.messages[0], "tool_call_id", "call_1"),
     "chat.messages[0].tool_call_id"),
])
def test_bad_tools_and_turns_are_refused_naming_the_field(mutate, field):
    req = request()
    mutate(req)
    with pytest.raises(InvalidField) as err:
        request_rules.generate_request(req, "request.")
    assert err.value.field == "request." + field
    assert str(err.value).startswith(f"request.{field}: ")


def test_the_parser_streams_names_first_then_argument_fragments():
    text = "Let me check. " + PARIS + "\n" + TIME
    parser = ToolCallParser()
    events = [e for ch in text for e in parser.push(ch)] + parser.close()
    assert "".join(e.text for e in events if isinstance(e, TextEvent)) == "Let me check. "
    starts = [e for e in events if isinstance(e, CallStart)]
    assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "get_time")]
    first_args = events.index(next(e for e in events if isinstance(e, CallArguments)))
    assert events.index(starts[0]) < first_args  # the name before any argument
    args = ["".join(e.fragment for e in events if isinstance(e, CallArguments) and e.index == i)
            for i in (0, 1)]
    assert args == ['{"city":"Paris","unit":"c"}', "{}"]
    assert parse(text) == ("Let me check. ", parser.calls)


def test_the_parser_keeps_what_is_not_a_call_as_text_and_reports_a_cut_call():
    assert parse("a <tool_ b") == ("a <tool_ b", [])
    assert parse("<tool_call>\nnot json\n</tool_call>") == ("<tool_call>\nnot json\n</tool_call>", [])
    text, calls = parse('<tool_call>\n{"arguments": {"a": 1}, "name": "f"}\n</tool_call>')
    assert (text, calls[0].name, calls[0].arguments, calls[0].complete) == ("", "f", '{"a":1}', True)
    text, calls = parse('<tool_call>\n{"name": "f", "arguments": {"a": "}')
    assert calls[0].arguments == '{"a": "}' and not calls[0].complete


def test_a_template_without_tools_gets_the_fallback_section_and_calls_as_text(tokenizer):
    chat = types_pb2.ChatMessages(tools=TOOLS[:1], messages=[
        types_pb2.ChatMessage(role="user", content="Weather in Paris?"),
        types_pb2.ChatMessage(role="assistant", tool_calls=[types_pb2.ToolCall(
            id="call_1", name="get_weather", arguments_json='{"city": "Paris", "unit": "c"}')]),
        types_pb2.ChatMessage(role="tool", tool_call_id="call_1", content="21 C")])
    text = tokenizer.render_chat(prompt_tokens.chat_turns(chat), prompt_tokens.chat_tools(chat))
    assert not tokenizer.chat_template.supports_tools
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert '"name": "get_weather"' in text and "<tools>" in text
    assert "<|im_start|>assistant\n" + PARIS + "<|im_end|>" in text  # as the model writes it
    assert "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>" in text


def test_a_template_with_tools_renders_them_itself(tmp_path):
    tok = template_folder(tmp_path, (
        "{% for t in tools %}[{{ t.function.name }}:{{ t.function.parameters | tojson }}]"
        "{% endfor %}{% for m in messages %}<{{ m.role }}|{{ m.content }}"
        "{% for c in m.tool_calls or [] %}|{{ c.function.name }}{{ c.function.arguments.a }}"
        "{% endfor %}{{ m.tool_call_id or '' }}>{% endfor %}"))
    chat = types_pb2.ChatMessages(tools=[TOOLS[1]], messages=[
        types_pb2.ChatMessage(role="assistant", tool_calls=[
            types_pb2.ToolCall(id="c1", name="f", arguments_json='{"a": 7}')]),
        types_pb2.ChatMessage(role="tool", tool_call_id="c1", content="ok")])
    assert tok.chat_template.supports_tools
    text = tok.render_chat(prompt_tokens.chat_turns(chat), prompt_tokens.chat_tools(chat))
    assert text == ('[get_time:{"type": "object", "properties": {}, "additionalProperties": '
                    'false}]<assistant||f7><tool|okc1>')
