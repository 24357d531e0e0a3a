"""Anthropic's Messages API: the response, whole or streamed (pure: no HTTP, no grpc).

The request side is request.py. A streamed and a whole message are
built from the same content blocks (thinking, text, tool_use).

The cap: a capped request ends with stop_reason "max_tokens" (the limit that
applied was the admitted one) and says so in the X-Ortserve-Budget-Cap header
and the `ortserve` object (message_start's message and message_delta when
streamed), as chat's finish_reason "length" does.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.reply.ortserve_numbers import admission_extension, finished_extension
from gateway.reply.output_parts import CallArgumentsPiece, CallStartPiece, Piece, Reasoning, Text
from ortserve.v1 import types_pb2


def new_id(prefix: str = "msg") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def stop_reason(fin: types_pb2.Finished, called: bool) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence). A cap ends as "max_tokens": the limit that applied
    was the admitted one (the cap header and the `ortserve` object say it was lowered)."""
    if fin.finish_reason == types_pb2.LENGTH:
        return "max_tokens", None
    if called:
        return "tool_use", None
    if fin.finish_reason == types_pb2.STOP_SEQUENCE:
        return "stop_sequence", fin.stop_sequence
    return "end_turn", None


def usage_dict(usage: types_pb2.Usage) -> dict:
    """Anthropic counts input read from a cache apart from input_tokens: here the prompt
    tokens whose KV came from the worker's prefix cache (or a session)."""
    cached = min(usage.prompt_tokens, usage.reused_prompt_tokens + usage.cached_tokens)
    return {"input_tokens": usage.prompt_tokens - cached, "output_tokens": usage.generated_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


class ContentBlocks:
    """One output's content blocks (thinking, text, tool_use), built from pieces; each step
    returns its stream events, so a streamed and a whole message are the same blocks."""

    def __init__(self) -> None:
        self.blocks: list[dict] = []
        self._open: dict | None = None
        self._arguments: dict[int, str] = {}  # block index -> a tool_use's JSON text

    def add(self, pieces: Sequence[Piece]) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        for piece in pieces:
            if isinstance(piece, Reasoning):
                events += self._into("thinking", piece.text)
            elif isinstance(piece, Text):
                events += self._into("text", piece.text)
            elif isinstance(piece, CallStartPiece):
                events += self._close()
                events += self._start({"type": "tool_use", "id": piece.call_id,
                                       "name": piece.name, "input": {}})
                self._arguments[len(self.blocks) - 1] = ""
            elif isinstance(piece, CallArgumentsPiece):
                index = len(self.blocks) - 1
                self._arguments[index] += piece.fragment
                events.append(sse_event("content_block_delta", index=index, delta={
                    "type": "input_json_delta", "partial_json": piece.fragment}))
        return events

    def close(self) -> list[tuple[str, dict]]:
        return self._close()

    def _into(self, kind: str, text: str) -> list[tuple[str, dict]]:
        events: list[tuple[str, dict]] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            events += self._start({"type": kind, kind: ""} | (
                {"signature": ""} if kind == "thinking" else {}))
        self._open[kind] += text
        events.append(sse_event("content_block_delta", index=len(self.blocks) - 1,
                             delta={"type": f"{kind}_delta", kind: text}))
        return events

    def _start(self, block: dict) -> list[tuple[str, dict]]:
        self.blocks.append(block)
        self._open = block
        return [sse_event("content_block_start", index=len(self.blocks) - 1,
                       content_block=dict(block))]

    def _close(self) -> list[tuple[str, dict]]:
        block, self._open = self._open, None
        if block is None:
            return []
        index = len(self.blocks) - 1
        if block["type"] == "tool_use":
            text = self._arguments.get(index, "")
            try:
                block["input"] = json.loads(text) if text else {}
            except ValueError:
                block["input"] = {}  # a call cut short (max_tokens): its arguments are a prefix
        return [sse_event("content_block_stop", index=index)]


def sse_event(kind: str, **fields: Any) -> tuple[str, dict]:
    return kind, {"type": kind, **fields}


def message_object(message_id: str, model: str, blocks: list[dict],
                   stop: tuple[str | None, str | None], usage: dict, ortserve: dict) -> dict:
    return {"id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": blocks, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": usage, "ortserve": ortserve}


def ortserve_extension(adm: types_pb2.Admission, fin: types_pb2.Finished | None = None,
                       resolved: Mapping[str, str] | None = None) -> dict:
    out = admission_extension(adm, "messages")
    if fin is not None:
        out["finished"] = finished_extension(fin, "messages")
    if resolved:
        out["resolved"] = dict(resolved)
    return out
