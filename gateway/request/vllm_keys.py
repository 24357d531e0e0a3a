"""The request keys vLLM's OpenAI server adds (sent through the openai SDK's extra_body)
-> the GenerateRequest, each honoured as vLLM honours it or refused naming why (pure:
no HTTP, no grpc).

Structured output: `structured_outputs` ({json | regex | choice | grammar | json_object},
vLLM's current form) and the older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` become GenerateRequest.constraint, checked here (llguidance, no
vocabulary) so a bad one is a 400 naming the key before anything is reserved. A choice
is a Lark grammar of the literal strings (Lark string literals take JSON's escapes, so
any string is exact; a regex would need Rust-regex escaping).

Generation: `ignore_eos` and `stop_token_ids` travel in the proto (the worker ends on
the ids, after their text, as vLLM does). Output: `include_stop_str_in_output` is the
gateway's (the Finished event names the stop sequence matched), as is
`stream_options.continuous_usage_stats` (gateway/request/translate.py). `skip_special_tokens`:
ortserve's text always skips them, so only true is accepted. `priority` is the admission
queue's order (gateway/request/translate.py; docs/features/tenants.md), not handled here.
`max_itl_ms` / `max_ttft_ms` are ortserve's own, read the same way: the request's latency
goals for admission (docs/features/time-budget.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.request.param_error import ParamError
from gateway.request.param_values import bool_param, is_int
from ortserve.output import constraint_grammar
from ortserve.rules.request_rules import MAX_STOP_TOKEN_IDS
from ortserve.status.errors import InvalidField
from ortserve.v1 import types_pb2

_GOALS = ("max_itl_ms", "max_ttft_ms")  # ortserve's latency goals (GenerateRequest's fields)
KEYS = {"structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "ignore_eos", "stop_token_ids", "include_stop_str_in_output", "skip_special_tokens",
        *_GOALS}
_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}
_STRUCTURED = {"json", "regex", "choice", "grammar", "json_object"}
# vLLM's structured_outputs keys ortserve has no counterpart for.
_STRUCTURED_REFUSED = {
    "structural_tag": "structural tags are not supported; use tools with tool_choice, or a "
                      "grammar",
    "disable_any_whitespace": "ortserve's JSON is always compact (no free whitespace); leave "
                              "it out",
    "disable_fallback": "ortserve has one backend (llguidance) and never falls back; leave it "
                        "out",
    "disable_additional_properties": "not supported; set \"additionalProperties\": false in "
                                     "the schema",
    "whitespace_pattern": "not supported; JSON output is compact",
}
MAX_CHOICES = 1_024


def apply(req: types_pb2.GenerateRequest, params: Mapping[str, Any]) -> bool:
    """Apply the keys to `req` (after response_format and tools set theirs); returns
    include_stop_str_in_output."""
    _set_structured(req, params)
    ignore_eos = bool_param(params, "ignore_eos", False)
    if ignore_eos:
        req.ignore_eos = True
    ids = params.get("stop_token_ids")
    if ids is not None:
        if not isinstance(ids, list) or not all(is_int(t) and 0 <= t < 2**32 for t in ids):
            raise ParamError("stop_token_ids", "must be a list of token ids (integers from 0)")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise ParamError("stop_token_ids", f"has {len(ids):,} ids, more than the "
                             f"{MAX_STOP_TOKEN_IDS} allowed; send fewer")
        req.stop_token_ids.extend(ids)
    for key in _GOALS:
        goal = params.get(key)
        if goal is not None:
            if not is_int(goal) or not 0 <= goal < 2**32:
                raise ParamError(key, "must be a whole number of milliseconds from 0 (0: the "
                                 "server's default goal)")
            setattr(req, key, goal)
    if not bool_param(params, "skip_special_tokens", True):
        raise ParamError("skip_special_tokens", "false is not supported: ortserve's text always "
                         "leaves special tokens out (vLLM's default); the ids are in logprobs "
                         "(logprobs: true) and /detokenize", code="unsupported_parameter")
    return bool_param(params, "include_stop_str_in_output", False)


def _set_structured(req: types_pb2.GenerateRequest, params: Mapping[str, Any]) -> None:
    given = [k for k in ("structured_outputs", *_GUIDED) if k in params]
    if not given:
        return
    if len(given) > 1:
        raise ParamError(given[1], f"cannot be combined with {given[0]}: send one output "
                         "constraint")
    key = given[0]
    if req.HasField("constraint"):
        other = ("tools (tool_choice other than \"none\")"
                 if req.constraint.WhichOneof("kind") == "tool_call" else "response_format")
        raise ParamError(key, f"cannot be combined with {other}: the output has one constraint; "
                         "send one of them", code="unsupported_parameter")
    if key == "structured_outputs":
        spec = params[key]
        if not isinstance(spec, Mapping):
            raise ParamError(key, "must be an object with one of json, regex, choice, grammar or "
                             "json_object")
        spec = {k: v for k, v in spec.items() if v is not None and v is not False}
        for name, why in _STRUCTURED_REFUSED.items():
            if name in spec:
                raise ParamError(f"{key}.{name}", why, code="unsupported_parameter")
        unknown = sorted(set(spec) - _STRUCTURED)
        if unknown:
            raise ParamError(f"{key}.{unknown[0]}", "is not a structured_outputs key (json, "
                             "regex, choice, grammar, json_object)", code="unknown_parameter")
        if len(spec) != 1:
            raise ParamError(key, "needs exactly one of json, regex, choice, grammar or "
                             f"json_object (got {', '.join(sorted(spec)) or 'none'})")
        kind, value = next(iter(spec.items()))
        where = f"{key}.{kind}"
    else:
        kind, value, where = _GUIDED[key], params[key], key
    _set_constraint(req, kind, value, where)


def _set_constraint(req: types_pb2.GenerateRequest, kind: str, value: object, where: str) -> None:
    if kind == "json_object":
        if value is not True:
            raise ParamError(where, f"{value!r} is not true")
        spec = constraint_grammar.ConstraintSpec("json_object")
    elif kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise ParamError(where, f"is not JSON ({exc}); send the JSON Schema") from None
        if not isinstance(value, Mapping | bool):
            raise ParamError(where, "must be a JSON Schema (an object, or its JSON text)")
        spec = constraint_grammar.ConstraintSpec("json_schema", json.dumps(value))
    elif kind == "choice":
        if not isinstance(value, list) or not value or \
                not all(isinstance(c, str) and c for c in value):
            raise ParamError(where, "must be a non-empty list of non-empty strings")
        if len(value) > MAX_CHOICES:
            raise ParamError(where, f"has {len(value):,} choices, more than the {MAX_CHOICES:,} "
                             "allowed")
        spec = constraint_grammar.ConstraintSpec("grammar", choice_grammar(value))
    else:  # regex, grammar
        if not isinstance(value, str):
            raise ParamError(where, f"must be a string (the {kind})")
        spec = constraint_grammar.ConstraintSpec(kind, value)
    try:
        constraint_grammar.check(spec)
    except InvalidField as error:
        raise ParamError(where, str(error).split(": ", 1)[-1]) from None
    setattr(req.constraint, spec.kind, True if spec.kind == "json_object" else spec.text)


def choice_grammar(choices: list[str]) -> str:
    """The output is exactly one of `choices` (a Lark grammar of string literals)."""
    return "start: " + " | ".join(json.dumps(c) for c in dict.fromkeys(choices)) + "\n"
