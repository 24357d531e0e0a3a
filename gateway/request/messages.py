"""OpenAI chat `messages` -> ortserve.v1.ChatMessages (pure: no HTTP, no grpc).

Roles system, developer (= system), user, assistant and tool; an assistant
turn's `tool_calls` and a tool turn's `tool_call_id` travel in the proto so the
chat template renders a tool-call round trip (docs/features/tools.md). `name` is a label
(the template has no place for it); null means "not given", as everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from gateway.request.param_error import ParamError
from ortserve.v1 import types_pb2

# OpenAI's "developer" role is the system role under a newer name.
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
          "tool": "tool"}
_KEYS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal"}


def set_chat(req: types_pb2.GenerateRequest, messages: object) -> None:
    if not isinstance(messages, list) or not messages:
        raise ParamError("messages", "required: a non-empty list of {role, content} objects")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ParamError(where, "must be an object with role and content")
        message = {k: v for k, v in message.items() if v is not None}
        extra = set(message) - _KEYS
        if extra:
            raise ParamError(f"{where}.{sorted(extra)[0]}", "is not supported by ortserve "
                             "(only role, content, name, tool_calls and tool_call_id)",
                             code="unsupported_parameter")
        if not isinstance(message.get("name", ""), str):
            raise ParamError(f"{where}.name", "must be a string")
        role = message.get("role")
        if role == "function":
            raise ParamError(f"{where}.role", "'function' is OpenAI's deprecated role: send the "
                             "result as a 'tool' turn with tool_call_id", code="unsupported_parameter")
        if role not in _ROLES:
            raise ParamError(f"{where}.role", f"{role!r} is not supported: use one of "
                             "system, developer, user, assistant, tool", code="unsupported_parameter")
        turn = req.chat.messages.add(role=_ROLES[role])
        calls = message.get("tool_calls")
        if calls is not None:
            if role != "assistant":
                raise ParamError(f"{where}.tool_calls", "only assistant turns carry tool calls",
                                 code="unsupported_parameter")
            _set_calls(turn, calls, where)
        if "refusal" in message and role != "assistant":
            raise ParamError(f"{where}.refusal", "only assistant turns carry a refusal")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str) or not call_id:
                raise ParamError(f"{where}.tool_call_id", "required on a tool turn: the id of "
                                 "the call it answers")
            turn.tool_call_id = call_id
        elif "tool_call_id" in message:
            raise ParamError(f"{where}.tool_call_id", "only tool turns answer a call",
                             code="unsupported_parameter")
        # An assistant turn that only called functions has no content (null: not given).
        if role == "assistant" and "content" not in message:
            continue
        turn.content = content_text(where, message.get("content"))


def _set_calls(turn: types_pb2.ChatMessage, calls: object, where: str) -> None:
    if not isinstance(calls, list):
        raise ParamError(f"{where}.tool_calls", "must be a list of {id, type, function}")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, Mapping) or call.get("type", "function") != "function" \
                or not isinstance(call.get("function"), Mapping):
            raise ParamError(at, "must be {\"id\", \"type\": \"function\", \"function\": "
                             "{\"name\", \"arguments\"}}")
        function = call["function"]
        name, arguments = function.get("name"), function.get("arguments", "{}")
        if not isinstance(name, str) or not name:
            raise ParamError(f"{at}.function.name", "required: the function's name")
        if not isinstance(arguments, str):
            raise ParamError(f"{at}.function.arguments", "must be a string of JSON, as returned")
        try:
            parsed = json.loads(arguments)
        except ValueError as exc:
            raise ParamError(f"{at}.function.arguments", f"is not JSON ({exc})") from None
        if not isinstance(parsed, dict):
            raise ParamError(f"{at}.function.arguments", "is not a JSON object")
        call_id = call.get("id", "")
        if not isinstance(call_id, str):
            raise ParamError(f"{at}.id", "must be a string")
        turn.tool_calls.add(id=call_id, name=name, arguments_json=arguments)


def content_text(where: str, content: object) -> str:
    """A message's content: a string, or a list of text parts (joined, as OpenAI does)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"{where}.content", "must be a string or a list of text parts")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or part.get("type") != "text" \
                or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise ParamError(f"{where}.content[{j}]", f"part type {kind!r} is not supported "
                             "(only {'type': 'text', 'text': ...})", code="unsupported_parameter")
        texts.append(part["text"])
    return "".join(texts)
