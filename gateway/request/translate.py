"""OpenAI request JSON -> ortserve.v1.GenerateRequest (pure: no HTTP, no grpc).

The project's rule carries over to HTTP: every parameter is honoured or the
request is refused with a 400 naming it. A parameter OpenAI defines but
ortserve cannot honour (echo, best_of > n) is accepted only at its
no-op value; keys that do not affect generation (store, metadata, user, ...)
are labels; a key OpenAI does not define is refused, so a typo is caught.
Parameters greedy decoding cannot use (seed, top_p, top_k, min_p at
temperature 0: the argmax is always kept) are dropped and reported in
`resolved`, not refused. Ranges the scheduler checks itself (stop sequences,
penalties, logit_bias, top_logprobs) are left to it, so there is one source
of truth; the gateway checks only what protobuf could not even hold, and `n`
(which has no proto field: the gateway runs n requests, `gateway/apis/chat/n_choices.py`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gateway.request import tools, vllm_keys
from gateway.request.messages import set_chat
from gateway.request.param_error import ParamError
from gateway.request.param_values import bool_param, int_param, is_int, model_param, number_param
from gateway.request.response_format import set_response_format
from ortserve.rules.request_rules import MAX_STREAM_INTERVAL_MS
from ortserve.v1 import types_pb2

__all__ = ["Kind", "ParamError", "ParsedRequest", "parse_request"]

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
# OpenAI's documented default when temperature is omitted (ortserve's own
# default is greedy): an OpenAI client that omits it expects sampling.
OPENAI_DEFAULT_TEMPERATURE = 1.0

Kind = Literal["chat", "completion"]

# Keys both endpoints honour. min_tokens, top_k, min_p and repetition_penalty are the
# extension names vLLM uses (sent through the openai SDK's extra_body);
# cap_policy ("allow", "strict" or "wait_full") and max_queue_wait_ms (how long to wait
# in the admission queue; 0: answer 429 at once when busy) and stream_interval_ms (the
# shortest time between two SSE events; 0: one per token) are ortserve's own.
_COMMON = {"model", "stream", "stream_options", "max_tokens", "stop", "seed", "temperature",
           "top_p", "n", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs",
           "min_tokens", "top_k", "min_p", "repetition_penalty", "cap_policy",
           "max_queue_wait_ms", "priority",
           "stream_interval_ms"} | vllm_keys.KEYS  # vLLM's further keys: gateway/request/vllm_keys.py
# Keys that do not affect generation: accepted as labels (type-checked, then unused).
# safety_identifier and prompt_cache_key are OpenAI's replacements for `user` (which it
# deprecates for them): a client that moved off `user` (Codex sends prompt_cache_key on
# every Responses call) must not meet a 400. The prefix cache is automatic, so a cache key
# has nothing to steer, as Anthropic's cache_control marks have not (messages/request.py).
_LABELS: dict[str, type | tuple[type, ...]] = {"user": str, "store": bool, "metadata": Mapping,
                                               "service_tier": str, "safety_identifier": str,
                                               "prompt_cache_key": str}
# Keys OpenAI defines that are accepted only at the value that changes nothing.
_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {"echo": (False,), "suffix": ("",)}
_ALLOWED = {
    # tools, tool_choice, parallel_tool_calls: gateway/request/tools.py
    "chat": _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format",
                       "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
                       "reasoning_effort"},
    "completion": _COMMON | {"prompt", "best_of"},
}
_NO_OP_KEYS: dict[str, set[str]] = {
    "chat": set(),
    "completion": {"echo", "suffix"},
}
# Keys OpenAI defines that ortserve refuses (anything else is not OpenAI's: a typo);
# functions / function_call are refused naming their replacements (gateway/request/tools.py).
_OPENAI_REFUSED = {"functions", "function_call", "response_format",
                   "modalities", "audio", "prediction", "verbosity",
                   "web_search_options"}
# Greedy decoding always takes the argmax: these cannot change its result.
_GREEDY_NO_OPS = ("seed", "top_p", "top_k", "min_p")
MAX_CHOICES = 16  # n: each choice is its own admission, so a bound keeps one call sane
_CAP_POLICIES = {"allow": types_pb2.CAP_POLICY_ALLOW, "strict": types_pb2.CAP_POLICY_STRICT,
                 "wait_full": types_pb2.CAP_POLICY_WAIT_FULL}


@dataclass(frozen=True)
class ParsedRequest:
    """What an OpenAI request asks for, as ortserve will run it."""

    kind: Kind
    model: str
    stream: bool
    include_usage: bool
    generate: types_pb2.GenerateRequest
    n: int = 1  # choices: n Generate calls (gateway/apis/chat/n_choices.py)
    # What was accepted but not applied, and why (seed etc. under greedy decoding):
    # the `ortserve.resolved` object of the response.
    resolved: Mapping[str, str] | None = None
    # Tools offered and tool_choice not "none": each choice's output is parsed for calls.
    tool_calls: bool = False
    # The request's own stream_interval_ms; None: the gateway's --stream-interval-ms.
    stream_interval_ms: int | None = None
    # vLLM's include_stop_str_in_output: the stop sequence matched ends the text.
    include_stop_str: bool = False
    # vLLM's stream_options.continuous_usage_stats: usage on every streamed chunk.
    continuous_usage: bool = False
    # The gateway's --reasoning-parser (gateway/reply/reasoning_split.py): "auto" or "none".
    reasoning_mode: str = "auto"

    @property
    def logprobs(self) -> bool:
        return self.generate.HasField("logprobs")

    def choice_request(self, index: int, request_id: str) -> types_pb2.GenerateRequest:
        """Choice `index`'s GenerateRequest: the same request with seed + index (so n
        choices with a seed differ from each other and repeat on the next call)."""
        req = types_pb2.GenerateRequest()
        req.CopyFrom(self.generate)
        req.request_id = request_id
        if index and req.sampling.HasField("seed"):
            req.sampling.seed = (req.sampling.seed + index) % (UINT64_MAX + 1)
        return req


def parse_request(kind: Kind, body: object) -> ParsedRequest:
    """Validate an OpenAI body and build the GenerateRequest; raises ParamError."""
    if not isinstance(body, Mapping):
        raise ParamError("body", "the request body must be a JSON object")
    # NOTE: null means "not given" for every key, as OpenAI's own API treats it.
    params = {k: v for k, v in body.items() if v is not None}
    if kind == "chat":
        tools.refuse_deprecated(params)
    _refuse_unsupported(kind, params)
    model = model_param(params)
    # The scheduler resolves it (one source of truth: it knows what its workers serve)
    # and places the request only on that model's workers; an unknown name is its 404.
    req = types_pb2.GenerateRequest(model=model)
    if kind == "chat":
        set_chat(req, params.get("messages"))
        _set_template_kwargs(req, params)
    else:
        _set_prompt(req, params.get("prompt"))
    _set_limits(kind, req, params)
    _set_sampling(req, params)
    _set_logprobs(kind, req, params)
    resolved = _drop_greedy_no_ops(req, params)
    n = int_param(params, "n", 1, MAX_CHOICES)
    n = 1 if n is None else n
    if kind == "completion":
        _best_of(params, n)
    req.stop.extend(_stop_list(params.get("stop")))
    set_response_format(req, params.get("response_format"))
    calls = kind == "chat" and tools.set_tools(req, params)
    include_stop = vllm_keys.apply(req, params)  # after response_format and tools: one constraint
    policy = params.get("cap_policy", "allow")
    if policy not in _CAP_POLICIES:
        raise ParamError("cap_policy", f"must be one of {', '.join(_CAP_POLICIES)}, not "
                         f"{policy!r}")
    req.cap_policy = _CAP_POLICIES[policy]
    # vLLM's extension: the admission queue's order, lower sooner; never preempts here.
    priority = int_param(params, "priority", -(2**31), 2**31 - 1)
    if priority is not None:
        req.priority = priority
    stream = bool_param(params, "stream", False)
    include_usage, continuous = _usage_options(params, stream)
    return ParsedRequest(kind, model, stream, include_usage, req, n, resolved or None, calls,
                         int_param(params, "stream_interval_ms", 0, MAX_STREAM_INTERVAL_MS),
                         include_stop, continuous)


def _refuse_unsupported(kind: Kind, params: Mapping[str, Any]) -> None:
    for key, value in params.items():
        if key in _ALLOWED[kind]:
            continue
        if key in _LABELS:
            if not isinstance(value, _LABELS[key]):
                raise ParamError(key, f"{value!r} is not a {_type_name(_LABELS[key])}")
            continue
        if key in _NO_OP_KEYS[kind]:
            # Exact types: bool is an int in Python, and n=True must not pass as n == 1.
            if any(type(value) is type(ok) and value == ok for ok in _NO_OP_VALUES[key]):
                continue
            raise ParamError(key, f"{value!r} is not supported by ortserve (only "
                             f"{_NO_OP_VALUES[key][0]!r}, which changes nothing)",
                             code="unsupported_parameter")
        if key in _OPENAI_REFUSED or key in _ALLOWED["chat"] | _ALLOWED["completion"]:
            raise ParamError(key, f"is not supported by ortserve's {kind} endpoint; remove it "
                             "(every parameter is honoured or refused, never ignored)",
                             code="unsupported_parameter")
        raise ParamError(key, "is not a parameter of OpenAI's API nor an ortserve extension: "
                         "check its spelling (docs/gateway.md lists them)",
                         code="unknown_parameter")


def _type_name(kind: type | tuple[type, ...]) -> str:
    return {str: "string", bool: "boolean", Mapping: "JSON object"}.get(kind, str(kind))


def _set_template_kwargs(req: types_pb2.GenerateRequest, params: Mapping[str, Any]) -> None:
    """chat_template_kwargs (vLLM's) and reasoning_effort -> the template's variables. A
    chat_template_kwargs name the model's template does not read is accepted, as vLLM's
    (the Admission names it: a header and the `ortserve` object); reasoning_effort, an API
    parameter, is accepted exactly where the template takes it (the worker refuses it
    elsewhere)."""
    kwargs = params.get("chat_template_kwargs", {})
    if not isinstance(kwargs, Mapping):
        raise ParamError("chat_template_kwargs", "must be an object of template variables, e.g. "
                         "{\"enable_thinking\": false}")
    kwargs = dict(kwargs)
    effort = params.get("reasoning_effort")
    if effort is not None:
        if not isinstance(effort, str) or not effort:
            raise ParamError("reasoning_effort", f"{effort!r} is not a string such as \"low\", "
                             "\"medium\" or \"high\"")
        if kwargs.get("reasoning_effort", effort) != effort:
            raise ParamError("reasoning_effort", f"{effort!r} differs from chat_template_kwargs."
                             f"reasoning_effort {kwargs['reasoning_effort']!r}: send one of them")
        kwargs["reasoning_effort"] = effort
        # An OpenAI parameter is honoured or refused: the template must read it.
        req.chat.template_kwargs_required.append("reasoning_effort")
    if kwargs:
        req.chat.template_kwargs_json = json.dumps(kwargs)


def _set_prompt(req: types_pb2.GenerateRequest, prompt: object) -> None:
    # OpenAI accepts a batch of prompts; ortserve serves one request per call.
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        req.text = prompt
        return
    if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
        if any(t < 0 or t > UINT32_MAX for t in prompt):
            raise ParamError("prompt", "token ids must be from 0 to 4,294,967,295")
        req.token_ids.ids.extend(prompt)
        return
    raise ParamError("prompt", "must be one string or one list of token ids (a batch of "
                     "prompts is not supported: send one request per prompt)")


def _set_limits(kind: Kind, req: types_pb2.GenerateRequest, params: Mapping[str, Any]) -> None:
    max_tokens = int_param(params, "max_tokens", 1, UINT32_MAX)
    if kind == "chat":
        newer = int_param(params, "max_completion_tokens", 1, UINT32_MAX)
        if max_tokens is not None and newer is not None and max_tokens != newer:
            raise ParamError("max_completion_tokens", f"{newer:,} differs from max_tokens "
                             f"{max_tokens:,}: send one of them")
        max_tokens = newer if newer is not None else max_tokens
    # Unset stays unset: the scheduler resolves it to the remaining context
    # window and, if the budget is short, caps it and says so.
    if max_tokens is not None:
        req.max_new_tokens = max_tokens
    min_tokens = int_param(params, "min_tokens", 0, UINT32_MAX)
    if min_tokens is not None:
        req.min_new_tokens = min_tokens
    queue_wait_ms = int_param(params, "max_queue_wait_ms", 0, UINT32_MAX)
    if queue_wait_ms is not None:
        req.max_queue_wait_ms = queue_wait_ms


def _set_sampling(req: types_pb2.GenerateRequest, params: Mapping[str, Any]) -> None:
    temperature = number_param(params, "temperature", OPENAI_DEFAULT_TEMPERATURE)
    if temperature < 0:
        raise ParamError("temperature", f"{temperature:g} is below 0 (0 is greedy decoding)")
    req.sampling.temperature = temperature
    top_p = number_param(params, "top_p", None)
    # top_p == 1 keeps every token: it is the same request as leaving it unset.
    if top_p is not None and top_p != 1:
        req.sampling.top_p = top_p
    seed = int_param(params, "seed", 0, UINT64_MAX)
    if seed is not None:
        req.sampling.seed = seed
    top_k = int_param(params, "top_k", 0, UINT32_MAX)
    if top_k is not None:
        req.sampling.top_k = top_k
    penalty = number_param(params, "repetition_penalty", None)
    if penalty is not None:
        req.sampling.repetition_penalty = penalty
    # The ranges are the scheduler's rule (request_rules.sampling): one source of truth.
    for key in ("presence_penalty", "frequency_penalty", "min_p"):
        value = number_param(params, key, None)
        if value is not None:
            setattr(req.sampling, key, value)
    bias = params.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, Mapping):
            raise ParamError("logit_bias", "must be an object of token id -> bias")
        for token, value in bias.items():
            token_id = _token_key(token)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ParamError(f"logit_bias[{token}]", f"{value!r} is not a number")
            req.sampling.logit_bias[token_id] = float(value)


def _token_key(token: object) -> int:
    """A logit_bias key: a token id as JSON writes object keys (a string of digits)."""
    text = str(token)
    if not text.isdigit() or int(text) > UINT32_MAX:
        raise ParamError(f"logit_bias[{text}]", "keys must be token ids (\"15339\"), from 0 "
                         "to 4,294,967,295")
    return int(text)


def _set_logprobs(kind: Kind, req: types_pb2.GenerateRequest, params: Mapping[str, Any]) -> None:
    """Chat: logprobs (bool) + top_logprobs (int, needs logprobs). Completions: logprobs
    (int, the alternatives per token). The bound (20) is the scheduler's rule."""
    if kind == "completion":
        top = int_param(params, "logprobs", 0, UINT32_MAX)
        if top is not None:
            req.logprobs.top_logprobs = top
        return
    wanted = bool_param(params, "logprobs", False)
    top = int_param(params, "top_logprobs", 0, UINT32_MAX)
    if top is not None and not wanted:
        raise ParamError("top_logprobs", "needs logprobs: true (as in OpenAI's API)")
    if wanted:
        req.logprobs.top_logprobs = top or 0


def _drop_greedy_no_ops(req: types_pb2.GenerateRequest, params: Mapping[str, Any]
                        ) -> dict[str, str]:
    """At temperature 0 the argmax is always kept: seed, top_p < 1, top_k and min_p cannot
    change the result, so they are dropped (the scheduler would refuse them as ignored)
    and reported as resolved."""
    if req.sampling.temperature != 0:
        return {}
    resolved = {}
    for key in _GREEDY_NO_OPS:
        if req.sampling.HasField(key):
            resolved[key] = (f"{params.get(key)!r} not applied: temperature 0 is greedy "
                             "decoding, which always takes the most likely token")
            req.sampling.ClearField(key)
    return resolved


def _stop_list(stop: object) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise ParamError("stop", "must be a string or a list of strings")


def _usage_options(params: Mapping[str, Any], stream: bool) -> tuple[bool, bool]:
    """stream_options: (include_usage, continuous_usage_stats)."""
    options = params.get("stream_options")
    if options is None:
        return False, False
    if not stream:
        raise ParamError("stream_options", "is only allowed when stream is true")
    if not isinstance(options, Mapping) or set(options) - {"include_usage",
                                                           "continuous_usage_stats"}:
        raise ParamError("stream_options", "only {'include_usage': bool, "
                         "'continuous_usage_stats': bool} are supported",
                         code="unsupported_parameter")
    include = bool_param(options, "include_usage", False, where="stream_options.include_usage")
    continuous = bool_param(options, "continuous_usage_stats", False,
                       where="stream_options.continuous_usage_stats")
    if continuous and not include:
        # vLLM sends the per-chunk usage only with include_usage: alone it changes nothing.
        raise ParamError("stream_options.continuous_usage_stats", "needs include_usage: true "
                         "(as in vLLM, where it alone adds nothing)")
    return include, continuous


def _best_of(params: Mapping[str, Any], n: int) -> None:
    """best_of equal to n is the same request; any other is refused, saying what is."""
    best_of = int_param(params, "best_of", 1, MAX_CHOICES)
    if best_of is not None and best_of != n:
        raise ParamError("best_of", f"best_of {best_of} with n {n} is not supported: ortserve "
                         f"returns every candidate it generates and ranks none by log "
                         f"probability, so only best_of equal to n ({n}) is taken; drop "
                         f"best_of, or ask for n {best_of} choices and pick one yourself")
