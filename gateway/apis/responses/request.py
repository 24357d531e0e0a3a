"""OpenAI's Responses API <-> the chat path (pure: no HTTP, no grpc).

A Responses request is translated into a chat request body and parsed by the
chat path (`translate.parse_request`), so every rule a chat request meets
(sampling, tools and their grammar, structured output, the scheduler's
ranges) is met here the same way; a refusal names the Responses field
(`max_output_tokens`, `text.format`, `input[2]`, `tools[0].parameters`).
Keys the Responses API does not define but the chat path honours as
ortserve or vLLM extensions (top_k, min_tokens, cap_policy, seed, ...) pass
through as they are.

Input items: a string (one user message), or a list of messages (roles user,
system, developer, assistant; content a string or input_text / output_text
parts), `function_call` items (they join the assistant turn before them, as
chat's tool_calls) and `function_call_output` items (tool turns). Reasoning
items a client sends back are dropped: chat templates do not render past
thoughts either.

The response side (output items, status, usage, the response object) is
openai_responses_reply.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.reply.errors import HttpError, renamed_param
from gateway.request.param_error import ParamError
from gateway.request.param_values import body_params, model_param
from gateway.request.translate import ParsedRequest, parse_request

# Keys this module reads itself; everything else is the chat path's to honour or refuse.
_OWN = {"model", "input", "instructions", "max_output_tokens", "tools", "tool_choice", "text",
        "store", "previous_response_id", "truncation", "include", "reasoning", "background",
        "stream"}
# Chat's names for what the Responses API names otherwise (refused, naming the right one).
_CHAT_ONLY = {"messages": "input", "max_tokens": "max_output_tokens",
              "max_completion_tokens": "max_output_tokens", "response_format": "text.format",
              "functions": "tools", "function_call": "tool_choice"}
# Responses keys ortserve cannot honour: refused, never ignored.
_REFUSED = {"conversation", "prompt", "max_tool_calls", "top_logprobs", "stream_options",
            "prompt_cache_retention", "n", "logprobs"}
_ROLES = {"user", "system", "developer", "assistant"}
_TEXT_PARTS = {"input_text", "output_text"}


@dataclass(frozen=True)
class ResponsesRequest:
    """A Responses request, translated; `chat(history)` builds the chat request to run."""

    body: Mapping[str, Any]  # the request, nulls dropped
    model: str
    instructions: str | None
    input_messages: list[dict]  # the new input as chat messages
    input_origin: list[str]  # where each came from ("input[2]")
    previous_response_id: str | None
    store: bool
    stream: bool
    # The chat body's keys other than model and messages (tools, tool_choice, limits, ...).
    chat_params: dict = field(default_factory=dict)

    def chat(self, history: Sequence[dict]) -> ParsedRequest:
        """The chat request of the whole conversation: instructions, `history` (the
        previous responses' input and output), then this input."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        origin = (["instructions"] * len(system) + ["previous_response_id"] * len(history)
                  + self.input_origin)
        messages = system + list(history) + self.input_messages
        if not messages:
            raise ParamError("input", "required: a string, or a non-empty list of input items")
        body = {"model": self.model, "messages": messages, **self.chat_params}
        try:
            return parse_request("chat", body)
        except ParamError as error:
            raise ParamError(chat_param(error.param, origin),
                             error.message.split(": ", 1)[-1], error.code) from None


def parse(body: object) -> ResponsesRequest:
    """Validate a Responses body; raises ParamError naming the Responses field."""
    params = body_params(body, "Responses", _CHAT_ONLY, _REFUSED)
    model = model_param(params)
    _only(params, "truncation", ("disabled",), "the input must fit the context window; "
          "ortserve never drops items")
    _only(params, "background", (False,), "responses run while the request is open")
    if params.get("include") not in (None, []):
        raise ParamError("include", f"{params['include']!r}: ortserve adds no optional output "
                         "data; send [] or leave it out", code="unsupported_parameter")
    instructions = params.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ParamError("instructions", "must be a string (the system message)")
    messages, origin = input_messages(params.get("input"))
    previous = params.get("previous_response_id")
    if previous is not None and (not isinstance(previous, str) or not previous):
        raise ParamError("previous_response_id", "must be the id of a stored response")
    store = params.get("store", True)
    stream = params.get("stream", False)
    for key, value in (("store", store), ("stream", stream)):
        if not isinstance(value, bool):
            raise ParamError(key, f"{value!r} is not true or false")
    chat = {k: v for k, v in params.items() if k not in _OWN}
    if "max_output_tokens" in params:
        chat["max_tokens"] = params["max_output_tokens"]
    if "tools" in params:
        chat["tools"] = _tools(params["tools"])
    if "tool_choice" in params:
        chat["tool_choice"] = _tool_choice(params["tool_choice"])
    if "text" in params:
        fmt = _text_format(params["text"])
        if fmt is not None:
            chat["response_format"] = fmt
    if "reasoning" in params:
        chat.update(_reasoning(params["reasoning"]))
    return ResponsesRequest(params, model, instructions or None, messages, origin, previous,
                            store, stream, chat)


def _only(params: Mapping[str, Any], key: str, values: tuple, why: str) -> None:
    if key in params and not any(type(params[key]) is type(v) and params[key] == v
                                 for v in values):
        raise ParamError(key, f"{params[key]!r} is not supported ({why}); send "
                         f"{values[0]!r} or leave it out", code="unsupported_parameter")


def input_messages(items: object) -> tuple[list[dict], list[str]]:
    """`input` -> chat messages, and each one's origin ("input[3]")."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}], ["input"]
    if not isinstance(items, list):
        raise ParamError("input", "required: a string, or a list of input items")
    messages: list[dict] = []
    origin: list[str] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise ParamError(where, "must be an input item object (a message, a function_call "
                             "or a function_call_output)")
        item = {k: v for k, v in item.items() if v is not None}
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in _ROLES:
                raise ParamError(f"{where}.role", f"{role!r} is not one of user, system, "
                                 "developer, assistant")
            messages.append({"role": role,
                             "content": _content(f"{where}.content", item.get("content"))})
            origin.append(where)
        elif kind == "function_call":
            call = {"id": _string(item, "call_id", where), "type": "function",
                    "function": {"name": _string(item, "name", where),
                                 "arguments": _string(item, "arguments", where)}}
            last = messages[-1] if messages else None
            # Calls join the assistant turn before them (its text, or the calls before them).
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if last.get("content") == "":
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
                origin.append(where)
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else _content(f"{where}.output", output)
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": text})
            origin.append(where)
        elif kind == "reasoning":
            continue  # past thoughts are not rendered again (chat templates drop them too)
        else:
            raise ParamError(f"{where}.type", f"{kind!r} is not supported (only message, "
                             "function_call, function_call_output and reasoning items)",
                             code="unsupported_parameter")
    return messages, origin


def _content(where: str, content: object) -> str:
    """A content (at `where`): a string, or input_text / output_text parts (joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(where, "must be a string or a list of input_text parts")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise ParamError(f"{where}[{j}]", f"part type {kind!r} is not supported "
                             "(only input_text and output_text with a text)",
                             code="unsupported_parameter")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (key != "arguments" and not value):
        raise ParamError(f"{where}.{key}", "required: a string")
    return value


def _tools(tools: object) -> object:
    """Responses' flat function tools -> chat's nested ones (chat checks the rest)."""
    if not isinstance(tools, list):
        return tools  # chat's refusal names `tools`
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else None
            raise ParamError(f"tools[{i}].type", f"{kind!r} is not supported: ortserve runs "
                             "function tools only (the caller runs them)",
                             code="unsupported_parameter")
        out.append({"type": "function", "function": {k: v for k, v in tool.items()
                                                     if k != "type"}})
    return out


def _tool_choice(choice: object) -> object:
    if isinstance(choice, Mapping):
        if choice.get("type") == "function" and isinstance(choice.get("name"), str):
            return {"type": "function", "function": {"name": choice["name"]}}
        raise ParamError("tool_choice", "must be none, auto, required or {\"type\": "
                         "\"function\", \"name\": ...}", code="unsupported_parameter")
    return choice


def _text_format(text: object) -> dict | None:
    if not isinstance(text, Mapping):
        raise ParamError("text", "must be an object: {\"format\": {...}}")
    extra = set(text) - {"format"} - {k for k, v in text.items() if v is None}
    if extra:
        raise ParamError(f"text.{sorted(extra)[0]}", "is not supported (only format)",
                         code="unsupported_parameter")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, Mapping):
        raise ParamError("text.format", "must be an object with a type: text, json_object or "
                         "json_schema")
    if fmt.get("type") != "json_schema":
        return dict(fmt)  # chat's response_format takes text and json_object as they are
    spec = {k: v for k, v in fmt.items() if k != "type"}
    return {"type": "json_schema", "json_schema": spec}


def _reasoning(reasoning: object) -> dict:
    """reasoning.effort -> chat's reasoning_effort (honoured or refused there)."""
    if not isinstance(reasoning, Mapping):
        raise ParamError("reasoning", "must be an object: {\"effort\": ...}")
    extra = {k for k, v in reasoning.items() if v is not None} - {"effort"}
    if extra:
        raise ParamError(f"reasoning.{sorted(extra)[0]}", "is not supported (only effort)",
                         code="unsupported_parameter")
    effort = reasoning.get("effort")
    return {} if effort is None else {"reasoning_effort": effort}


# Chat's parameter names -> the Responses API's.
_RENAMES = (("max_tokens", "max_output_tokens"),
            ("response_format.json_schema.schema", "text.format.schema"),
            ("response_format.json_schema.", "text.format."),
            ("response_format.json_schema", "text.format"),
            ("response_format", "text.format"),
            ("reasoning_effort", "reasoning.effort"))


def chat_param(param: str | None, origin: Sequence[str] = ()) -> str | None:
    """A chat path's `param` in the Responses API's words; `origin[i]` names messages[i]."""
    if param is None:
        return None
    if param.startswith("messages["):
        index = int(param[len("messages["):param.index("]")])
        return origin[index] if index < len(origin) else "input"
    if param == "messages":
        return "input"
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".", 1)
    for old, new in _RENAMES:
        if param.startswith(old):
            return new + param[len(old):]
    return param


def renamed(error: HttpError) -> HttpError:
    """A chat-path HttpError naming the Responses field (its message too)."""
    return renamed_param(error, chat_param(error.param))
