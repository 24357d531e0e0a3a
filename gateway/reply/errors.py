"""gRPC failures -> OpenAI-shaped HTTP errors, through one table.

The scheduler's status is decoded once (ortserve.status.call_errors.from_rpc_error:
the code, the ErrorInfo reason, the Rejection, the BadRequest field); the
table below is the only place an HTTP status is chosen. The message keeps the
scheduler's sentence with its numbers and remedy; the `ortserve` object in the
error carries the same numbers for programs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2

from gateway.reply.api_words import APIS
from gateway.request.param_error import ParamError
from ortserve.rpc.error_path import STATUS_DETAILS_KEY
from ortserve.status import rich_status
from ortserve.status.call_errors import OrtserveError, Rejected, from_rpc_error, rejection_dict
from ortserve.status.errors import clip

S = grpc.StatusCode

# (gRPC code, ErrorInfo reason or None for "any") -> (HTTP status, OpenAI error type).
# A reason arrives with the code of the one table (ortserve.status.status_table), the same
# from the scheduler and the workers; every code that table uses has a row here.
# A reason row wins over its code's catch-all row. RESOURCE_EXHAUSTED is 429
# whatever the reason (budget busy now, a full queue): the openai clients
# retry a 429 after Retry-After (a tenant at its KV quota, TENANT_QUOTA, included).
STATUS_TABLE: dict[tuple[grpc.StatusCode, str | None], tuple[int, str]] = {
    (S.INVALID_ARGUMENT, "CONTEXT_LENGTH_EXCEEDED"): (400, "invalid_request_error"),
    (S.INVALID_ARGUMENT, None): (400, "invalid_request_error"),
    (S.FAILED_PRECONDITION, "EXCEEDS_CAPACITY"): (400, "invalid_request_error"),
    (S.FAILED_PRECONDITION, None): (400, "invalid_request_error"),
    (S.OUT_OF_RANGE, None): (400, "invalid_request_error"),
    (S.RESOURCE_EXHAUSTED, None): (429, "rate_limit_error"),
    (S.UNAUTHENTICATED, None): (401, "authentication_error"),
    (S.PERMISSION_DENIED, None): (403, "permission_error"),
    # OpenAI's own shape for an unknown model: 404, invalid_request_error, model_not_found.
    (S.NOT_FOUND, "MODEL_NOT_FOUND"): (404, "invalid_request_error"),
    (S.NOT_FOUND, None): (404, "not_found_error"),
    # Only a worker's registration meets it today; a conflict, not a server fault.
    (S.ALREADY_EXISTS, None): (409, "conflict_error"),
    (S.UNAVAILABLE, None): (503, "service_unavailable"),
    (S.DEADLINE_EXCEEDED, None): (504, "timeout"),
    (S.UNIMPLEMENTED, None): (501, "server_error"),
    # A cancelled call is a client that went away; nobody reads the answer.
    (S.CANCELLED, None): (499, "cancelled"),
}
_FALLBACK = (500, "server_error")

# The scheduler's proto field paths in the OpenAI names the caller used.
_PARAM_OF_FIELD = {
    "max_new_tokens": "max_tokens",
    "min_new_tokens": "min_tokens",
    "stop": "stop",
    "sampling.temperature": "temperature",
    "sampling.top_p": "top_p",
    "sampling.top_k": "top_k",
    "sampling.seed": "seed",
    "sampling.repetition_penalty": "repetition_penalty",
    "sampling.presence_penalty": "presence_penalty",
    "sampling.frequency_penalty": "frequency_penalty",
    "sampling.min_p": "min_p",
    "sampling.logit_bias": "logit_bias",
    "cap_policy": "cap_policy",
    "model": "model",
    # response_format's schema (the message still names constraint.json_schema)
    "constraint.json_schema": "response_format.json_schema.schema",
    "constraint.json_object": "response_format",
    # tools' Constraint.tool_call (the function named, or the grammar built from the tools)
    "constraint.tool_call": "tool_choice",
    "constraint.tool_call.function_name": "tool_choice",
    # response_format beside tools (gateway/request/tools.py moves its schema there)
    "constraint.tool_call.answer_json_schema": "response_format",
}

# GenerateRequest's field names in the scheduler's sentences (a remedy's "lower
# max_new_tokens to N", a cap's reason) as each HTTP route's callers spell them: the
# one mapping every error and cap text of the gateway goes through (in_route_words).
# Built from the APIs the route table names (api_words.py), never typed again.
ROUTE_FIELDS: dict[str, dict[str, str]] = {
    api.name: {"max_new_tokens": api.max_tokens_param, "min_new_tokens": api.min_tokens_param}
    for api in APIS}
# Whole words only: the `ortserve` object's keys (requested_max_new_tokens) stay as they are.
_FIELD_WORD = re.compile(r"\b(max_new_tokens|min_new_tokens)\b")


def in_route_words(text: str, route: str) -> str:
    """`text` with GenerateRequest's field names in `route`'s HTTP parameter names."""
    names = ROUTE_FIELDS[route]
    return _FIELD_WORD.sub(lambda m: names[m.group(1)], text)


def route_words(value, route: str):
    """Every string inside `value` (dicts and lists walked, keys kept) in `route`'s words."""
    if isinstance(value, str):
        return in_route_words(value, route)
    if isinstance(value, dict):
        return {k: route_words(v, route) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [route_words(v, route) for v in value]
    return value

# The gateway's own code for a scheduler it cannot reach (no status of the scheduler's at
# all: every answer of the scheduler carries one), and the address it calls (build_app).
SCHEDULER_UNAVAILABLE = "scheduler_unavailable"
SCHEDULER = {"address": ""}


@dataclass
class HttpError(Exception):
    """An error response: status, OpenAI's error object, and headers (Retry-After).

    Not frozen: the ASGI stack assigns __traceback__ on exceptions it handles.
    """

    status: int
    message: str
    type: str
    code: str
    param: str | None = None
    retry_after_s: float = 0.0
    ortserve: dict = field(default_factory=dict)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code, "ortserve": self.ortserve}}

    def headers(self) -> dict[str, str]:
        if self.retry_after_s <= 0:
            return {}
        # Retry-After holds whole seconds; the openai clients read the exact
        # retry-after-ms first.
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s))),
                "retry-after-ms": str(max(1, round(self.retry_after_s * 1000)))}


def from_param_error(error: ParamError) -> HttpError:
    return HttpError(400, error.message, "invalid_request_error", error.code, error.param)


def from_grpc(error: grpc.RpcError, prompt_param: str, route: str = "chat") -> HttpError:
    """Map a failed Generate call; `prompt_param` is "messages" or "prompt"; `route`
    ("chat", "completion", "responses", "messages") names the fields in its callers' words."""
    if _unreached(error):
        return scheduler_unavailable(error)
    decoded = from_rpc_error(error)
    info = decoded.error_info()
    reason = info.reason if info else None
    status, kind = STATUS_TABLE.get((decoded.code, reason)) \
        or STATUS_TABLE.get((decoded.code, None), _FALLBACK)
    code = reason.lower() if reason else decoded.code.name.lower()
    extension = {"grpc_code": decoded.code.name, "reason": reason or "",
                 "metadata": dict(info.metadata) if info else {}}
    message = decoded.message or f"the scheduler answered {decoded.code.name}"
    if isinstance(decoded, Rejected):
        extension["rejection"] = rejection_dict(decoded.rejection)
        if decoded.remedy and decoded.remedy not in message:
            message = f"{message} {decoded.remedy}"
    param = _param(decoded, reason, prompt_param)
    message = _named_as_asked(message, _field_path(decoded), param)
    return HttpError(status, in_route_words(message, route), kind, code, param,
                     _retry_after_s(decoded), route_words(extension, route))


def _field_path(decoded: OrtserveError) -> str:
    """The proto field path a refusal names (BadRequest's first violation; "" for none)."""
    bad = rich_status.unpack(decoded.details, error_details_pb2.BadRequest)
    return bad.field_violations[0].field if bad and bad.field_violations else ""


def _named_as_asked(message: str, proto_path: str, param: str | None) -> str:
    """A message that opens with a proto field path ("chat.template_kwargs_json.x: ...")
    opens with the caller's parameter instead ("chat_template_kwargs.x: ...")."""
    if param and proto_path and param != proto_path and message.startswith(proto_path + ":"):
        return param + message[len(proto_path):]
    return message


def renamed_param(error: HttpError, param: str | None) -> HttpError:
    """`error` naming `param` (another API's name for its field), its message too."""
    if error.param and param and error.param != param \
            and error.message.startswith(error.param + ":"):
        error.message = param + error.message[len(error.param):]
    error.param = param
    return error


def _unreached(error: grpc.RpcError) -> bool:
    """The call never reached the scheduler (down, wrong address, connection lost): the
    transport's UNAVAILABLE, with none of the status details every scheduler answer has."""
    return error.code() == S.UNAVAILABLE and not any(
        k == STATUS_DETAILS_KEY for k, _ in (error.trailing_metadata() or ()))


def scheduler_unavailable(error: grpc.RpcError) -> HttpError:
    """503 `scheduler_unavailable`: where the gateway calls, what the transport said, and
    what to do."""
    address = SCHEDULER["address"] or "(unknown)"
    message = (f"the gateway cannot reach the scheduler at {address} "
               f"({clip(error.details() or 'no answer', 300)}); start the scheduler there "
               "(ortserve-scheduler) or point the gateway's --scheduler at the address it "
               "listens on, then retry")
    return HttpError(503, message, "service_unavailable", SCHEDULER_UNAVAILABLE, None, 0.0,
                     {"grpc_code": S.UNAVAILABLE.name, "reason": SCHEDULER_UNAVAILABLE.upper(),
                      "metadata": {"scheduler_address": address}})


def _param(decoded: OrtserveError, reason: str | None, prompt_param: str) -> str | None:
    if reason in ("CONTEXT_LENGTH_EXCEEDED", "EXCEEDS_CAPACITY"):
        return prompt_param
    if reason == "MODEL_NOT_FOUND":
        return "model"
    bad = rich_status.unpack(decoded.details, error_details_pb2.BadRequest)
    if not bad or not bad.field_violations:
        return None
    proto_path = bad.field_violations[0].field
    if proto_path.startswith("chat.tools"):  # a tool's schema or name, as OpenAI nests them
        return (proto_path.removeprefix("chat.").replace(".parameters_json", ".function.parameters")
                .replace("].name", "].function.name"))
    if proto_path.startswith("chat.messages"):
        return proto_path.removeprefix("chat.")
    if proto_path.startswith("chat.template_kwargs_json"):
        # reasoning_effort travels as a template variable; the rest are chat_template_kwargs.
        name = proto_path.removeprefix("chat.template_kwargs_json").lstrip(".")
        return name if name == "reasoning_effort" else ".".join(
            filter(None, ("chat_template_kwargs", name)))
    if proto_path in ("text",) or proto_path.startswith("token_ids"):
        return "tokens" if prompt_param == "tokens" else "prompt"  # /detokenize's ids
    head = proto_path.split("[")[0]
    if head == "logprobs.top_logprobs":
        # Chat asks with top_logprobs; the legacy completions API with logprobs (an int).
        return "top_logprobs" if prompt_param == "messages" else "logprobs"
    return _PARAM_OF_FIELD.get(head, proto_path)


def _retry_after_s(decoded: OrtserveError) -> float:
    if isinstance(decoded, Rejected) and decoded.retry_after_s > 0:
        return decoded.retry_after_s
    retry = rich_status.unpack(decoded.details, error_details_pb2.RetryInfo)
    return retry.retry_delay.ToNanoseconds() / 1e9 if retry else 0.0
