"""ortserve.v1 events -> OpenAI response JSON and headers (pure: no HTTP, no grpc).

The admission is the first event of every Generate stream, so the gateway knows
ADMITTED or CAPPED before the first byte it sends: the decision and the cap go
in the response headers, and the full BudgetCap in an `ortserve` object in the
body (non-streaming) or the first chunk (streaming), never only in logs.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass

from ortserve_client.types import BudgetCap, sampling_dict

from ortserve.v1 import types_pb2

from .translate import Kind

# ortserve's finish reasons in OpenAI's words: a cap ends as "length", like
# any other max_tokens, and the `ortserve` object says it was a cap.
FINISH_REASON = {
    types_pb2.LENGTH: "length",
    types_pb2.EOS: "stop",
    types_pb2.STOP_SEQUENCE: "stop",
}
DECISION_HEADER = "X-Ortserve-Decision"
# An RFC 8941 dictionary: requested_max_tokens=N, admitted_max_tokens=N,
# requested_bytes=N, admitted_bytes=N.
CAP_HEADER = "X-Ortserve-Budget-Cap"
_OBJECT = {"chat": "chat.completion", "completion": "text_completion"}
_CHUNK_OBJECT = {"chat": "chat.completion.chunk", "completion": "text_completion"}
_ID_PREFIX = {"chat": "chatcmpl-", "completion": "cmpl-"}


@dataclass(frozen=True)
class ResponseMeta:
    """What every response and chunk of one request repeats."""

    kind: Kind
    id: str
    model: str
    created_s: int

    @classmethod
    def new(cls, kind: Kind, model: str) -> ResponseMeta:
        return cls(kind, _ID_PREFIX[kind] + uuid.uuid4().hex, model, int(time.time()))


def budget_cap_dict(pb: types_pb2.BudgetCap) -> dict:
    return asdict(BudgetCap.from_pb(pb))


def admission_extension(adm: types_pb2.Admission) -> dict:
    """The `ortserve` object of the body / first chunk: the decision and the full cap."""
    return {
        "decision": types_pb2.Decision.Name(adm.decision),
        "request_id": adm.request_id,
        "worker_id": adm.worker_id,
        "model": adm.model,  # the model that answers, as the scheduler resolved it
        "prompt_tokens": adm.prompt_tokens,
        "max_new_tokens": adm.max_new_tokens,
        "reserved_bytes": adm.reserved_bytes,
        "budget_cap": budget_cap_dict(adm.budget_cap) if adm.HasField("budget_cap") else None,
    }


def finished_extension(fin: types_pb2.Finished) -> dict:
    """The `ortserve` object of the last chunk: what ran, where, and how fast."""
    t = fin.timings
    return {
        "finish_reason": types_pb2.FinishReason.Name(fin.finish_reason),
        "stop_sequence": fin.stop_sequence,
        "budget_cap": budget_cap_dict(fin.budget_cap) if fin.HasField("budget_cap") else None,
        "sampling": sampling_dict(fin.sampling),
        "worker_id": fin.worker_id,
        "execution_provider": fin.execution_provider,
        "timings": {"queue_ms": t.queue_ms, "prefill_ms": t.prefill_ms, "ttft_ms": t.ttft_ms,
                    "decode_ms": t.decode_ms, "decode_tokens_per_s": t.decode_tokens_per_s,
                    "total_ms": t.total_ms},
    }


def admission_headers(adm: types_pb2.Admission) -> dict[str, str]:
    headers = {DECISION_HEADER: types_pb2.Decision.Name(adm.decision)}
    if adm.HasField("budget_cap"):
        cap = adm.budget_cap
        headers[CAP_HEADER] = (f"requested_max_tokens={cap.requested_max_new_tokens}, "
                               f"admitted_max_tokens={cap.admitted_max_new_tokens}, "
                               f"requested_bytes={cap.requested_bytes}, "
                               f"admitted_bytes={cap.admitted_bytes}")
    return headers


def usage_dict(usage: types_pb2.Usage) -> dict:
    # prompt_tokens_details.cached_tokens: OpenAI's name for prompt tokens served from a
    # prefix cache (here the worker's, docs/prefix-cache.md), always present as theirs is.
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.generated_tokens,
            "total_tokens": usage.prompt_tokens + usage.generated_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}


def full_response(meta: ResponseMeta, text: str, adm: types_pb2.Admission,
                  fin: types_pb2.Finished) -> dict:
    """A non-streaming chat.completion or text_completion."""
    finish_reason = FINISH_REASON[fin.finish_reason]
    if meta.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text},
                  "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    return {**_head(meta, _OBJECT), "choices": [choice], "usage": usage_dict(fin.usage),
            "ortserve": {**admission_extension(adm), "finished": finished_extension(fin)}}


def first_chunk(meta: ResponseMeta, adm: types_pb2.Admission, include_usage: bool) -> dict:
    """The first streamed chunk: the assistant role, no text yet, the admission."""
    delta = {"role": "assistant", "content": ""}
    return {**_chunk(meta, delta, None, include_usage), "ortserve": admission_extension(adm)}


def text_chunk(meta: ResponseMeta, text: str, include_usage: bool) -> dict:
    return _chunk(meta, {"content": text}, None, include_usage)


def final_chunk(meta: ResponseMeta, fin: types_pb2.Finished, include_usage: bool) -> dict:
    chunk = _chunk(meta, {}, FINISH_REASON[fin.finish_reason], include_usage)
    return {**chunk, "ortserve": {"finished": finished_extension(fin)}}


def usage_chunk(meta: ResponseMeta, fin: types_pb2.Finished) -> dict:
    """stream_options.include_usage: one last chunk with no choices and the usage."""
    return {**_head(meta, _CHUNK_OBJECT), "choices": [], "usage": usage_dict(fin.usage)}


def _chunk(meta: ResponseMeta, delta: dict, finish_reason: str | None, include_usage: bool) -> dict:
    if meta.kind == "chat":
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": delta.get("content", ""), "logprobs": None,
                  "finish_reason": finish_reason}
    chunk = {**_head(meta, _CHUNK_OBJECT), "choices": [choice]}
    # OpenAI sends usage: null on every chunk but the last when usage was asked for.
    if include_usage:
        chunk["usage"] = None
    return chunk


def _head(meta: ResponseMeta, objects: dict[str, str]) -> dict:
    return {"id": meta.id, "object": objects[meta.kind], "created": meta.created_s,
            "model": meta.model}
