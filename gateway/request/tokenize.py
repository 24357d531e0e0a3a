"""vLLM's /tokenize and /detokenize bodies <-> Scheduler.Tokenize / Detokenize (pure).

The gateway has no tokenizer: the scheduler asks a worker of the request's
model, so the count is exactly what Generate would admit. Keys are vLLM's;
those that would change the count are accepted only at the value ortserve
applies (`add_special_tokens` as the tokenizer / the chat template decide,
`add_generation_prompt: true`); any other key is a 400 naming it.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.request.messages import set_chat
from gateway.request.param_values import is_int
from gateway.request.translate import UINT32_MAX, ParamError, _set_prompt
from ortserve.v1 import types_pb2

_NO_OP_VALUES = {"add_generation_prompt": True, "return_token_strs": False}


def _params(body: object, allowed: set[str]) -> dict:
    if not isinstance(body, Mapping):
        raise ParamError("body", "the request body must be a JSON object")
    params = {k: v for k, v in body.items() if v is not None}
    for key, value in params.items():
        if key in allowed:
            continue
        if key in _NO_OP_VALUES and value is _NO_OP_VALUES[key]:
            continue
        if key in _NO_OP_VALUES:
            raise ParamError(key, f"only {_NO_OP_VALUES[key]!r} is supported by ortserve",
                             code="unsupported_parameter")
        raise ParamError(key, "is not a /tokenize or /detokenize parameter ortserve knows; "
                         "remove it", code="unknown_parameter")
    model = params.get("model", "")
    if not isinstance(model, str):
        raise ParamError("model", "must be a string (a name from /v1/models)")
    return params


def tokenize_request(body: object) -> types_pb2.GenerateRequest:
    """{"model", "prompt": str | [ids]} or {"model", "messages": [...]} -> the prompt as
    Generate would count it."""
    params = _params(body, {"model", "prompt", "messages", "add_special_tokens"})
    req = types_pb2.GenerateRequest(model=params.get("model", ""))
    if "messages" in params and "prompt" in params:
        raise ParamError("messages", "send prompt or messages, not both")
    if "messages" in params:
        if params.get("add_special_tokens", False) is not False:
            raise ParamError("add_special_tokens", "only false with messages (the chat "
                             "template writes its own special tokens)",
                             code="unsupported_parameter")
        set_chat(req, params["messages"])
    else:
        if params.get("add_special_tokens", True) is not True:
            raise ParamError("add_special_tokens", "only true with a prompt (the tokenizer's "
                             "own post-processor decides, as Generate does)",
                             code="unsupported_parameter")
        _set_prompt(req, params.get("prompt"))
    return req


def tokenize_response(answer: types_pb2.PromptTokens) -> dict:
    ids = list(answer.token_ids)
    return {"count": len(ids), "max_model_len": answer.context_length, "tokens": ids,
            "token_strs": None}


def detokenize_request(body: object) -> types_pb2.DetokenizeRequest:
    params = _params(body, {"model", "tokens"})
    tokens = params.get("tokens")
    if not isinstance(tokens, list) or not all(is_int(t) and 0 <= t <= UINT32_MAX
                                               for t in tokens):
        raise ParamError("tokens", "required: a list of token ids from 0 to 4,294,967,295")
    return types_pb2.DetokenizeRequest(model=params.get("model", ""), token_ids=tokens)


def detokenize_response(answer: types_pb2.DetokenizeResponse) -> dict:
    return {"prompt": answer.text}
