"""The postprocess of an engine step: a step's output applied to its sequences.

Runners change no sequence state (runtime/runner.py); this is the one place a step's
results reach the sequences: count the computed tokens, sample (or take the runner's
token), emit it, and say which sequences failed and which finished. The engine then
frees them (engine.py `_finish`), on its own thread like this.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from worker_service.core.sampling import greedy_choice, greedy_tokens, plain_greedy
from worker_service.core.sequence import Event, Sequence, TokenDelta
from worker_service.engine import speculation
from worker_service.runtime.runner import Runner, StepOutput


@dataclass
class Applied:
    """What the step ended: failures in the order met, completions by sequence."""

    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)
    completed: dict[Sequence, Event] = field(default_factory=dict)


def greedy_choices(output: StepOutput, vocab_size: int) -> dict[str, int]:
    """The greedy rows' tokens (no constraint, penalty, bias or logprobs): the device's
    choice where the runner made one (the graph's next_ids: no host argmax at all), else
    one host argmax over the step's float32 logits, not one per row: the same tokens. A
    row whose argmax is suppressed (EOS before min_new_tokens) is left to its sampler."""
    plain = [s for s in output.steps.values() if s.error is None and s.samples
             and s.token is None and s.seq.constraint is None
             and s.seq.req.top_logprobs is None and plain_greedy(s.seq.sampler)]
    on_device = {s.seq.sequence_id: s.greedy_token for s in plain if s.greedy_token is not None}
    steps = [s for s in plain if s.greedy_token is None and s.logits is not None]
    chosen = greedy_tokens([s.logits for s in steps], vocab_size) if steps else []
    tokens = {**on_device, **{s.seq.sequence_id: t for s, t in zip(steps, chosen, strict=True)}}
    return {s.seq.sequence_id: c for s in plain if s.seq.sequence_id in tokens
            and (c := greedy_choice(s.seq.sampler, tokens[s.seq.sequence_id])) is not None}


def apply_step(output: StepOutput, runner: Runner, vocab_size: int) -> Applied:
    """Apply `output` to its sequences; one sequence's failure is that sequence's only."""
    greedy = greedy_choices(output, vocab_size)
    applied = Applied()
    for step in output.steps.values():
        seq = step.seq
        if step.prefix_restored:
            seq.prefix_restored()
        if step.error is not None:
            applied.failed.append((seq, step.error))
            continue
        if step.verify_logits is not None:
            try:
                finish_reason = speculation.accept_verified(step, runner)
            except Exception as exc:
                applied.failed.append((seq, exc))
                continue
            if finish_reason is not None:
                applied.completed[seq] = seq.completed(finish_reason)
            continue
        seq.computed(step.computed_tokens)
        chosen = step.token if step.token is not None else greedy.get(seq.sequence_id)
        if not step.samples:
            continue  # more prompt to go
        try:
            token, text, finish_reason, logprobs = seq.accept(step.logits, chosen)
        except Exception as exc:
            applied.failed.append((seq, exc))
            continue
        # Logprobs travel with their token (the same event), so a chunk's entries
        # always match its token ids.
        seq.emit(TokenDelta(seq.sequence_id, (token,), text,
                            (logprobs,) if logprobs is not None else ()))
        if finish_reason is not None:
            applied.completed[seq] = seq.completed(finish_reason)
    return applied
