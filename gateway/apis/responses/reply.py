"""OpenAI's Responses API: the response, whole or streamed (pure: no HTTP, no grpc).

The request side is request.py. A streamed and a whole response are
built from the same output items (reasoning, message, function_call).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gateway.apis.responses.request import ResponsesRequest
from gateway.reply.ortserve_numbers import FINISH_REASON, admission_extension, finished_extension
from gateway.reply.output_parts import CallArgumentsPiece, CallStartPiece, Piece, Reasoning, Text
from ortserve.v1 import types_pb2


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputItems:
    """One output's items as the Responses API shows them (reasoning, message,
    function_call), built from pieces; each step returns its stream events, so a
    streamed and a whole response are the same items."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self._open: dict | None = None  # the item pieces still go to
        self.sequence = 0

    def event(self, kind: str, **fields) -> dict:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return event

    def add(self, pieces: Sequence[Piece]) -> list[dict]:
        events: list[dict] = []
        for piece in pieces:
            if isinstance(piece, Reasoning):
                events += self._into("reasoning", piece.text)
            elif isinstance(piece, Text):
                events += self._into("message", piece.text)
            elif isinstance(piece, CallStartPiece):
                events += self._close()
                events += self._start({"id": new_id("fc"), "type": "function_call",
                                       "status": "in_progress", "call_id": piece.call_id,
                                       "name": piece.name, "arguments": ""})
            elif isinstance(piece, CallArgumentsPiece):
                item = self._open
                item["arguments"] += piece.fragment
                events.append(self.event("response.function_call_arguments.delta",
                                         item_id=item["id"], output_index=len(self.items) - 1,
                                         delta=piece.fragment))
        return events

    def close(self, status: str = "completed") -> list[dict]:
        """The output ended: the open item is done; `status` "incomplete" when it was cut."""
        events = self._close(status)
        if not self.items:  # an empty answer is still one (empty) message
            events += self._start(_message_item())
            events += self._close(status)
        return events

    def _into(self, kind: str, text: str) -> list[dict]:
        events: list[dict] = []
        if self._open is None or self._open["type"] != kind:
            events += self._close()
            events += self._start(_message_item() if kind == "message" else _reasoning_item())
        item = self._open
        part = item["content"][0]
        part["text"] += text
        name = "output_text" if kind == "message" else "reasoning_text"
        extra = {"logprobs": []} if kind == "message" else {}
        events.append(self.event(f"response.{name}.delta", item_id=item["id"],
                                 output_index=len(self.items) - 1, content_index=0,
                                 delta=text, **extra))
        return events

    def _start(self, item: dict) -> list[dict]:
        self.items.append(item)
        self._open = item
        index = len(self.items) - 1
        events = [self.event("response.output_item.added", output_index=index,
                             item=_copy(item, content_empty=True))]
        if item["type"] != "function_call":
            events.append(self.event("response.content_part.added", item_id=item["id"],
                                     output_index=index, content_index=0,
                                     part=dict(item["content"][0], text="")))
        return events

    def _close(self, status: str = "completed") -> list[dict]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = len(self.items) - 1
        item["status"] = status
        events = []
        if item["type"] == "function_call":
            events.append(self.event("response.function_call_arguments.done", item_id=item["id"],
                                     output_index=index, name=item["name"],
                                     arguments=item["arguments"]))
        else:
            part = item["content"][0]
            name = "output_text" if item["type"] == "message" else "reasoning_text"
            extra = {"logprobs": []} if item["type"] == "message" else {}
            events.append(self.event(f"response.{name}.done", item_id=item["id"],
                                     output_index=index, content_index=0, text=part["text"],
                                     **extra))
            events.append(self.event("response.content_part.done", item_id=item["id"],
                                     output_index=index, content_index=0, part=dict(part)))
        events.append(self.event("response.output_item.done", output_index=index,
                                 item=_copy(item)))
        return events


def _message_item() -> dict:
    return {"id": new_id("msg"), "type": "message", "status": "in_progress",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]}


def _reasoning_item() -> dict:
    return {"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [],
            "content": [{"type": "reasoning_text", "text": ""}]}


def _copy(item: dict, content_empty: bool = False) -> dict:
    out = json.loads(json.dumps(item))
    if content_empty and "content" in out:
        out["content"] = []
    return out


def status_of(fin: types_pb2.Finished) -> tuple[str, dict | None]:
    """(status, incomplete_details): a LENGTH end (max_output_tokens, or the cap that
    lowered it: `ortserve.finished.budget_cap` says which) is "incomplete"."""
    if FINISH_REASON[fin.finish_reason] == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


def usage_dict(usage: types_pb2.Usage, reasoning_tokens: int = 0) -> dict:
    """Responses' usage: cached_tokens are the prompt tokens whose KV was not computed
    again, from the session (a stored previous response) or the prefix cache."""
    cached = min(usage.prompt_tokens, usage.reused_prompt_tokens + usage.cached_tokens)
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": usage.generated_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": usage.prompt_tokens + usage.generated_tokens}


@dataclass
class ResponsesReplyMeta:
    """What the response object repeats from the request."""

    id: str
    request: ResponsesRequest
    model: str
    created_at: int = field(default_factory=lambda: int(time.time()))


def response_object(meta: ResponsesReplyMeta, status: str, output: list[dict],
                    usage: dict | None = None, incomplete: dict | None = None,
                    ortserve: dict | None = None, error: dict | None = None) -> dict:
    body = meta.request.body
    text = body.get("text") if isinstance(body.get("text"), Mapping) else {}
    fmt = dict(text.get("format") or {"type": "text"})
    out = {"id": meta.id, "object": "response", "created_at": meta.created_at, "status": status,
           "error": error, "incomplete_details": incomplete,
           "instructions": meta.request.instructions,
           "max_output_tokens": body.get("max_output_tokens"), "model": meta.model,
           "output": output, "parallel_tool_calls": body.get("parallel_tool_calls", True),
           "previous_response_id": meta.request.previous_response_id,
           "reasoning": {"effort": (body.get("reasoning") or {}).get("effort"), "summary": None},
           "store": meta.request.store, "temperature": body.get("temperature", 1.0),
           "text": {"format": fmt}, "tool_choice": body.get("tool_choice", "auto"),
           "tools": [dict(t, strict=t.get("strict", True)) for t in body.get("tools", [])],
           "top_p": body.get("top_p", 1.0), "truncation": "disabled", "usage": usage,
           "user": body.get("user"), "metadata": body.get("metadata", {})}
    if ortserve is not None:
        out["ortserve"] = ortserve
    return out


def ortserve_extension(adm: types_pb2.Admission, fin: types_pb2.Finished | None,
                       session: dict | None, resolved: Mapping[str, str] | None = None) -> dict:
    """The `ortserve` object: the decision and the cap (as chat's), how it ended, and the
    session that keeps this response's KV (None: not kept; `reason` says why)."""
    out = {**admission_extension(adm, "responses"), "session": session}
    if fin is not None:
        out["finished"] = finished_extension(fin, "responses")
    if resolved:
        out["resolved"] = dict(resolved)
    return out
