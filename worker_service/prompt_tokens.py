"""A GenerateRequest's prompt as token ids: the scheduler's forwarded ids, the ids sent, or
the text or chat tokenized here (a chat through the model's template, with its tools).

convert.prepare calls it once per request; nothing else on the worker's edge tokenizes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from ortserve.output import tool_calls
from ortserve.rules import request_rules
from ortserve.v1 import types_pb2
from worker_service.core.tokenizer import Tokenizer


def prompt_ids(request: types_pb2.GenerateRequest, tokenizer: Tokenizer,
               forwarded_ids: Sequence[int] = ()) -> list[int]:
    """The request's prompt as token ids: the scheduler's forwarded ids when it sent them
    (it tokenized already; the lease check catches a mismatch), else tokenized here.
    The request's shape was checked (`prepare`)."""
    kind = request.WhichOneof("prompt")
    if forwarded_ids:
        return list(forwarded_ids)
    if kind == "text":
        return tokenizer.encode(request.text)
    if kind == "token_ids":
        return list(request.token_ids.ids)
    return tokenizer.encode_chat(chat_turns(request.chat), chat_tools(request.chat),
                                 request_rules.template_kwargs(request.chat.template_kwargs_json),
                                 request.chat.template_kwargs_required)


def chat_turns(chat: types_pb2.ChatMessages) -> list:
    """The turns as the template reads them: (role, content), or transformers' message dict
    when a turn carries tool calls or answers one (arguments parsed: a template renders
    them as an object; request_rules checked they are JSON objects)."""
    turns: list = []
    for m in chat.messages:
        if not m.tool_calls and not m.tool_call_id:
            turns.append((m.role, m.content))
            continue
        turn: dict = {"role": m.role, "content": m.content}
        if m.tool_calls:
            turn["tool_calls"] = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.loads(c.arguments_json or "{}")}}
                for c in m.tool_calls]
        if m.tool_call_id:
            turn["tool_call_id"] = m.tool_call_id
        turns.append(turn)
    return turns


def chat_tools(chat: types_pb2.ChatMessages) -> list[dict]:
    """The functions offered, as transformers passes `tools` to a template."""
    return [{"type": "function", "function": {
        "name": t.name, "description": t.description,
        "parameters": json.loads(tool_calls.parameters_schema(t))}} for t in chat.tools]
