"""Tool calls: the output format, the rules on a chat's tools, and the grammar that enforces calls.

The one format every edge agrees on (the Hermes / Qwen convention, which many
instruct models were trained on):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

several calls one after another, separated by a newline. The chat template
renders offered tools and past calls in it when it has no tools support of its
own (worker_service/core/chat_template.py), `grammar` enforces it
(Constraint.tool_call), and ortserve/output/tool_output.py parses it back.

Pure: no grpc or protobuf; a tool is anything with `name`, `description` and
`parameters_json` (types.proto's Tool).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Protocol

from ortserve.output import constraint_grammar as constraints
from ortserve.status.errors import InvalidField, quoted

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
MAX_TOOLS = 128
NAME_PATTERN = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # OpenAI's rule for function names
# A function without parameters takes none: its arguments are exactly {}.
NO_PARAMETERS = '{"type": "object", "properties": {}, "additionalProperties": false}'
# The auto grammar's text branch: any text that never opens a call (a call it opens is
# enforced by the call branch, so a malformed call cannot slip out as "text").
_TEXT_WITHOUT_CALLS = r"/(?s:.+)/ & ~/(?s:.*<tool_call>.*)/"


class ToolLike(Protocol):
    name: str
    description: str
    parameters_json: str


def call_text(name: str, arguments_json: str) -> str:
    """One call as the model writes it (and as the fallback template renders a past one)."""
    return f'{OPEN_TAG}\n{{"name": {json.dumps(name)}, "arguments": {arguments_json}}}\n{CLOSE_TAG}'


def parameters_schema(tool: ToolLike) -> str:
    return tool.parameters_json if tool.parameters_json.strip() else NO_PARAMETERS


def check_tools(tools: Sequence[ToolLike], prefix: str = "") -> None:
    """At most MAX_TOOLS, names valid and unique, every parameters schema compiles
    (llguidance, no vocabulary): refused before anything is counted or reserved."""
    if len(tools) > MAX_TOOLS:
        raise InvalidField(prefix + "chat.tools", f"has {len(tools):,} tools, more than the "
                           f"{MAX_TOOLS} allowed; offer fewer", count=len(tools), limit=MAX_TOOLS)
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"{prefix}chat.tools[{i}]"
        if not NAME_PATTERN.fullmatch(tool.name):
            raise InvalidField(where + ".name", f"{quoted(tool.name)} is not a function name: "
                               "use 1 to 64 of a-z, A-Z, 0-9, _ and -")
        if tool.name in seen:
            raise InvalidField(where + ".name", f"{quoted(tool.name)} is offered twice; give "
                               "each function one entry")
        seen.add(tool.name)
        error = _schema_error(parameters_schema(tool))
        if error:
            raise InvalidField(where + ".parameters_json", error)


def _schema_error(text: str) -> str:
    error = constraints.schema_error(text)
    if error:
        return error
    schema = json.loads(text)
    if not isinstance(schema, dict) or schema.get("type", "object") != "object":
        return "is not an object schema: a function's arguments are one JSON object; send " \
               "{\"type\": \"object\", \"properties\": {...}}"
    return ""


def check_turn(role: str, tool_calls: Sequence[Any], tool_call_id: str, where: str) -> None:
    """Tool calls only on assistant turns, each with a name and JSON-object arguments (the
    template renders them as objects); a tool_call_id only on tool turns."""
    if tool_calls and role != "assistant":
        raise InvalidField(where + ".tool_calls", f"is set on a {quoted(role)} turn; only "
                           "assistant turns carry tool calls")
    if tool_call_id and role != "tool":
        raise InvalidField(where + ".tool_call_id", f"is set on a {quoted(role)} turn; only "
                           "tool turns answer a call")
    for j, call in enumerate(tool_calls):
        if not call.name:
            raise InvalidField(f"{where}.tool_calls[{j}].name", "is empty: name the function")
        try:
            arguments = json.loads(call.arguments_json or "{}")
        except ValueError as exc:
            arguments, why = None, f"is not JSON ({exc})"
        else:
            why = "is not a JSON object"
        if not isinstance(arguments, dict):
            raise InvalidField(f"{where}.tool_calls[{j}].arguments_json", f"{why}; send the "
                               "call's arguments as returned, a JSON object")


def check_choice(tools: Sequence[ToolLike], function_name: str, prefix: str = "") -> None:
    """A tool_call constraint needs tools to call, and a named function among them."""
    field = prefix + "constraint.tool_call"
    if not tools:
        raise InvalidField(field, "needs functions to call: send them in chat.tools (a chat "
                           "prompt), or leave the constraint unset")
    names = [t.name for t in tools]
    if function_name and function_name not in names:
        raise InvalidField(field + ".function_name", f"{quoted(function_name)} is not one of "
                           f"chat.tools ({', '.join(names)}); name an offered function")


def grammar(tools: Sequence[ToolLike], function_name: str = "", parallel: bool = False,
            allow_text: bool = False, answer_schema: str = "") -> str:
    """The llguidance Lark grammar of the allowed output (the tools were checked):
    one call (or several with `parallel`) of `function_name` or any tool; with
    `allow_text`, text that never opens a call, or text followed by calls; with
    `answer_schema` too, one JSON value of that schema instead of the text (tools with
    response_format: the calls, or the structured answer)."""
    chosen = [t for t in tools if not function_name or t.name == function_name]
    lines = [f"fn_{i}: {_lark_string(_head(t.name))} %json {schema_json(t)} \"}}\""
             for i, t in enumerate(chosen)]
    lines.append("fn: " + " | ".join(f"fn_{i}" for i in range(len(chosen))))
    body = '"\\n" fn "\\n</tool_call>"'
    more = ' ("\\n<tool_call>" ' + body + ")*" if parallel else ""
    if allow_text and answer_schema:
        lines += ["start: answer | \"<tool_call>\" " + body + more,
                  "answer: %json " + _compact(answer_schema)]
    elif allow_text:
        # NOTE: the text before a call is one lazy lexeme ending at the first <tool_call>:
        # llguidance's lexer does not backtrack, so a greedy text could not hand over to
        # the call; the text-only branch excludes the tag for the same reason.
        lines += ["start: TEXT | lead " + body + more,
                  "TEXT: " + _TEXT_WITHOUT_CALLS,
                  'lead[lazy]: /(?s:.*)/ "<tool_call>"']
    else:
        lines.append('start: "<tool_call>" ' + body + more)
    return "\n".join(lines) + "\n"


def _head(name: str) -> str:
    return f'{{"name": {json.dumps(name)}, "arguments": '


def schema_json(tool: ToolLike) -> str:
    """The parameters schema with compact JSON output (constraint.JSON_DEFAULTS), unless
    the schema sets llguidance's own options."""
    return _compact(parameters_schema(tool))


def _compact(schema_text: str) -> str:
    schema: Any = json.loads(schema_text)
    if isinstance(schema, dict) and "x-guidance" not in schema:
        schema = {**schema, "x-guidance": constraints.JSON_DEFAULTS}
    return json.dumps(schema, separators=(",", ":"))


def _lark_string(text: str) -> str:
    # A Lark string literal takes JSON's escapes (\" \\ \n); names are [a-zA-Z0-9_-].
    return json.dumps(text)
