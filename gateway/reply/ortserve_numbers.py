"""The numbers every API answers with, per request (pure): the X-Ortserve-* headers
(the decision, the admitted ceiling and its source, the cap, the template variables not
read) and the `ortserve` object's admission and finished parts. Chat, Responses and
Messages each put them in their own shape; what they hold is written once, here.

The admission is the first event of every Generate stream, so the gateway knows
ADMITTED or CAPPED before the first byte it sends: the decision and the cap go in the
response headers, and the full BudgetCap in the `ortserve` object, never only in logs.
"""

from __future__ import annotations

from dataclasses import asdict

from gateway.reply.errors import in_route_words
from ortserve.rpc.message_views import BudgetCap, sampling_dict
from ortserve.v1 import types_pb2

# ortserve's finish reasons in OpenAI's words: a cap ends as "length", like
# any other max_tokens, and the `ortserve` object says it was a cap.
FINISH_REASON = {
    types_pb2.LENGTH: "length",
    types_pb2.EOS: "stop",
    types_pb2.STOP_SEQUENCE: "stop",
    types_pb2.STOP_TOKEN: "stop",  # one of stop_token_ids (ortserve.finished.stop_token_id)
    # response_format's output is complete: the end OpenAI calls "stop".
    types_pb2.CONSTRAINT_COMPLETE: "stop",
}
DECISION_HEADER = "X-Ortserve-Decision"
# An RFC 8941 dictionary: requested_max_tokens=N, admitted_max_tokens=N,
# requested_bytes=N, admitted_bytes=N.
CAP_HEADER = "X-Ortserve-Budget-Cap"
# Which ceiling applied, as an RFC 8941 dictionary: max_tokens=N, source=request |
# server_default | context_window (max_tokens: the admitted ceiling, after any cap).
MAX_TOKENS_HEADER = "X-Ortserve-Max-Tokens"
# Admission.max_new_tokens_source in the body's and the header's words.
# chat_template_kwargs the model's chat template does not read (accepted, changed nothing):
# their names, comma-separated; absent when every one was read.
UNREAD_HEADER = "X-Ortserve-Template-Kwargs-Unread"
MAX_TOKENS_SOURCE = {
    types_pb2.MAX_NEW_TOKENS_FROM_REQUEST: "request",
    types_pb2.MAX_NEW_TOKENS_FROM_SERVER_DEFAULT: "server_default",
    types_pb2.MAX_NEW_TOKENS_FROM_CONTEXT_WINDOW: "context_window",
}


def budget_cap_dict(pb: types_pb2.BudgetCap, route: str = "chat") -> dict:
    """The cap for the `ortserve` object, its reason in `route`'s parameter names."""
    cap = asdict(BudgetCap.from_pb(pb))
    cap["reason"] = in_route_words(cap["reason"], route)
    return cap


def admission_extension(adm: types_pb2.Admission, route: str = "chat") -> dict:
    """The `ortserve` object of the body / first chunk: the decision and the full cap
    (its text in `route`'s parameter names: errors.ROUTE_FIELDS)."""
    return {
        "decision": types_pb2.Decision.Name(adm.decision),
        "request_id": adm.request_id,
        "worker_id": adm.worker_id,
        "model": adm.model,  # the model that answers, as the scheduler resolved it
        "prompt_tokens": adm.prompt_tokens,
        "max_new_tokens": adm.max_new_tokens,
        # Where the ceiling came from: the request's max_tokens, the server's default
        # (--default-max-new-tokens) or the remaining context window.
        "max_new_tokens_source": MAX_TOKENS_SOURCE.get(adm.max_new_tokens_source),
        # Chat: the formats the model's template writes, as the worker read them (the
        # parsers this answer went through): tool calls and reasoning (null: none).
        "tool_call_format": adm.tool_call_format or None,
        "reasoning_format": adm.reasoning_format or None,
        # chat_template_kwargs the template does not read: accepted (vLLM's way), and said.
        "template_kwargs_unread": list(adm.template_kwargs_unread),
        "reserved_bytes": adm.reserved_bytes,
        "budget_cap": (budget_cap_dict(adm.budget_cap, route) if adm.HasField("budget_cap")
                       else None),
    }


def finished_extension(fin: types_pb2.Finished, route: str = "chat") -> dict:
    """The `ortserve` object of the last chunk: what ran, where, and how fast."""
    t = fin.timings
    return {
        "finish_reason": types_pb2.FinishReason.Name(fin.finish_reason),
        "stop_sequence": fin.stop_sequence,
        "stop_token_id": fin.stop_token_id if fin.finish_reason == types_pb2.STOP_TOKEN else None,
        "budget_cap": (budget_cap_dict(fin.budget_cap, route) if fin.HasField("budget_cap")
                       else None),
        "sampling": sampling_dict(fin.sampling),
        "worker_id": fin.worker_id,
        "execution_provider": fin.execution_provider,
        # response_format only: whether the output is a whole match of the schema, and why not.
        "constraint": ({"satisfied": fin.constraint.satisfied, "reason": fin.constraint.reason}
                       if fin.HasField("constraint") else None),
        "timings": {"queue_ms": t.queue_ms, "prefill_ms": t.prefill_ms, "ttft_ms": t.ttft_ms,
                    "decode_ms": t.decode_ms, "decode_tokens_per_s": t.decode_tokens_per_s,
                    "total_ms": t.total_ms},
    }


def admission_headers(adm: types_pb2.Admission) -> dict[str, str]:
    headers = {DECISION_HEADER: types_pb2.Decision.Name(adm.decision)}
    source = MAX_TOKENS_SOURCE.get(adm.max_new_tokens_source)
    if source:
        headers[MAX_TOKENS_HEADER] = f"max_tokens={adm.max_new_tokens}, source={source}"
    if adm.template_kwargs_unread:
        headers[UNREAD_HEADER] = ", ".join(adm.template_kwargs_unread)
    if adm.HasField("budget_cap"):
        cap = adm.budget_cap
        headers[CAP_HEADER] = (f"requested_max_tokens={cap.requested_max_new_tokens}, "
                               f"admitted_max_tokens={cap.admitted_max_new_tokens}, "
                               f"requested_bytes={cap.requested_bytes}, "
                               f"admitted_bytes={cap.admitted_bytes}")
        if cap.limit == types_pb2.CAP_LIMIT_TENANT_QUOTA:
            headers[CAP_HEADER] += (f', limit="tenant_quota", tenant="{cap.tenant}", '
                                    f"tenant_quota_bytes={cap.tenant_quota_bytes}, "
                                    f"tenant_reserved_bytes={cap.tenant_reserved_bytes}")
    return headers
