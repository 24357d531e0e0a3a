"""Anthropic's Messages API <-> the chat path (pure: no HTTP, no grpc).

A Messages request is translated into a chat request body and parsed by the
chat path (`translate.parse_request`): sampling, tools and their grammar and
the scheduler's ranges are chat's rules, and a refusal names the Messages
field (`stop_sequences`, `tools[0].input_schema`, `messages[2].content[1]`).
`system` becomes the system message; a user turn's `tool_result` blocks
become tool turns (in their order, before the turn's text), an assistant
turn's `tool_use` blocks its tool calls; thinking blocks sent back are
dropped (chat templates do not render past thoughts). Keys Anthropic does not
define but the chat path honours as extensions (min_tokens, cap_policy,
seed, ...) pass through as they are.

Thinking: a model whose chat template writes reasoning streams it as
`thinking` blocks (the Admission says which format, as for chat's
reasoning_content). The `thinking` parameter maps where it can be honoured:
`{"type": "disabled"}` sets the template's `enable_thinking` to false (a
template without that switch refuses it, naming `thinking`); `{"type":
"enabled", "budget_tokens": N}` asks for thinking blocks, refused when the
model's template writes no reasoning (or the gateway runs --reasoning-parser
none). The budget is no separate limit: thinking and text share max_tokens,
which Anthropic requires to exceed it and the scheduler reserves whole (the
`ortserve.resolved` object says so). Other types (adaptive, ...) are refused.

The response side (content blocks, stop_reason, usage, the `ortserve`
object) is anthropic_reply.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

from gateway.reply.errors import HttpError, renamed_param
from gateway.request.param_error import ParamError
from gateway.request.param_values import body_params
from gateway.request.translate import ParsedRequest, parse_request

# Anthropic's error types by HTTP status (their API's table); others are api_error.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 499: "invalid_request_error", 500: "api_error",
               503: "overloaded_error", 529: "overloaded_error"}
# cache_control (a prompt-caching mark) is accepted and changes nothing: the worker's prefix
# cache is automatic.
_OWN = {"model", "messages", "system", "max_tokens", "stop_sequences", "tools", "tool_choice",
        "stream", "thinking", "output_config", "cache_control"}
# The chat API's names for what Messages names otherwise.
_CHAT_ONLY = {"stop": "stop_sequences", "max_completion_tokens": "max_tokens",
              "functions": "tools", "function_call": "tool_choice"}
_REFUSED = {"container", "mcp_servers", "context_management", "inference_geo", "speed",
            "diagnostics", "user_profile_id", "workspace_id", "n", "response_format",
            "logprobs", "top_logprobs", "stream_options"}
# A ParsedRequest's param (chat's name) -> the Messages API's.
_RENAMES = (("stop", "stop_sequences"), ("reasoning_effort", "output_config.effort"),
            ("chat_template_kwargs.enable_thinking", "thinking"),
            ("response_format.json_schema.schema", "output_config.format.schema"),
            ("response_format", "output_config.format"))


def parse(body: object, counting: bool = False) -> tuple[ParsedRequest, bool, str | None]:
    """(the chat request, stream, the thinking type asked: "enabled", "disabled" or None);
    raises ParamError naming the Messages field. `counting`: a count_tokens body (no
    max_tokens: nothing is generated)."""
    params = body_params(body, "Messages", _CHAT_ONLY, _REFUSED)
    if counting:
        params.setdefault("max_tokens", 1)
    max_tokens = params.get("max_tokens")
    if max_tokens is None:
        raise ParamError("max_tokens", "required: the most tokens to generate (the Messages "
                         "API has no default)")
    messages, origin = _messages(params.get("system"), params.get("messages"))
    chat = {k: v for k, v in params.items() if k not in _OWN - {"model", "max_tokens", "stream"}}
    chat["messages"] = messages
    if "stop_sequences" in params:
        stop = params["stop_sequences"]
        if not isinstance(stop, list) or not all(isinstance(x, str) for x in stop):
            raise ParamError("stop_sequences", "must be a list of strings")
        chat["stop"] = stop
    if "tools" in params:
        chat["tools"] = _tools(params["tools"])
    if "tool_choice" in params:
        chat.update(_tool_choice(params["tool_choice"], "tools" in params))
    if "output_config" in params:
        chat.update(_output_config(params["output_config"]))
    thinking, resolved = None, {}
    if "thinking" in params:
        thinking, resolved = _thinking(params["thinking"], max_tokens, chat)
    try:
        parsed = parse_request("chat", chat)
    except ParamError as error:
        raise ParamError(chat_param(error.param, origin), error.message.split(": ", 1)[-1],
                         error.code) from None
    if resolved:
        parsed = replace(parsed, resolved={**(parsed.resolved or {}), **resolved})
    if thinking == "disabled":
        # `thinking` is honoured or refused: a template that does not read the switch
        # cannot be told (a chat_template_kwargs name alone is accepted unread).
        parsed.generate.chat.template_kwargs_required.append("enable_thinking")
    return parsed, parsed.stream, thinking


def _thinking(config: object, max_tokens: object, chat: dict) -> tuple[str, dict[str, str]]:
    """`thinking` -> (its type, the `ortserve.resolved` notes); "disabled" sets the
    template's enable_thinking in `chat` (see the module's doc for what each type does)."""
    kind = config.get("type") if isinstance(config, Mapping) else None
    if kind not in ("enabled", "disabled"):
        raise ParamError("thinking.type" if isinstance(config, Mapping) else "thinking",
                         f"{kind!r} is not supported: send {{\"type\": \"enabled\", "
                         "\"budget_tokens\": N}} or {\"type\": \"disabled\"} (ortserve cannot "
                         "let the model decide whether to think)", code="unsupported_parameter")
    extra = {k for k, v in config.items() if v is not None} - {"type", "budget_tokens",
                                                                "display"}
    if extra:
        raise ParamError(f"thinking.{sorted(extra)[0]}", "is not supported (only type, "
                         "budget_tokens and display)", code="unsupported_parameter")
    if kind == "disabled":
        if "budget_tokens" in config:
            raise ParamError("thinking.budget_tokens", "goes with type \"enabled\" only")
        kwargs = chat.get("chat_template_kwargs", {})
        if not isinstance(kwargs, Mapping):
            return kind, {}  # chat's refusal names chat_template_kwargs
        if kwargs.get("enable_thinking", False) is not False:
            raise ParamError("thinking", "{\"type\": \"disabled\"} differs from "
                             "chat_template_kwargs.enable_thinking: send one of them")
        chat["chat_template_kwargs"] = {**kwargs, "enable_thinking": False}
        return kind, {}
    display = config.get("display", "summarized")
    if display != "summarized":
        raise ParamError("thinking.display", f"{display!r} is not supported: ortserve shows "
                         "the thinking as the model wrote it (\"summarized\"); it has no "
                         "signature to return in its place", code="unsupported_parameter")
    budget = config.get("budget_tokens")
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise ParamError("thinking.budget_tokens", f"{budget!r}: required with type "
                         "\"enabled\", a positive whole number of tokens")
    if isinstance(max_tokens, int) and budget >= max_tokens:
        raise ParamError("thinking.budget_tokens", f"{budget:,} must be less than max_tokens "
                         f"({max_tokens:,}): thinking counts toward max_tokens")
    return kind, {"thinking.budget_tokens": (
        f"{budget} is not a separate limit: thinking and text share max_tokens "
        f"({max_tokens}), which is reserved whole")}


def _messages(system: object, messages: object) -> tuple[list[dict], list[str]]:
    """system + messages -> chat messages, and each one's origin ("messages[2]")."""
    out: list[dict] = []
    origin: list[str] = []
    if system is not None:
        out.append({"role": "system", "content": _text(system, "system")})
        origin.append("system")
    if not isinstance(messages, list) or not messages:
        raise ParamError("messages", "required: a non-empty list of {role, content}")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise ParamError(where, "must be an object with role and content")
        role, content = message.get("role"), message.get("content")
        if role not in ("user", "assistant"):
            raise ParamError(f"{where}.role", f"{role!r} is not user or assistant (the system "
                             "prompt goes in `system`)")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            origin.append(where)
            continue
        if not isinstance(content, list):
            raise ParamError(f"{where}.content", "must be a string or a list of content blocks")
        turns = (_user_turns if role == "user" else _assistant_turns)(content, f"{where}.content")
        out += turns
        origin += [where] * len(turns)
    if out[-1]["role"] == "assistant":
        # Anthropic continues a final assistant turn (a prefill); the chat template here
        # would start a new turn after it instead: refused rather than answered otherwise.
        raise ParamError(f"messages[{len(messages) - 1}]", "a final assistant turn (a prefill "
                         "to continue) is not supported: end with a user turn",
                         code="unsupported_parameter")
    return out, origin


def _user_turns(blocks: list, where: str) -> list[dict]:
    turns: list[dict] = []
    texts: list[str] = []
    for j, block in enumerate(blocks):
        kind = _kind(block, f"{where}[{j}]")
        if kind == "text":
            texts.append(_block_text(block, f"{where}[{j}]"))
        elif kind == "tool_result":
            call_id = block.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise ParamError(f"{where}[{j}].tool_use_id", "required: the id of the "
                                 "tool_use it answers")
            result = _text(block.get("content", ""), f"{where}[{j}].content")
            if block.get("is_error"):
                # NOTE: chat templates have no place for the flag: the model reads it as text.
                result = f"Error: {result}"
            turns.append({"role": "tool", "tool_call_id": call_id, "content": result})
        else:
            raise _unsupported_block(kind, f"{where}[{j}]", "text and tool_result")
    if texts or not turns:
        turns.append({"role": "user", "content": "".join(texts)})
    return turns


def _assistant_turns(blocks: list, where: str) -> list[dict]:
    texts: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(blocks):
        kind = _kind(block, f"{where}[{j}]")
        if kind == "text":
            texts.append(_block_text(block, f"{where}[{j}]"))
        elif kind == "tool_use":
            call_id, name, arguments = block.get("id"), block.get("name"), block.get("input", {})
            if not isinstance(call_id, str) or not call_id:
                raise ParamError(f"{where}[{j}].id", "required: the tool_use's id")
            if not isinstance(name, str) or not name:
                raise ParamError(f"{where}[{j}].name", "required: the tool's name")
            if not isinstance(arguments, Mapping):
                raise ParamError(f"{where}[{j}].input", "must be an object")
            calls.append({"id": call_id, "type": "function",
                          "function": {"name": name, "arguments": json.dumps(arguments)}})
        elif kind in ("thinking", "redacted_thinking"):
            continue  # past thoughts are not rendered again
        else:
            raise _unsupported_block(kind, f"{where}[{j}]", "text, tool_use and thinking")
    turn: dict = {"role": "assistant", "content": "".join(texts)}
    if calls:
        turn["tool_calls"] = calls
        turn["content"] = turn["content"] or None
    return [turn]


def _kind(block: object, where: str) -> str:
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise ParamError(where, "must be a content block object with a type")
    return block["type"]


def _block_text(block: Mapping, where: str) -> str:
    if not isinstance(block.get("text"), str):
        raise ParamError(f"{where}.text", "required: a string")
    return block["text"]


def _text(content: object, where: str) -> str:
    """A string, or text blocks (joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(where, "must be a string or a list of text blocks")
    texts = []
    for j, block in enumerate(content):
        kind = _kind(block, f"{where}[{j}]")
        if kind != "text":
            raise _unsupported_block(kind, f"{where}[{j}]", "text")
        texts.append(_block_text(block, f"{where}[{j}]"))
    return "".join(texts)


def _unsupported_block(kind: str, where: str, allowed: str) -> ParamError:
    return ParamError(f"{where}.type", f"{kind!r} blocks are not supported here (only "
                      f"{allowed})", code="unsupported_parameter")


def _tools(tools: object) -> object:
    """Anthropic's tools -> chat's function tools (chat checks the schemas)."""
    if not isinstance(tools, list):
        raise ParamError("tools", "must be a list of {name, description, input_schema}")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise ParamError(where, "must be {name, description, input_schema}")
        tool = {k: v for k, v in tool.items() if v is not None and k != "cache_control"}
        if tool.get("type", "custom") != "custom":
            raise ParamError(f"{where}.type", f"{tool['type']!r}: server tools are not supported "
                             "(only client tools: name, description, input_schema)",
                             code="unsupported_parameter")
        extra = set(tool) - {"type", "name", "description", "input_schema"}
        if extra:
            raise ParamError(f"{where}.{sorted(extra)[0]}", "is not supported (a tool has "
                             "name, description and input_schema)", code="unsupported_parameter")
        if "input_schema" not in tool:
            raise ParamError(f"{where}.input_schema", "required: the tool's JSON Schema")
        function = {"name": tool.get("name"), "parameters": tool["input_schema"]}
        if "description" in tool:
            function["description"] = tool["description"]
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: object, has_tools: bool) -> dict:
    """{type: auto|any|tool|none} -> chat's tool_choice and parallel_tool_calls."""
    if not isinstance(choice, Mapping) or choice.get("type") not in ("auto", "any", "tool",
                                                                      "none"):
        raise ParamError("tool_choice", "must be {\"type\": \"auto\" | \"any\" | \"tool\" | "
                         "\"none\"} (\"tool\" with a name)")
    extra = {k for k, v in choice.items() if v is not None} - {
        "type", "name", "disable_parallel_tool_use"}
    if extra:
        raise ParamError(f"tool_choice.{sorted(extra)[0]}", "is not supported",
                         code="unsupported_parameter")
    kind = choice["type"]
    out: dict = {"tool_choice": {"auto": "auto", "any": "required", "none": "none"}.get(kind)}
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise ParamError("tool_choice.name", "required with type \"tool\": the tool to use")
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None:
        if not isinstance(disable, bool):
            raise ParamError("tool_choice.disable_parallel_tool_use",
                             f"{disable!r} is not true or false")
        out["parallel_tool_calls"] = not disable
    if not has_tools and kind == "none":
        return {}
    return out


def _output_config(config: object) -> dict:
    """output_config: format (a JSON schema, enforced) -> chat's response_format; effort ->
    chat's reasoning_effort (honoured or refused there)."""
    if not isinstance(config, Mapping):
        raise ParamError("output_config", "must be an object: {\"format\", \"effort\"}")
    extra = {k for k, v in config.items() if v is not None} - {"format", "effort"}
    if extra:
        raise ParamError(f"output_config.{sorted(extra)[0]}", "is not supported (only format "
                         "and effort)", code="unsupported_parameter")
    out: dict = {}
    if config.get("effort") is not None:
        out["reasoning_effort"] = config["effort"]
    fmt = config.get("format")
    if fmt is not None:
        if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema" \
                or set(fmt) - {"type", "schema"}:
            raise ParamError("output_config.format", "must be {\"type\": \"json_schema\", "
                             "\"schema\": {...}}")
        out["response_format"] = {"type": "json_schema", "json_schema": {
            "name": "output", "schema": fmt.get("schema")}}
    return out


def chat_param(param: str | None, origin: Sequence[str] = ()) -> str | None:
    """A chat path's `param` in the Messages API's words; `origin[i]` names messages[i]."""
    if param is None:
        return None
    if param.startswith("messages["):
        index = int(param[len("messages["):param.index("]")])
        return origin[index] if index < len(origin) else "messages"
    if param.startswith("tools[") and param.endswith(".function.parameters"):
        return param.replace(".function.parameters", ".input_schema")
    if param.startswith("tools[") and ".function." in param:
        return param.replace(".function.", ".", 1)
    if param in ("tool_choice", "parallel_tool_calls"):
        return "tool_choice"
    for old, new in _RENAMES:
        if param.startswith(old):
            return new
    return param


def error_body(error: HttpError) -> dict:
    """Anthropic's error shape; the message names the field, ortserve's numbers ride along."""
    message = error.message
    if error.param and not message.startswith(error.param):
        message = f"{error.param}: {message}"
    out = {"type": "error", "error": {"type": ERROR_TYPES.get(error.status, "api_error"),
                                      "message": message}}
    if error.ortserve:
        out["error"]["ortserve"] = error.ortserve
    return out


def renamed(error: HttpError) -> HttpError:
    """A chat-path HttpError naming the Messages field (its message too)."""
    return renamed_param(error, chat_param(error.param))
