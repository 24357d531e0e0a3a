"""Every rule about a request, written once; both edges call them with one wording.

The scheduler and the worker are each a wall a caller reaches (a worker's port
serves anyone holding a lease), so each checks what it is sent. A rule raises
`InvalidField` (INVALID_REQUEST) naming the proto path under `prefix` (e.g.
"request." inside an AdmitRequest), or the error of its own reason
(`ContextWindowFull`, `LeaseMismatch`).

Pure: no grpc or protobuf import, so the worker's core uses the same rules.
`generate_request` reads a GenerateRequest through its own methods
(WhichOneof, HasField, its descriptor).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ortserve.output import constraint_grammar as constraints
from ortserve.output import tool_calls, tool_formats
from ortserve.rules.chat_roles import CHAT_ROLES
from ortserve.status.errors import ContextWindowFull, InvalidField, LeaseMismatch, quoted
from ortserve.status.units import tokens

MAX_REQUEST_ID_CHARS = 256
# The gRPC metadata a trusted gateway charges a call to a tenant with (docs/features/tenants.md).
TENANT_METADATA = "ortserve-tenant"
MAX_LEASE_ID_CHARS = 128
MAX_WORKER_ID_CHARS = 128
MAX_ADDRESS_CHARS = 256
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 16
MAX_TEMPLATE_KWARGS_CHARS = 16_384
MAX_CHAT_MESSAGES = 1_024
# A chunk at least this often: a longer hold would read as a stalled stream.
MAX_STREAM_INTERVAL_MS = 10_000
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "seed", "repetition_penalty",
                   "presence_penalty", "frequency_penalty", "min_p")
# OpenAI's ranges, so a request that OpenAI accepts is accepted here.
MAX_ABS_PENALTY = 2.0  # presence_penalty and frequency_penalty
MAX_ABS_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_TOP_LOGPROBS = 20

_GREEDY_HINT = "set temperature > 0 to sample, or drop {name} (greedy decoding has no use for it)"


def bounded(field: str, value: str, limit: int) -> None:
    """A caller string at most `limit` characters (no message or log line echoes more)."""
    if len(value) > limit:
        raise InvalidField(field, f"is {len(value):,} characters, more than the {limit:,} allowed; "
                           "send a shorter value", length=len(value), limit=limit)


# -- the whole request, as it arrives -------------------------------------------------


def generate_request(request: Any, prefix: str = "") -> None:
    """Every rule a GenerateRequest alone is held to, before anything is counted or
    reserved: its shape, the stop list, the new-token bounds, the sampling ranges and
    the output constraint (compiled without the vocabulary: a schema the library
    cannot compile is refused here).

    The scheduler calls this; the worker calls `request_shape` and leaves the rest to
    its SequenceRequest, which holds the same rules for direct callers of its engine.
    """
    request_shape(request, prefix)
    stop_sequences(request.stop, prefix)
    stop_tokens(request.stop_token_ids, request.ignore_eos,
                request.HasField("constraint"), prefix)
    new_tokens(request.max_new_tokens if request.HasField("max_new_tokens") else None,
               request.min_new_tokens, prefix)
    sampling(**sampling_values(request.sampling), prefix=prefix)
    constraint(constraint_spec(request, prefix), prefix)
    if request.HasField("logprobs"):
        top_logprobs(request.logprobs.top_logprobs, prefix)


def request_shape(request: Any, prefix: str = "") -> None:
    """The request id's length, the prompt's shape (chat roles included), the cap policy,
    the stream interval."""
    bounded(prefix + "request_id", request.request_id, MAX_REQUEST_ID_CHARS)
    prompt(request, prefix)
    policies = request.DESCRIPTOR.fields_by_name["cap_policy"].enum_type.values_by_number
    if request.cap_policy not in policies:
        names = [value.name for n, value in sorted(policies.items()) if n]  # 0: unspecified
        raise InvalidField(prefix + "cap_policy", f"{request.cap_policy} is not a CapPolicy: use "
                           f"{', '.join(names[:-1])} or {names[-1]}")
    stream_interval(request.stream_interval_ms, prefix)
    if hasattr(request, "preferred_worker_id"):
        bounded(prefix + "preferred_worker_id", request.preferred_worker_id, MAX_WORKER_ID_CHARS)
    keep_prefix(getattr(request, "keep_prefix_s", 0.0), prefix)


MAX_KEEP_PREFIX_S = 86_400.0  # a day: a stored response's TTL is an hour by default


def keep_prefix(keep_s: float, prefix: str = "") -> None:
    """How long a request's prompt and answer stay in the prefix cache: 0 up to a day."""
    if not (math.isfinite(keep_s) and 0 <= keep_s <= MAX_KEEP_PREFIX_S):
        raise InvalidField(prefix + "keep_prefix_s", f"is {keep_s:g}; give 0 (not kept) up to "
                           f"{MAX_KEEP_PREFIX_S:,.0f} seconds", keep_prefix_s=keep_s,
                           limit_s=MAX_KEEP_PREFIX_S)


def stream_interval(interval_ms: int, prefix: str = "") -> None:
    """The chunk interval a request asks for: 0 (every token as it comes) up to the bound."""
    if interval_ms > MAX_STREAM_INTERVAL_MS:
        raise InvalidField(prefix + "stream_interval_ms",
                           f"is {interval_ms:,} ms, more than the {MAX_STREAM_INTERVAL_MS:,} ms "
                           "allowed; ask for at most that (0: every token as it comes)",
                           stream_interval_ms=interval_ms, limit_ms=MAX_STREAM_INTERVAL_MS)


def sampling_values(params: Any) -> dict[str, Any]:
    """A SamplingParams message's set fields as keyword arguments (None: unset; the
    logit_bias map as a dict, empty when unset)."""
    values = {name: getattr(params, name) if params.HasField(name) else None
              for name in SAMPLING_FIELDS}
    values["logit_bias"] = dict(params.logit_bias)
    return values


def prompt(request: Any, prefix: str = "") -> None:
    """One prompt is set; token ids and chat turns are not empty; every chat role is known."""
    kind = request.WhichOneof("prompt")
    if kind is None:
        raise InvalidField(prefix + "prompt", "is missing: set one of text, token_ids or chat")
    if kind == "token_ids" and not request.token_ids.ids:
        raise InvalidField(prefix + "token_ids.ids", "is empty: send at least one token id")
    if kind == "chat":
        chat_roles([turn.role for turn in request.chat.messages], prefix)
        for i, turn in enumerate(request.chat.messages):
            tool_calls.check_turn(turn.role, turn.tool_calls, turn.tool_call_id,
                                  f"{prefix}chat.messages[{i}]")
        tool_calls.check_tools(request.chat.tools, prefix)
        template_kwargs(request.chat.template_kwargs_json, prefix)


def template_kwargs(text: str, prefix: str = "") -> dict[str, Any]:
    """chat.template_kwargs_json: empty, or a JSON object (its names are the worker's to
    check against the template it has)."""
    if not text:
        return {}
    where = prefix + "chat.template_kwargs_json"
    bounded(where, text, MAX_TEMPLATE_KWARGS_CHARS)
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise InvalidField(where, f"is not JSON ({exc}); send an object of template "
                           "variables, e.g. {\"enable_thinking\": false}") from None
    if not isinstance(value, dict):
        raise InvalidField(where, "is not a JSON object; send an object of template variables")
    return value


def constraint_spec(request: Any, prefix: str = "", tool_format: str = "hermes"
                    ) -> constraints.ConstraintSpec | None:
    """A GenerateRequest's `constraint` as a spec (None: unset); a set message with no kind,
    or json_object false, is refused (it would otherwise be ignored). `tool_format`: the
    tool-call format of the model's template (ortserve/output/tool_formats.py), which a tool_call
    constraint's grammar enforces; the scheduler, which has no template, checks Hermes'
    (the same schemas compile the same in every format)."""
    if not request.HasField("constraint"):
        return None
    kind = request.constraint.WhichOneof("kind")
    if kind is None:
        raise InvalidField(prefix + "constraint", "is set but empty: set one of "
                           f"{', '.join(constraints.KINDS)}, or leave the constraint unset")
    if kind == "json_object":
        if not request.constraint.json_object:
            raise InvalidField(prefix + "constraint.json_object", "is false: set it true for any "
                               "JSON object, or leave the constraint unset for free text")
        return constraints.ConstraintSpec(kind)
    if kind == "tool_call":
        # The grammar is built here from the chat's tools, so both edges compile the same text.
        choice = request.constraint.tool_call
        tools = request.chat.tools if request.WhichOneof("prompt") == "chat" else []
        tool_calls.check_choice(tools, choice.function_name, prefix)
        answer = _answer_schema(choice, tool_format, prefix)
        return constraints.ConstraintSpec(kind, tool_formats.grammar(
            tool_format, tools, choice.function_name, choice.parallel, choice.allow_text,
            answer))
    return constraints.ConstraintSpec(kind, getattr(request.constraint, kind))


def _answer_schema(choice: Any, tool_format: str, prefix: str) -> str:
    """ToolCallConstraint.answer_json_schema, checked: a schema that compiles, with
    allow_text, in the one format that can tell an answer from a call."""
    answer = choice.answer_json_schema
    if not answer:
        return ""
    field = prefix + "constraint.tool_call.answer_json_schema"
    if not choice.allow_text:
        raise InvalidField(field, "needs allow_text (tool_choice \"auto\"): with calls "
                           "required there is no answer to shape")
    if tool_format != "hermes":
        raise InvalidField(field, f"is not supported with this model's {tool_format} "
                           "tool-call format (its calls are JSON too, so an answer could not "
                           "be told from one); send the tools without response_format, or "
                           "response_format with tool_choice \"none\"")
    why = constraints.schema_error(answer)
    if why:
        raise InvalidField(field, why)
    return answer


# -- one rule each ---------------------------------------------------------------------


def constraint(spec: constraints.ConstraintSpec | None, prefix: str = "") -> None:
    """The output constraint compiles (llguidance, no vocabulary needed); None: unset."""
    if spec is not None:
        constraints.check(spec, prefix)



def chat_roles(roles: Sequence[str], prefix: str = "") -> None:
    """At least one turn, at most MAX_CHAT_MESSAGES, each with a role the template knows."""
    if not roles:
        raise InvalidField(prefix + "chat.messages", "is empty: send at least one turn")
    if len(roles) > MAX_CHAT_MESSAGES:
        raise InvalidField(prefix + "chat.messages", f"has {len(roles):,} turns, more than "
                           f"{MAX_CHAT_MESSAGES:,}; send fewer", count=len(roles))
    for i, role in enumerate(roles):
        if role not in CHAT_ROLES:
            raise InvalidField(prefix + f"chat.messages[{i}].role",
                               f"{quoted(role)} is not a role: use one of {', '.join(CHAT_ROLES)}")


def stop_sequences(stop: Sequence[str], prefix: str = "") -> None:
    """At most MAX_STOP_SEQUENCES, none empty (it would stop at once), none too long."""
    if len(stop) > MAX_STOP_SEQUENCES:
        raise InvalidField(prefix + "stop", f"has {len(stop):,} sequences, more than "
                           f"{MAX_STOP_SEQUENCES}; send fewer", count=len(stop))
    for i, text in enumerate(stop):
        if not text:
            raise InvalidField(prefix + f"stop[{i}]", "is empty: an empty stop sequence would "
                               "stop at once; remove it")
        bounded(prefix + f"stop[{i}]", text, MAX_STOP_CHARS)


def stop_tokens(stop_token_ids: Sequence[int], ignore_eos: bool, constrained: bool,
                prefix: str = "") -> None:
    """At most MAX_STOP_TOKEN_IDS stop ids; ignore_eos not with a constraint (a constraint
    ends with EOS once complete, so ignoring EOS would leave it nothing to generate)."""
    if len(stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidField(prefix + "stop_token_ids", f"has {len(stop_token_ids):,} ids, more "
                           f"than {MAX_STOP_TOKEN_IDS}; send fewer", count=len(stop_token_ids))
    if ignore_eos and constrained:
        raise InvalidField(prefix + "ignore_eos", "cannot be combined with a constraint: a "
                           "constrained output ends with EOS once complete; drop one of them")


def stop_token_ids_in_vocab(token_ids: Iterable[int], vocab_size: int, prefix: str = "") -> None:
    """Every stop token id is in [0, vocab_size): one outside could never be generated."""
    for token in token_ids:
        if not 0 <= token < vocab_size:
            raise InvalidField(prefix + "stop_token_ids", f"token id {token:,} is outside the "
                               f"model's vocabulary [0, {vocab_size:,}); send ids from this "
                               "model's tokenizer", token_id=token, vocab_size=vocab_size)


def prompt_tokens(count: int, prefix: str = "") -> None:
    """A counted prompt has at least one token (a text can tokenize to none)."""
    if count < 1:
        raise InvalidField(prefix + "prompt", f"is empty ({count} tokens): send some text or "
                           "token ids", prompt_tokens=count)


def new_tokens(max_new_tokens: int | None, min_new_tokens: int, prefix: str = "") -> None:
    """max_new_tokens >= 1 when set (None: unset); 0 <= min_new_tokens <= max_new_tokens."""
    if max_new_tokens is not None and max_new_tokens < 1:
        raise InvalidField(prefix + "max_new_tokens", f"must be >= 1 when set, got "
                           f"{max_new_tokens}; leave it unset for the remaining context window")
    if min_new_tokens < 0:
        raise InvalidField(prefix + "min_new_tokens", f"must be >= 0, got {min_new_tokens}")
    if max_new_tokens is not None and min_new_tokens > max_new_tokens:
        raise InvalidField(
            prefix + "min_new_tokens", f"({min_new_tokens:,}) must not exceed max_new_tokens "
            f"({max_new_tokens:,}); lower min_new_tokens or raise max_new_tokens",
            min_new_tokens=min_new_tokens, max_new_tokens=max_new_tokens)


def top_logprobs(count: int, prefix: str = "") -> None:
    """The alternatives asked per token: 0 to MAX_TOP_LOGPROBS (each costs a partition of
    the vocabulary and a detokenization per token)."""
    if not 0 <= count <= MAX_TOP_LOGPROBS:
        raise InvalidField(prefix + "logprobs.top_logprobs", f"is {count:,}, more than the "
                           f"{MAX_TOP_LOGPROBS} alternatives per token allowed; ask for at most "
                           f"{MAX_TOP_LOGPROBS}", top_logprobs=count, limit=MAX_TOP_LOGPROBS)


def sampling(temperature: float | None = None, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None,
             repetition_penalty: float | None = None, presence_penalty: float | None = None,
             frequency_penalty: float | None = None, min_p: float | None = None,
             logit_bias: Mapping[int, float] | None = None, prefix: str = "") -> None:
    """Every sampling parameter is honoured or refused, never ignored (None: unset).

    Ranges first, then what greedy decoding (temperature unset or 0) has no use for.
    """
    def bad(name: str, message: str) -> InvalidField:
        return InvalidField(prefix + "sampling." + name, message)

    t = temperature
    if t is not None and (not math.isfinite(t) or t < 0):
        raise bad("temperature", f"temperature must be a finite number >= 0, got {t}; "
                  "use 0 (or leave it unset) for greedy decoding")
    if top_k is not None and top_k < 0:
        raise bad("top_k", f"top_k must be >= 0 (0: no limit), got {top_k}")
    p = top_p
    if p is not None and not (math.isfinite(p) and 0 < p <= 1):
        raise bad("top_p", f"top_p must be in (0, 1], got {p}; "
                  "use 1 (or leave it unset) for no nucleus limit")
    if seed is not None and seed < 0:
        raise bad("seed", f"seed must be >= 0, got {seed}")
    r = repetition_penalty
    if r is not None and not (math.isfinite(r) and r > 0):
        raise bad("repetition_penalty", f"repetition_penalty must be a finite number > 0, "
                  f"got {r}; use 1 (or leave it unset) for no penalty")
    for name, value in (("presence_penalty", presence_penalty),
                        ("frequency_penalty", frequency_penalty)):
        if value is not None and not (math.isfinite(value) and abs(value) <= MAX_ABS_PENALTY):
            raise bad(name, f"{name} must be in [-{MAX_ABS_PENALTY:g}, {MAX_ABS_PENALTY:g}] "
                      f"(OpenAI's range), got {value}; use 0 (or leave it unset) for none")
    if min_p is not None and not (math.isfinite(min_p) and 0 <= min_p <= 1):
        raise bad("min_p", f"min_p must be in [0, 1], got {min_p}; use 0 (or leave it unset) "
                  "for no limit")
    _logit_bias(logit_bias or {}, bad)
    if t is None or t == 0:
        if top_k:
            raise bad("top_k", f"top_k={top_k} with greedy decoding; "
                      + _GREEDY_HINT.format(name="top_k"))
        if p is not None and p < 1:
            raise bad("top_p", f"top_p={p} with greedy decoding; " + _GREEDY_HINT.format(name="top_p"))
        if seed is not None:
            raise bad("seed", f"seed={seed} with greedy decoding; " + _GREEDY_HINT.format(name="seed"))
        if min_p:
            raise bad("min_p", f"min_p={min_p} with greedy decoding; "
                      + _GREEDY_HINT.format(name="min_p"))


def _logit_bias(bias: Mapping[int, float], bad: Any) -> None:
    """At most MAX_LOGIT_BIAS_ENTRIES ids, each bias finite and within OpenAI's range (the
    ids' vocabulary is the model's rule: `logit_bias_in_vocab`)."""
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise bad("logit_bias", f"has {len(bias):,} entries, more than the "
                  f"{MAX_LOGIT_BIAS_ENTRIES} allowed; bias fewer tokens")
    for token, value in sorted(bias.items()):
        if not (math.isfinite(value) and abs(value) <= MAX_ABS_LOGIT_BIAS):
            raise bad(f"logit_bias[{token}]", f"bias {value} for token {token:,} is outside "
                      f"[-{MAX_ABS_LOGIT_BIAS:g}, {MAX_ABS_LOGIT_BIAS:g}] (OpenAI's range); "
                      "-100 bans a token, 100 forces it")


# -- rules that need the model ---------------------------------------------------------


def token_ids_in_vocab(ids: Sequence[int], vocab_size: int, prefix: str = "",
                       field: str = "token_ids.ids") -> None:
    """Every id in [0, vocab_size), naming the first that is not (`token_ids.ids[i]`, or
    `field[i]`)."""
    # min/max run in C: the per-id scan only happens to name a bad one.
    if not ids or (min(ids) >= 0 and max(ids) < vocab_size):
        return
    i, token = next((i, t) for i, t in enumerate(ids) if not 0 <= t < vocab_size)
    raise InvalidField(prefix + f"{field}[{i}]",
                       f"token id {token:,} is outside the model's vocabulary [0, {vocab_size:,}); "
                       "send ids from this model's tokenizer", token_id=token,
                       vocab_size=vocab_size)


def logit_bias_in_vocab(token_ids: Iterable[int], vocab_size: int, prefix: str = "") -> None:
    """Every biased token id is in [0, vocab_size): a bias on no token would be ignored."""
    for token in sorted(token_ids):
        if not 0 <= token < vocab_size:
            raise InvalidField(prefix + f"sampling.logit_bias[{token}]",
                               f"token id {token:,} is outside the model's vocabulary "
                               f"[0, {vocab_size:,}); bias ids from this model's tokenizer",
                               token_id=token, vocab_size=vocab_size)


def context_window(prompt_count: int, max_new_tokens: int, context_length: int,
                   min_new_tokens: int = 0) -> None:
    """The prompt and max_new_tokens fit the model's context window (the prompt alone
    filling it is an error too, never an empty turn).

    `min_new_tokens` lets the error name the caller's own field: an unset
    max_new_tokens is resolved to at least min_new_tokens, and a refusal must
    name the floor the caller set, not a ceiling it never sent.
    """
    if prompt_count >= context_length or prompt_count + max_new_tokens > context_length:
        raise ContextWindowFull(prompt_count, max_new_tokens, context_length, min_new_tokens)


def lease_match(lease_id: str, prompt_count: int, max_new_tokens: int,
                lease_prompt_tokens: int, lease_max_new_tokens: int) -> None:
    """The request is the one its lease was admitted for: the same prompt length (0: not
    checked) and no more new tokens. The refused request leaves the lease usable."""
    if prompt_count and prompt_count != lease_prompt_tokens:
        raise LeaseMismatch(
            "prompt", f"the prompt is {tokens(prompt_count)} but lease {quoted(lease_id)} was "
            f"admitted for {tokens(lease_prompt_tokens)}; send the request you admitted (the "
            "lease is still usable)", lease_id,
            prompt_tokens=prompt_count, lease_prompt_tokens=lease_prompt_tokens)
    if max_new_tokens > lease_max_new_tokens:
        raise LeaseMismatch(
            "max_new_tokens", f"{max_new_tokens:,} exceeds lease {quoted(lease_id)}'s admitted "
            f"{lease_max_new_tokens:,}; ask for at most that, or admit again (the lease is "
            "still usable)", lease_id,
            max_new_tokens=max_new_tokens, lease_max_new_tokens=lease_max_new_tokens)
