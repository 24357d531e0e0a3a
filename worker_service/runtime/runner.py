"""The runner contract: what the engine asks of a model runner, and what one step hands back.

A runner reads a sequence's tokens, its computed-token count, its KV charge
and the session prefix it is to resume, and changes none of them: it returns
a `StepOutput` that says, per sequence, what the step changed (tokens written
into the cache, the logits to sample from, a prefix restored into its row, an
error), and the engine's postprocess applies that to the sequences once the
step is over. Both runners implement `Runner`: `rows_runner.py` (batched) and
`static_model_runner.py` (per-sequence buffers).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from worker_service.core.sampling import plain_greedy, suppresses
from worker_service.core.sequence import Sequence
from worker_service.core.step_scheduler import StepPlan
from worker_service.runtime.prefix_cache import CachedBlock
from worker_service.runtime.session_kv import HeldKV


@dataclass
class SequenceStep:
    """What one step did for one sequence."""

    seq: Sequence
    computed_tokens: int = 0  # tokens written into its KV this step
    # The last position's logits when its pending tokens are all computed (it samples
    # next); None after a middle prompt chunk. May be a view, valid until the next run.
    logits: np.ndarray | None = None
    # A speculative verification (the plan's draft for it): logits [len(draft) + 1, vocab],
    # row i scoring the token after the sequence's last token (i = 0) or after draft[i - 1];
    # `logits` is None and `computed_tokens` counts every position written (1 + the
    # draft's), of which the engine keeps the accepted ones (`Runner.keep_computed`).
    verify_logits: np.ndarray | None = None
    draft: tuple[int, ...] = ()
    # Its session prefix went into its row this step: the sequence may let go of it.
    prefix_restored: bool = False
    error: Exception | None = None  # this sequence failed (alone, or with its shared run)
    # The next token when the runner chose it itself, with no logits to sample from (the
    # bench's rate-set runner, runtime/rate_set_runner.py); None: sample from `logits`.
    token: int | None = None
    # The first maximum of this position's raw logits, chosen on the device (the graph's
    # next_ids); the postprocess takes it for a row `takes_greedy_id` admits, which then
    # may have no `logits` at all (they stayed on the device). None: not computed.
    greedy_token: int | None = None

    @property
    def samples(self) -> bool:
        """Whether this step ends with a token to choose (its pending tokens all computed)."""
        return self.logits is not None or self.token is not None or self.greedy_token is not None


@dataclass
class StepOutput:
    """What one step computed, per sequence in the order they ran."""

    steps: dict[str, SequenceStep] = field(default_factory=dict)  # by sequence_id
    # Wall seconds of this step's shared decode run (and its rows), and of each
    # verification run: the engine's measure of what speculation costs here.
    decode_s: float = 0.0
    decode_rows: int = 0
    verify_s: list[float] = field(default_factory=list)

    def step_of(self, seq: Sequence) -> SequenceStep:
        """The sequence's record, made empty on its first mention this step."""
        step = self.steps.get(seq.sequence_id)
        if step is None:
            step = self.steps[seq.sequence_id] = SequenceStep(seq)
        return step


def takes_greedy_id(seq: Sequence) -> bool:
    """Whether the device's greedy id is this sequence's token with no logits on the host:
    plain greedy (no penalty, bias, constraint, logprobs) and nothing suppressed now (a
    suppressed argmax sends the sampler to the logits)."""
    return (seq.constraint is None and seq.req.top_logprobs is None
            and plain_greedy(seq.sampler) and not suppresses(seq.sampler))


class Runner(Protocol):
    """A model runner as the engine drives it (engine thread only)."""

    @property
    def largest_batch(self) -> int:
        """The most sequences one session run has advanced so far (for reports)."""
        ...

    @property
    def ort_cpu_s(self) -> float:
        """CPU seconds the engine thread has spent inside ORT session runs (for the bench)."""
        ...

    def can_start(self, seq: Sequence, starting: list[Sequence]) -> bool:
        """Whether the sequence can join the running ones now, besides `starting` (those
        joining in the same step, whose rows are not taken yet): e.g. a free KV row."""
        ...

    def run(self, plan: StepPlan) -> StepOutput:
        """Run the plan's decodes and prompt chunks; sequence state is left as it was."""
        ...

    @property
    def verifies(self) -> bool:
        """Whether `run` verifies the plan's drafts (else it ignores them)."""
        ...

    def keep_computed(self, seq: Sequence) -> None:
        """After a verification: the sequence's KV holds its first `num_computed_tokens`
        positions; positions written past them (rejected proposals) are dropped, and the
        next run overwrites them."""
        ...

    def park(self, seq: Sequence) -> HeldKV | None:
        """A session turn is over: its written K/V as host arrays, its row freed; None when it
        never got a row (the engine keeps the prefix it was to resume)."""
        ...

    def fill_prefix_cache(self, seq: Sequence) -> list[CachedBlock]:
        """A sequence is over: its whole blocks the prefix cache lacks, copied in pinned (the
        engine unpins them after freeing the sequence's charge); [] without a cache."""
        ...

    def forget(self, seq: Sequence) -> None:
        """Drop what the runner holds for the sequence (before its KV charge is freed)."""
        ...

    def leaving_order(self, seqs: list[Sequence]) -> list[Sequence]:
        """The order in which to let these sequences go that moves the least K/V (the same
        sequences)."""
        ...
