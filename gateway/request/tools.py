"""OpenAI's tools, tool_choice and parallel_tool_calls -> the proto, and tool calls back out.

Request (pure): `tools` go to ChatMessages.tools (the chat template sees them),
`tool_choice` becomes Constraint.tool_call, so `required` and a named function
are enforced by the grammar (the arguments always parse against the function's
schema) and `auto` lets the model write text or calls, a call it opens being
enforced too. `none` offers no tools (the template is not told; nothing to
parse), OpenAI's promise that the model will not call. Each tool's schema is
compiled here (llguidance, no vocabulary), so a bad one is a 400 naming
`tools[i].function.parameters` before any gRPC call.

Response: `ToolCallChoice` runs one choice's text through ortserve's parser
(ortserve/output/tool_output.py) into OpenAI's `tool_calls` (whole, or as streamed
deltas: the name first, then argument fragments) and the text outside calls
as `content`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from gateway.request.param_error import ParamError
from ortserve.output import tool_calls, tool_formats
from ortserve.output.tool_output import CallArguments, CallStart, Event, TextEvent
from ortserve.status.errors import InvalidField
from ortserve.v1 import types_pb2

_TOOL_KEYS = {"type", "function"}
_FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
_CHOICES = ("none", "auto", "required")
_DEPRECATED = {"functions": "tools", "function_call": "tool_choice"}


def refuse_deprecated(params: Mapping[str, Any]) -> None:
    """functions / function_call: OpenAI's deprecated names, refused naming the replacement."""
    for old, new in _DEPRECATED.items():
        if old in params:
            raise ParamError(old, f"is OpenAI's deprecated form; send `{new}` instead (ortserve "
                             f"honours {new})", code="unsupported_parameter")


def set_tools(req: types_pb2.GenerateRequest, params: Mapping[str, Any]) -> bool:
    """Apply tools / tool_choice / parallel_tool_calls; True when the output is to be
    parsed for calls (tools offered and tool_choice is not "none")."""
    tools, choice = params.get("tools"), params.get("tool_choice")
    parallel = params.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ParamError("parallel_tool_calls", f"{parallel!r} is not true or false")
    if tools is None or tools == []:
        # An empty list offers no tools, as OpenAI's Responses API and vLLM take it (the OpenAI
        # Agents SDK sends `tools: []` for every agent without tools). "auto" asks for nothing
        # that cannot be honoured then; a choice that needs a tool can be honoured by none.
        mode, _ = _choice(choice)
        if mode in ("required", "named"):
            raise ParamError("tool_choice", f"{json.dumps(choice)} needs a tool, and `tools` "
                             "offers none: send the functions in `tools`, or tool_choice "
                             "\"auto\" or \"none\"")
        return False
    if not isinstance(tools, list):
        raise ParamError("tools", "must be a list of {type: function, function: {...}}")
    mode, name = _choice(choice)
    if mode == "none":
        return False  # not offered: the model is not told of them, and nothing is parsed
    for i, tool in enumerate(tools):
        req.chat.tools.append(_tool(i, tool))
    try:
        tool_calls.check_tools(req.chat.tools)
    except InvalidField as error:
        raise _param_error(error) from None
    names = [t.name for t in req.chat.tools]
    if name and name not in names:
        raise ParamError("tool_choice", f"names {name!r}, which is not one of tools "
                         f"({', '.join(names)}); name an offered function")
    answer = _answer_schema(req, mode)
    req.constraint.tool_call.function_name = name
    req.constraint.tool_call.answer_json_schema = answer
    # A named function is one call of it (OpenAI and vLLM alike); parallel_tool_calls
    # lets required and auto make several.
    req.constraint.tool_call.parallel = parallel and not name
    req.constraint.tool_call.allow_text = mode == "auto"
    return True


def _answer_schema(req: types_pb2.GenerateRequest, mode: str) -> str:
    """response_format beside tools (an agent with tools and an output type: the OpenAI
    Agents SDK): under tool_choice "auto" the output is calls or the structured
    answer, as OpenAI answers; the schema moves into the tool-call constraint. "" when
    response_format was not given."""
    if not req.HasField("constraint"):
        return ""
    kind = req.constraint.WhichOneof("kind")
    if mode != "auto":
        raise ParamError("response_format", f"cannot be combined with tool_choice {mode!r}: "
                         "the output is calls only, with no answer to shape; send tool_choice "
                         "\"auto\" (calls or the structured answer) or drop response_format",
                         code="unsupported_parameter")
    schema = (req.constraint.json_schema if kind == "json_schema"
              else json.dumps({"type": "object"}))  # json_object: any object
    req.ClearField("constraint")
    return schema


def _choice(choice: object) -> tuple[str, str]:
    """(mode, function name): auto when unset, as OpenAI's default with tools."""
    if choice is None:
        return "auto", ""
    if isinstance(choice, str):
        if choice not in _CHOICES:
            raise ParamError("tool_choice", f"{choice!r} is not one of none, auto, required or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}")
        return choice, ""
    if isinstance(choice, Mapping) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), Mapping) \
            and isinstance(choice["function"].get("name"), str):
        return "named", choice["function"]["name"]
    raise ParamError("tool_choice", "must be none, auto, required or {\"type\": \"function\", "
                     "\"function\": {\"name\": ...}}")


def _tool(i: int, tool: object) -> types_pb2.Tool:
    where = f"tools[{i}]"
    if not isinstance(tool, Mapping) or tool.get("type") != "function" \
            or not isinstance(tool.get("function"), Mapping):
        raise ParamError(where, "must be {\"type\": \"function\", \"function\": {\"name\", "
                         "\"description\", \"parameters\"}}")
    extra = sorted(set(tool) - _TOOL_KEYS) + [f"function.{k}" for k in
                                              sorted(set(tool["function"]) - _FUNCTION_KEYS)]
    if extra:
        raise ParamError(f"{where}.{extra[0]}", "is not supported (a function tool has "
                         "name, description, parameters and strict)", code="unsupported_parameter")
    function = {k: v for k, v in tool["function"].items() if v is not None}
    name, description = function.get("name"), function.get("description", "")
    if not isinstance(name, str):
        raise ParamError(f"{where}.function.name", "required: the function's name")
    if not isinstance(description, str):
        raise ParamError(f"{where}.function.description", "must be a string")
    if "strict" in function and not isinstance(function["strict"], bool):
        raise ParamError(f"{where}.function.strict", f"{function['strict']!r} is not true or false")
    # NOTE: strict or not, the arguments are enforced (strict's promise, always kept).
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, Mapping):
        raise ParamError(f"{where}.function.parameters", "must be a JSON Schema object")
    return types_pb2.Tool(name=name, description=description,
                          parameters_json=json.dumps(parameters) if parameters is not None else "")


def _param_error(error: InvalidField) -> ParamError:
    """chat.tools[i].name / .parameters_json -> tools[i].function.name / .parameters."""
    field = error.field or "tools"
    param = (field.removeprefix("chat.").replace(".parameters_json", ".function.parameters")
             .replace("].name", "].function.name"))
    return ParamError(param, str(error).split(": ", 1)[-1])


# -- the output -----------------------------------------------------------------------


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


class ToolCallChoice:
    """One choice's output parsed for calls, whole or as OpenAI's streamed deltas."""

    def __init__(self, fmt: str = "hermes") -> None:
        # The format the model's template asks calls in (the Admission's tool_call_format).
        self._parser = tool_formats.parser(fmt)
        self._ids: list[str] = []

    def deltas(self, text: str, final: bool = False) -> list[dict]:
        """The text's chat deltas: {"content"} and {"tool_calls": [...]}, merged per kind."""
        events = self._parser.push(text) + (self._parser.close() if final else [])
        return self._to_deltas(events)

    def _to_deltas(self, events: list[Event]) -> list[dict]:
        out: list[dict] = []
        for event in events:
            if isinstance(event, TextEvent):
                if out and "content" in out[-1]:
                    out[-1]["content"] += event.text
                else:
                    out.append({"content": event.text})
            elif isinstance(event, CallStart):
                self._ids.append(call_id())
                out.append({"tool_calls": [{"index": event.index, "id": self._ids[-1],
                                            "type": "function", "function": {
                                                "name": event.name, "arguments": ""}}]})
            elif isinstance(event, CallArguments):
                # The name goes alone in its delta; argument fragments of one token merge.
                last = out[-1]["tool_calls"][-1] if out and "tool_calls" in out[-1] else None
                if last is not None and last["index"] == event.index and "id" not in last:
                    last["function"]["arguments"] += event.fragment
                else:
                    out.append({"tool_calls": [{"index": event.index,
                                                "function": {"arguments": event.fragment}}]})
        return out

    @property
    def called(self) -> bool:
        return bool(self._parser.calls)

    def message(self, text: str) -> dict:
        """A whole output as a chat.completion message: content (None when only calls)
        and tool_calls."""
        deltas = self.deltas(text, final=True)
        content = "".join(d.get("content", "") for d in deltas)
        if not self._parser.calls:
            return {"role": "assistant", "content": content}
        calls = [{"id": self._ids[i], "type": "function",
                  "function": {"name": c.name, "arguments": c.arguments}}
                 for i, c in enumerate(self._parser.calls)]
        return {"role": "assistant", "content": content or None, "tool_calls": calls}


def finish_reason(reason: str, called: bool) -> str:
    """OpenAI's `tool_calls` when the output ended with its calls whole; a cut call keeps
    `length` (its arguments are a prefix)."""
    return "tool_calls" if called and reason == "stop" else reason
