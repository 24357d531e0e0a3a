"""The step scheduler: which sequences run in the next engine step, and how many tokens each.

Pure policy over two queues (no ORT, no grpc), in the shape of nano-vllm's
scheduler: `waiting` (submitted, KV already charged) and `running`. Each step
decodes every running sequence that has one pending token, in one batch, and
spends at most `max_prefill_tokens` on prompt chunks, so a long prompt delays
decoding streams by at most one chunk a step. Prefilling sequences go first in
arrival order, then waiting ones join. With `prefill_budget` a step spends less:
what it answers for the step's decodes (prefill_budget.py: what keeps the step
within their strictest gap goal), never below MIN_PREFILL_BUDGET_TOKENS.

A chunk over a past runs batch 1 (GQA's limit); the first chunks of sequences
that hold nothing yet (`PrefillChunk.first`) may share one run, right-padded
to the longest: `first_chunk_groups` says which run together, so a burst of
requests does not queue one prefill run per prompt.

A chunk over a past is never one token when the prompt has more to run
(`prompt_chunk_tokens`): a one-token run over a past takes ORT's token-generation
kernels, whose floats differ from the same token's inside a longer run, while
runs of two or more tokens give the same bits however a prompt is cut. So a
prompt's K/V and logits do not depend on where its chunks, or a prefix cache
hit, cut it (docs/features/prefix-cache.md, "A hit is exact").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

# A budget of >= 3 always advances the first prompt in line (ortserve/rules/prefill_math.py).
from ortserve.rules.prefill_math import MIN_PREFILL_BUDGET_TOKENS


class Schedulable(Protocol):
    """What the scheduler reads of a sequence."""

    @property
    def num_pending_tokens(self) -> int: ...

    @property
    def in_prefill(self) -> bool: ...

    @property
    def num_computed_tokens(self) -> int: ...


@dataclass(frozen=True)
class PrefillChunk:
    """Run `num_tokens` of the sequence's pending prompt tokens.

    first: the sequence holds no tokens yet (no reused prefix either), so the chunk
    may run in one batch with other first chunks; else it runs batch 1.
    """

    seq: Schedulable
    num_tokens: int
    first: bool = False


@dataclass(frozen=True)
class StepPlan:
    """One engine step: one batched decode run, then the prompt chunks."""

    decodes: tuple[Schedulable, ...] = ()
    prefills: tuple[PrefillChunk, ...] = ()
    # Speculative decoding: tokens proposed after a decoding sequence's last one, by
    # sequence id, for the runner to verify in this step (the engine adds them).
    drafts: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.num_tokens for c in self.prefills)

    @property
    def sequences(self) -> list[Schedulable]:
        """Every sequence the step runs, each once."""
        return list(dict.fromkeys([*self.decodes, *(c.seq for c in self.prefills)]))


class StepScheduler:
    """FIFO admission into `running`, chunked prefill, batched decode. Engine thread only."""

    def __init__(self, max_prefill_tokens: int = 512, max_batch: int | None = None,
                 can_start: Callable[[Schedulable, list[Schedulable]], bool] =
                 lambda seq, starting: True,
                 prefill_budget: Callable[[Sequence[Schedulable]], int] | None = None) -> None:
        if max_prefill_tokens < MIN_PREFILL_BUDGET_TOKENS:
            raise ValueError(f"max_prefill_tokens must be >= {MIN_PREFILL_BUDGET_TOKENS} (a "
                             "step's budget must fit a prompt run of two tokens after a cut "
                             f"that leaves two), got {max_prefill_tokens}")
        self.max_prefill_tokens = max_prefill_tokens
        self.max_batch = max_batch  # None: every decoding sequence in one run
        # Whether a sequence can start now besides those starting in the same step (e.g. a
        # free row in the KV layout: rows are taken when the step runs, after this pass).
        self._can_start = can_start
        # Prompt tokens a step with these decodes may run (None: max_prefill_tokens always).
        self._prefill_budget = prefill_budget
        self.budget_tokens = max_prefill_tokens  # the last step's budget (the worker's gauge)
        self.waiting: deque[Schedulable] = deque()
        self.running: list[Schedulable] = []

    def add(self, seq: Schedulable) -> None:
        self.waiting.append(seq)

    def remove(self, seq: Schedulable) -> None:
        """Take a sequence out wherever it is (finished, cancelled, failed). Idempotent."""
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        decodes = [s for s in self.running if not s.in_prefill and s.num_pending_tokens == 1]
        if self.max_batch is not None:
            decodes = decodes[: self.max_batch]
        budget = self.max_prefill_tokens
        if self._prefill_budget is not None and decodes:
            budget = max(MIN_PREFILL_BUDGET_TOKENS, min(budget, self._prefill_budget(decodes)))
        self.budget_tokens = budget
        chunks: list[PrefillChunk] = []
        for seq in self.running:
            if budget == 0:
                break
            if seq.in_prefill:
                n = prompt_chunk_tokens(seq, budget)
                if n:
                    chunks.append(PrefillChunk(seq, n))
                    budget -= n
        # FIFO: a waiting sequence that cannot start blocks the ones behind it,
        # so a large request is not overtaken forever by small ones.
        starting: list[Schedulable] = []
        while budget > 0 and self.waiting and self._can_start(self.waiting[0], starting):
            n = prompt_chunk_tokens(self.waiting[0], budget)
            if not n:
                break  # what is left of the budget cuts its prompt badly: next step
            seq = self.waiting.popleft()
            self.running.append(seq)
            starting.append(seq)
            chunks.append(PrefillChunk(seq, n, first=seq.num_computed_tokens == 0))
            budget -= n
        return StepPlan(decodes=tuple(decodes), prefills=tuple(chunks))


def prompt_chunk_tokens(seq: Schedulable, budget: int) -> int:
    """How many of the sequence's pending prompt tokens to run now within `budget`; 0: none.

    Neither this run nor the prompt's last may be one token over a past (see the module
    docstring): a cut that would leave one token leaves two, and a one-token run over a
    past waits for a budget that fits more. The one exception is a prompt with one token
    left in all (a session turn that reuses all but its last token): it runs.
    """
    pending = seq.num_pending_tokens
    n = min(pending, budget)
    if pending - n == 1:
        n -= 1
    if n == 1 and seq.num_computed_tokens > 0 and pending > 1:
        return 0
    return n


def first_chunk_groups(lengths: list[int], room_tokens: list[int], max_padded_tokens: int,
                       max_padding: float = 0.5) -> list[list[int]]:
    """Which first chunks share a run: groups of indices into `lengths`, longest first.

    A group runs right-padded to its longest chunk W, so it costs rows x W tokens of
    compute and of logits: at most `max_padded_tokens`, and at most (1 + max_padding)
    x its real tokens (a 500-token prompt does not drag 15 short ones to 500 each).
    Padding writes scratch KV up to W in every row of the group, so W must fit each
    member's row (`room_tokens`, its reserved tokens). A group of one runs batch 1.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    real = 0
    for i in order:
        group = groups[-1] if groups else None
        if group is not None:
            width = lengths[group[0]]
            rows = len(group) + 1
            if (width <= room_tokens[i] and rows * width <= max_padded_tokens
                    and rows * width <= (1 + max_padding) * (real + lengths[i])):
                group.append(i)
                real += lengths[i]
                continue
        groups.append([i])
        real = lengths[i]
    return groups
