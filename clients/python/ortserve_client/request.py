"""build_request: a GenerateRequest from keyword arguments (pure: no grpc, no channel)."""

from __future__ import annotations

from collections.abc import Sequence

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
    stop: Sequence[str] = (),
    strict: bool = False,
    wait_full: bool = False,
    max_queue_wait_ms: int | None = None,
    request_id: str = "",
    model: str = "",
    stream_interval_ms: int = 0,
) -> types_pb2.GenerateRequest:
    """A GenerateRequest: `prompt` is text or token ids; `chat` is (role, content) turns.

    `model`: the served model to answer with (`Client.budget().models` lists them); empty:
    the cluster's one model (refused, listing them, while its workers serve several).
    `stream_interval_ms`: the shortest time between two chunks (the tokens meanwhile come
    as one chunk: fewer messages; the first token is never held); 0: each as it comes.
    """
    req = types_pb2.GenerateRequest(request_id=request_id, min_new_tokens=min_new_tokens,
                                    stop=list(stop), model=model,
                                    stream_interval_ms=stream_interval_ms)
    if chat is not None:
        req.chat.messages.extend(types_pb2.ChatMessage(role=r, content=c) for r, c in chat)
    elif isinstance(prompt, str):
        req.text = prompt
    elif prompt is not None:
        req.token_ids.ids.extend(prompt)
    if max_new_tokens is not None:
        req.max_new_tokens = max_new_tokens
    for name, value in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p),
                        ("seed", seed), ("repetition_penalty", repetition_penalty)):
        if value is not None:
            setattr(req.sampling, name, value)
    if strict and wait_full:
        raise ValueError("strict and wait_full exclude each other: strict never caps, "
                         "wait_full caps when its wait runs out")
    if strict:
        req.cap_policy = types_pb2.CAP_POLICY_STRICT
    if wait_full:
        req.cap_policy = types_pb2.CAP_POLICY_WAIT_FULL
    if max_queue_wait_ms is not None:
        req.max_queue_wait_ms = max_queue_wait_ms
    return req
