"""Protobuf <-> engine types for the worker; the only place the engine meets the wire."""

from __future__ import annotations

from ortserve.v1 import types_pb2

from .engine import Completed, Engine, SequenceRequest
from .errors import InvalidRequest
from .sampling import SamplingConfig

_FINISH = {
    "length": types_pb2.LENGTH,
    "eos": types_pb2.EOS,
    "stop_sequence": types_pb2.STOP_SEQUENCE,
}


def sampling_from_pb(pb: types_pb2.SamplingParams) -> SamplingConfig:
    def opt(name: str):
        return getattr(pb, name) if pb.HasField(name) else None

    return SamplingConfig(temperature=opt("temperature"), top_k=opt("top_k"), top_p=opt("top_p"),
                          seed=opt("seed"), repetition_penalty=opt("repetition_penalty"))


def sampling_to_pb(config: SamplingConfig, seed: int | None) -> types_pb2.SamplingParams:
    pb = types_pb2.SamplingParams()
    for name in ("temperature", "top_k", "top_p", "repetition_penalty"):
        value = getattr(config, name)
        if value is not None:
            setattr(pb, name, value)
    if seed is not None:
        pb.seed = seed
    return pb


def prompt_ids(engine: Engine, request: types_pb2.GenerateRequest) -> list[int]:
    """The request's prompt as token ids; validates ids and the rest of the request."""
    kind = request.WhichOneof("prompt")
    if kind == "text":
        ids = engine.tokenizer.encode(request.text)
    elif kind == "token_ids":
        ids = list(request.token_ids.ids)
        vocab = engine.spec.vocab_size
        bad = [i for i in ids if i >= vocab]
        if bad:
            raise InvalidRequest("token_ids", f"token id {bad[0]} is outside the model's vocabulary "
                                 f"of {vocab:,} ids ({len(bad)} such ids)")
    elif kind == "chat":
        if not request.chat.messages:
            raise InvalidRequest("chat.messages", "chat has no messages: add at least one turn")
        ids = engine.tokenizer.encode_chat([(m.role, m.content) for m in request.chat.messages])
    else:
        raise InvalidRequest("prompt", "request has no prompt: set one of text, token_ids or chat")
    if not ids:
        raise InvalidRequest("prompt", "the prompt is empty (0 tokens): send some text or token ids")
    for i, stop in enumerate(request.stop):
        if not stop:
            raise InvalidRequest(f"stop[{i}]", "stop sequences must not be empty strings")
    if request.HasField("max_new_tokens") and request.max_new_tokens < 1:
        raise InvalidRequest("max_new_tokens", "max_new_tokens must be >= 1 (or unset for the "
                             "remaining context window)")
    if request.HasField("max_new_tokens") and request.min_new_tokens > request.max_new_tokens:
        raise InvalidRequest("min_new_tokens", f"min_new_tokens {request.min_new_tokens:,} exceeds "
                             f"max_new_tokens {request.max_new_tokens:,}")
    sampling_from_pb(request.sampling).validate()
    return ids


def sequence_request(request: types_pb2.GenerateRequest, ids: list[int],
                     max_new_tokens: int) -> SequenceRequest:
    return SequenceRequest(
        request_id=request.request_id,
        prompt_ids=tuple(ids),
        max_new_tokens=max_new_tokens,
        min_new_tokens=request.min_new_tokens,
        sampling=sampling_from_pb(request.sampling),
        stop=tuple(request.stop),
    )


def finished_to_pb(done: Completed, sampling: SamplingConfig, lease: types_pb2.Lease,
                   worker_id: str, provider: str) -> types_pb2.Finished:
    pb = types_pb2.Finished(
        finish_reason=_FINISH[done.finish_reason],
        stop_sequence=done.stop_sequence,
        usage=types_pb2.Usage(prompt_tokens=done.prompt_tokens,
                              generated_tokens=done.generated_tokens,
                              max_new_tokens=done.max_new_tokens),
        timings=types_pb2.Timings(queue_ms=done.queue_ms, prefill_ms=done.prefill_ms,
                                  ttft_ms=done.ttft_ms, decode_ms=done.decode_ms,
                                  decode_tokens_per_s=done.decode_tokens_per_s,
                                  total_ms=done.total_ms),
        sampling=sampling_to_pb(sampling, done.seed),
        worker_id=worker_id,
        execution_provider=provider,
    )
    if lease.HasField("budget_cap"):
        pb.budget_cap.CopyFrom(lease.budget_cap)
    return pb


def admission_from_lease(lease: types_pb2.Lease, worker_id: str, address: str) -> types_pb2.Admission:
    """The Admission a worker stream starts with: the lease's numbers, its cap if any."""
    pb = types_pb2.Admission(
        decision=types_pb2.CAPPED if lease.HasField("budget_cap") else types_pb2.ADMITTED,
        request_id=lease.request_id, lease_id=lease.lease_id, worker_id=worker_id,
        worker_address=address, prompt_tokens=lease.prompt_tokens,
        max_new_tokens=lease.max_new_tokens, reserved_bytes=lease.reserved_bytes,
    )
    if lease.HasField("budget_cap"):
        pb.budget_cap.CopyFrom(lease.budget_cap)
    return pb
