"""Protobuf <-> engine types for the worker; the only place the engine meets the wire.

The prompt becomes token ids in prompt_tokens.py (the one place the edge tokenizes).
"""

from __future__ import annotations

from collections.abc import Sequence

from ortserve.rules import request_rules
from ortserve.v1 import types_pb2
from worker_service import prompt_tokens
from worker_service.core.logprobs import TokenLogprobs
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import Completed, FinishReason, SequenceRequest, TokenDelta
from worker_service.core.tokenizer import Tokenizer

_FINISH = {
    FinishReason.LENGTH: types_pb2.LENGTH,
    FinishReason.EOS: types_pb2.EOS,
    FinishReason.STOP_SEQUENCE: types_pb2.STOP_SEQUENCE,
    FinishReason.CONSTRAINT_COMPLETE: types_pb2.CONSTRAINT_COMPLETE,
    FinishReason.STOP_TOKEN: types_pb2.STOP_TOKEN,
}


def sampling_from_pb(pb: types_pb2.SamplingParams) -> SamplingConfig:
    def opt(name: str):
        return getattr(pb, name) if pb.HasField(name) else None

    return SamplingConfig(temperature=opt("temperature"), top_k=opt("top_k"), top_p=opt("top_p"),
                          seed=opt("seed"), repetition_penalty=opt("repetition_penalty"),
                          presence_penalty=opt("presence_penalty"),
                          frequency_penalty=opt("frequency_penalty"), min_p=opt("min_p"),
                          logit_bias=tuple(sorted(pb.logit_bias.items())))


_REPORTED = ("temperature", "top_k", "top_p", "repetition_penalty", "presence_penalty",
             "frequency_penalty", "min_p")


def sampling_to_pb(config: SamplingConfig, seed: int | None) -> types_pb2.SamplingParams:
    pb = types_pb2.SamplingParams()
    for name in _REPORTED:
        value = getattr(config, name)
        if value is not None:
            setattr(pb, name, value)
    pb.logit_bias.update(dict(config.logit_bias))
    if seed is not None:
        pb.seed = seed
    return pb


def chunk_to_pb(event: TokenDelta, tokenizer: Tokenizer) -> types_pb2.TokenChunk:
    """A TokenDelta as a TokenChunk; the logprobs' token texts and bytes come from the
    tokenizer's per-id cache (only requests that asked for logprobs pay for them)."""
    pb = types_pb2.TokenChunk(token_ids=event.token_ids, text=event.text)
    for entry in event.logprobs:
        pb.logprobs.append(token_logprob_pb(entry, tokenizer))
    return pb


def token_logprob_pb(entry: TokenLogprobs, tokenizer: Tokenizer) -> types_pb2.TokenLogprob:
    raw = tokenizer.token_bytes(entry.token_id)
    pb = types_pb2.TokenLogprob(token_id=entry.token_id, token=raw.decode("utf-8", "replace"),
                                token_bytes=raw, logprob=entry.logprob)
    for token_id, logprob in entry.top:
        alt = tokenizer.token_bytes(token_id)
        pb.top_logprobs.add(token_id=token_id, token=alt.decode("utf-8", "replace"),
                            token_bytes=alt, logprob=logprob)
    return pb


def prepare(request: types_pb2.GenerateRequest, tokenizer: Tokenizer, sequence_id: str,
            forwarded_ids: Sequence[int] = (), arrived_at: float | None = None,
            context_length: int = 0) -> SequenceRequest:
    """Validate every field once and build the engine's request (field names are proto paths).

    The rules are the scheduler's (ortserve.rules.request_rules): the shape here, the rest
    (stop list, new tokens, sampling) in SequenceRequest, the model's in Engine.check.
    Without max_new_tokens the ceiling is provisionally the remaining context
    window; the lease check sets the admitted one.
    """
    request_rules.request_shape(request)
    ids = prompt_tokens.prompt_ids(request, tokenizer, forwarded_ids)
    if request.HasField("max_new_tokens"):
        max_new = request.max_new_tokens
    else:
        max_new = max(context_length - len(ids), request.min_new_tokens, 1)
    kwargs = {} if arrived_at is None else {"arrived_at": arrived_at}
    if request.HasField("logprobs"):
        kwargs["top_logprobs"] = request.logprobs.top_logprobs
    return SequenceRequest(
        sequence_id=sequence_id, request_id=request.request_id, prompt_ids=tuple(ids),
        max_new_tokens=max_new, min_new_tokens=request.min_new_tokens,
        sampling=sampling_from_pb(request.sampling), stop=tuple(request.stop),
        constraint=request_rules.constraint_spec(request, tool_format=tokenizer.tool_call_format),
        ignore_eos=request.ignore_eos, stop_token_ids=tuple(request.stop_token_ids),
        adapter=request.adapter, speculative=not request.disable_speculation,
        keep_prefix_s=request.keep_prefix_s,
        continues_kept_answer=request.continues_kept_answer, max_itl_ms=request.max_itl_ms,
        **kwargs)


def finished_to_pb(done: Completed, sampling: SamplingConfig, lease: types_pb2.Lease,
                   worker_id: str, provider: str) -> types_pb2.Finished:
    pb = types_pb2.Finished(
        finish_reason=_FINISH[done.finish_reason],
        stop_sequence=done.stop_sequence,
        stop_token_id=done.stop_token_id,
        usage=types_pb2.Usage(prompt_tokens=done.prompt_tokens,
                              generated_tokens=done.generated_tokens,
                              max_new_tokens=done.max_new_tokens,
                              reused_prompt_tokens=done.reused_prompt_tokens,
                              cached_tokens=done.cached_prompt_tokens),
        timings=types_pb2.Timings(queue_ms=done.queue_ms, prefill_ms=done.prefill_ms,
                                  ttft_ms=done.ttft_ms, decode_ms=done.decode_ms,
                                  decode_tokens_per_s=done.decode_tokens_per_s,
                                  total_ms=done.total_ms),
        sampling=sampling_to_pb(sampling, done.seed),
        worker_id=worker_id,
        execution_provider=provider,
        speculation=types_pb2.Speculation(mode=done.speculative_mode,
                                          proposed_tokens=done.draft_proposed_tokens,
                                          accepted_tokens=done.draft_accepted_tokens),
    )
    if done.reasoning_tokens is not None:
        pb.usage.reasoning_tokens = done.reasoning_tokens
    if lease.HasField("budget_cap"):
        pb.budget_cap.CopyFrom(lease.budget_cap)
    if done.constraint_satisfied is not None:
        pb.constraint.SetInParent()  # present even when satisfied is false and reason empty
        pb.constraint.satisfied = done.constraint_satisfied
        pb.constraint.reason = done.constraint_reason
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
