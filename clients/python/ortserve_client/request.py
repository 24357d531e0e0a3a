"""build_request: a GenerateRequest from keyword arguments (pure: no grpc, no channel).

It checks only the shapes a keyword call cannot express (one constraint, one cap
policy); every value is the server's to judge: an INVALID_ARGUMENT names the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from ortserve.v1 import types_pb2


def build_request(
    prompt: str | Sequence[int] | Sequence[tuple[str, str]] | None = None,
    *,
    chat: Sequence[tuple[str, str]] | None = None,
    max_new_tokens: int | None = None,
    min_new_tokens: int = 0,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    min_p: float | None = None,
    logit_bias: Mapping[int, float] | None = None,
    json_schema: Mapping | str | None = None,
    json_object: bool = False,
    regex: str | None = None,
    grammar: str | None = None,
    logprobs: int | None = None,
    stop: Sequence[str] = (),
    strict: bool = False,
    wait_full: bool = False,
    max_queue_wait_ms: int | None = None,
    request_id: str = "",
    model: str = "",
    adapter: str = "",
    stream_interval_ms: int = 0,
    priority: int | None = None,
    speculative: bool = True,
    max_itl_ms: int = 0,
    max_ttft_ms: int = 0,
) -> types_pb2.GenerateRequest:
    """A GenerateRequest: `prompt` is text or token ids; `chat` is (role, content) turns.

    `model`: the served model to answer with (`Client.budget().models` lists them); empty:
    the cluster's one model (refused, listing them, while its workers serve several).
    `adapter`: a LoRA adapter of that model to run under (`Client.budget().models[].adapters`
    lists them; docs/features/lora.md); empty: the base.
    `stream_interval_ms`: the shortest time between two chunks (the tokens meanwhile come
    as one chunk: fewer messages; the first token is never held); 0: each as it comes.
    `presence_penalty`, `frequency_penalty`, `min_p`, `logit_bias` (token id -> bias): the
    SamplingParams fields of those names (docs/gateway.md#parameters).
    At most one constraint (docs/features/structured-output.md): `json_schema` (a dict, or JSON
    text sent as it is), `json_object=True`, `regex` or `grammar` (llguidance's Lark).
    `logprobs`: None, none asked; 0, each token's own log-probability; N, also the N most
    likely alternatives (0 to 20; TextChunk.logprobs, GenerateResult.logprobs).
    `priority`: the admission queue's order, lower sooner (unset: 0; docs/features/tenants.md).
    `speculative=False`: no speculative decoding for this request (disable_speculation);
    True: the worker's --speculative decides (GenerateResult.speculation says what ran).
    `max_itl_ms`, `max_ttft_ms`: latency goals for admission (docs/features/time-budget.md);
    0: the scheduler's default goals (none unless it sets --max-itl-ms / --max-ttft-ms).
    """
    req = types_pb2.GenerateRequest(request_id=request_id, min_new_tokens=min_new_tokens,
                                    stop=list(stop), model=model, adapter=adapter,
                                    stream_interval_ms=stream_interval_ms,
                                    disable_speculation=not speculative,
                                    max_itl_ms=max_itl_ms, max_ttft_ms=max_ttft_ms)
    if chat is not None:
        req.chat.messages.extend(types_pb2.ChatMessage(role=r, content=c) for r, c in chat)
    elif isinstance(prompt, str):
        req.text = prompt
    elif prompt is not None:
        req.token_ids.ids.extend(prompt)
    if max_new_tokens is not None:
        req.max_new_tokens = max_new_tokens
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                        ("seed", seed), ("repetition_penalty", repetition_penalty),
                        ("presence_penalty", presence_penalty),
                        ("frequency_penalty", frequency_penalty), ("min_p", min_p)):
        if value is not None:
            setattr(req.sampling, name, value)
    if logit_bias:
        req.sampling.logit_bias.update({int(k): float(v) for k, v in logit_bias.items()})
    constraint = build_constraint(json_schema=json_schema, json_object=json_object, regex=regex,
                                  grammar=grammar)
    if constraint is not None:
        req.constraint.CopyFrom(constraint)
    if logprobs is not None:
        req.logprobs.CopyFrom(types_pb2.LogprobsOptions(top_logprobs=logprobs))
    if strict and wait_full:
        raise ValueError("strict and wait_full exclude each other: strict never caps, "
                         "wait_full caps when its wait runs out")
    if strict:
        req.cap_policy = types_pb2.CAP_POLICY_STRICT
    if wait_full:
        req.cap_policy = types_pb2.CAP_POLICY_WAIT_FULL
    if max_queue_wait_ms is not None:
        req.max_queue_wait_ms = max_queue_wait_ms
    if priority is not None:
        req.priority = priority
    return req


def build_constraint(*, json_schema: Mapping | str | None = None, json_object: bool = False,
                     regex: str | None = None, grammar: str | None = None
                     ) -> types_pb2.Constraint | None:
    """The one constraint asked for, or None; two or more raise ValueError naming them."""
    kinds = {"json_schema": json_schema, "json_object": json_object or None, "regex": regex,
             "grammar": grammar}
    asked = [name for name, value in kinds.items() if value is not None]
    if len(asked) > 1:
        raise ValueError(f"{' and '.join(asked)} exclude each other: a request has one "
                         "constraint (GenerateRequest.constraint is a oneof); pass one of them")
    if not asked:
        return None
    name = asked[0]
    value = kinds[name]
    if name == "json_schema" and not isinstance(value, str):
        value = json.dumps(value)
    return types_pb2.Constraint(**{name: value})
