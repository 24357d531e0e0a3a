"""ortserve.v1 events -> chat and completion JSON, SSE chunks and headers (pure: no HTTP,
no grpc). The per-request numbers (headers, the `ortserve` object's parts) are every
API's: reply/ortserve_numbers.py; here they go in the body (non-streaming) or the first
chunk (streaming), and n choices' headers are folded into one set (choices_headers).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from gateway.reply.ortserve_numbers import (
    CAP_HEADER,
    DECISION_HEADER,
    FINISH_REASON,
    MAX_TOKENS_HEADER,
    UNREAD_HEADER,
    admission_extension,
    admission_headers,
    finished_extension,
)
from gateway.request.translate import Kind
from ortserve.v1 import types_pb2

_OBJECT = {"chat": "chat.completion", "completion": "text_completion"}
_CHUNK_OBJECT = {"chat": "chat.completion.chunk", "completion": "text_completion"}
_ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}


@dataclass(frozen=True)
class ChatReplyMeta:
    """What every response and chunk of one request repeats."""

    kind: Kind
    id: str
    model: str
    created_s: int

    @classmethod
    def new(cls, kind: Kind, model: str) -> ChatReplyMeta:
        return cls(kind, _ID_PREFIX[kind] + uuid.uuid4().hex, model, int(time.time()))


def choices_headers(admissions: Sequence[types_pb2.Admission]) -> dict[str, str]:
    """n choices, each admitted on its own: the decisions in choice order
    ("ADMITTED, CAPPED, ADMITTED"), and the first capped choice's cap with its index.
    One choice: exactly `admission_headers`."""
    if len(admissions) == 1:
        return admission_headers(admissions[0])
    headers = {DECISION_HEADER: ", ".join(types_pb2.Decision.Name(a.decision)
                                          for a in admissions)}
    first = admission_headers(admissions[0])
    for same in (MAX_TOKENS_HEADER, UNREAD_HEADER):  # choice 0's (one prompt, one rule for all)
        if same in first:
            headers[same] = first[same]
    for index, adm in enumerate(admissions):
        if adm.HasField("budget_cap"):
            headers[CAP_HEADER] = f"choice={index}, " + admission_headers(adm)[CAP_HEADER]
            break
    return headers


def usage_dict(usage: types_pb2.Usage | Sequence[types_pb2.Usage],
               reasoning_tokens: int | None = None) -> dict:
    """One choice's usage, or n choices': the prompt once (as OpenAI counts it), the
    completions summed; `reasoning_tokens` (a reasoning model's chat: how many of the
    completion tokens were reasoning) as OpenAI's completion_tokens_details."""
    usages = [usage] if isinstance(usage, types_pb2.Usage) else list(usage)
    prompt = usages[0].prompt_tokens
    completion = sum(u.generated_tokens for u in usages)
    # prompt_tokens_details.cached_tokens: OpenAI's name for prompt tokens served from a
    # prefix cache (here the worker's, docs/features/prefix-cache.md), always present as theirs is;
    # with n choices, the first choice's (the prompt is counted once).
    body = {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": usages[0].cached_tokens}}
    if reasoning_tokens is not None:
        body["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


@dataclass(frozen=True)
class Choice:
    """One finished choice of a non-streaming answer."""

    text: str
    admission: types_pb2.Admission
    finished: types_pb2.Finished
    logprobs: dict | None = None
    # Tools: the message with its tool_calls (gateway/request/tools.py), in place of the text alone.
    message: dict | None = None
    # A reasoning model's chat: the reasoning split from the answer, and its tokens.
    reasoning: str | None = None
    reasoning_tokens: int | None = None


def full_response(meta: ChatReplyMeta, text: str, adm: types_pb2.Admission,
                  fin: types_pb2.Finished, logprobs: dict | None = None,
                  resolved: Mapping[str, str] | None = None) -> dict:
    """A non-streaming chat.completion or text_completion of one choice."""
    return choices_response(meta, [Choice(text, adm, fin, logprobs)], resolved)


def choices_response(meta: ChatReplyMeta, choices: Sequence[Choice],
                     resolved: Mapping[str, str] | None = None) -> dict:
    """A non-streaming answer of n choices (index i: choice i). The `ortserve` object is
    choice 0's admission and Finished; with n > 1 its `choices` has every choice's."""
    bodies = []
    for index, c in enumerate(choices):
        finish_reason = FINISH_REASON[c.finished.finish_reason]
        if meta.kind == "chat":
            message = c.message or {"role": "assistant", "content": c.text}
            if c.reasoning is not None:
                message = {**message, "reasoning_content": c.reasoning or None}
            if message.get("tool_calls") and finish_reason == "stop":
                finish_reason = "tool_calls"  # OpenAI's end for an answer of whole calls
            bodies.append({"index": index, "message": message,
                           "logprobs": c.logprobs, "finish_reason": finish_reason})
        else:
            bodies.append({"index": index, "text": c.text, "logprobs": c.logprobs,
                           "finish_reason": finish_reason})
    extension = {**admission_extension(choices[0].admission),
                 "finished": finished_extension(choices[0].finished)}
    if len(choices) > 1:
        extension["choices"] = [{**admission_extension(c.admission),
                                 "finished": finished_extension(c.finished)} for c in choices]
    if resolved:
        extension["resolved"] = dict(resolved)
    counted = [c.reasoning_tokens for c in choices if c.reasoning_tokens is not None]
    return {**_head(meta, _OBJECT), "choices": bodies,
            "usage": usage_dict([c.finished.usage for c in choices],
                                sum(counted) if counted else None),
            "ortserve": extension}


def first_chunk(meta: ChatReplyMeta, adm: types_pb2.Admission, include_usage: bool,
                index: int = 0, resolved: Mapping[str, str] | None = None) -> dict:
    """A choice's first streamed chunk: the assistant role, no text yet, its admission."""
    delta = {"role": "assistant", "content": ""}
    extension = admission_extension(adm)
    if resolved:
        extension["resolved"] = dict(resolved)
    return {**_chunk(meta, delta, None, include_usage, index), "ortserve": extension}


def text_chunk(meta: ChatReplyMeta, text: str, include_usage: bool, index: int = 0,
               logprobs: dict | None = None) -> dict:
    return _chunk(meta, {"content": text}, None, include_usage, index, logprobs)


def delta_chunk(meta: ChatReplyMeta, delta: dict, include_usage: bool, index: int = 0,
                logprobs: dict | None = None) -> dict:
    """A chat chunk of any delta (tool-call deltas: gateway/request/tools.py)."""
    return _chunk(meta, delta, None, include_usage, index, logprobs)


def text_chunk_encoder(meta: ChatReplyMeta, include_usage: bool,
                       index: int = 0) -> Callable[[str], str]:
    """text -> the JSON of text_chunk(meta, text, include_usage, index), as json.dumps with
    compact separators writes it: per token only the text is encoded (the rest is one template)."""
    marker = "\x00ortserve-text\x00"  # cannot occur in a JSON-encoded id or model name
    template = json.dumps(text_chunk(meta, marker, include_usage, index), separators=(",", ":"))
    head, tail = template.split(json.dumps(marker))
    return lambda text: head + json.dumps(text) + tail


def final_chunk(meta: ChatReplyMeta, fin: types_pb2.Finished, include_usage: bool,
                index: int = 0, logprobs: dict | None = None, called: bool = False) -> dict:
    """The last chunk of a choice; `called`: its output made whole tool calls (finish_reason
    "tool_calls" where it would be "stop")."""
    reason = FINISH_REASON[fin.finish_reason]
    chunk = _chunk(meta, {}, "tool_calls" if called and reason == "stop" else reason,
                   include_usage, index, logprobs)
    return {**chunk, "ortserve": {"finished": finished_extension(fin)}}


def usage_chunk(meta: ChatReplyMeta, fin: types_pb2.Finished | Sequence[types_pb2.Finished],
                reasoning_tokens: int | None = None) -> dict:
    """stream_options.include_usage: one last chunk with no choices and the usage."""
    fins = [fin] if isinstance(fin, types_pb2.Finished) else list(fin)
    return {**_head(meta, _CHUNK_OBJECT), "choices": [],
            "usage": usage_dict([f.usage for f in fins], reasoning_tokens)}


def _chunk(meta: ChatReplyMeta, delta: dict, finish_reason: str | None, include_usage: bool,
           index: int = 0, logprobs: dict | None = None) -> dict:
    if meta.kind == "chat":
        choice = {"index": index, "delta": delta, "logprobs": logprobs,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": index, "text": delta.get("content", ""), "logprobs": logprobs,
                  "finish_reason": finish_reason}
    chunk = {**_head(meta, _CHUNK_OBJECT), "choices": [choice]}
    # OpenAI sends usage: null on every chunk but the last when usage was asked for.
    if include_usage:
        chunk["usage"] = None
    return chunk


def _head(meta: ChatReplyMeta, objects: dict[str, str]) -> dict:
    return {"id": meta.id, "object": objects[meta.kind], "created": meta.created_s,
            "model": meta.model}
