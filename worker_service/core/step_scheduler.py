"""The step scheduler: which sequences run in the next engine step, and how many tokens each.

Pure policy over two queues (no ORT, no grpc), in the shape of nano-vllm's
scheduler: `waiting` (submitted, KV already charged) and `running`. Each step
decodes every running sequence that has one pending token, in one batch, and
spends at most `max_prefill_tokens` on prompt chunks (batch 1 each, GQA's
limit), so a long prompt delays decoding streams by at most one chunk a step.
Prefilling sequences go first in arrival order, then waiting ones join.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Schedulable(Protocol):
    """What the scheduler reads of a sequence."""

    @property
    def num_pending_tokens(self) -> int: ...

    @property
    def in_prefill(self) -> bool: ...


@dataclass(frozen=True)
class PrefillChunk:
    """Run `num_tokens` of the sequence's pending prompt tokens, batch 1."""

    seq: Schedulable
    num_tokens: int


@dataclass(frozen=True)
class StepPlan:
    """One engine step: one batched decode run, then the prompt chunks."""

    decodes: tuple[Schedulable, ...] = ()
    prefills: tuple[PrefillChunk, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.decodes and not self.prefills

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.num_tokens for c in self.prefills)


class StepScheduler:
    """FIFO admission into `running`, chunked prefill, batched decode. Engine thread only."""

    def __init__(self, max_prefill_tokens: int = 512, max_batch: int | None = None,
                 can_start: Callable[[Schedulable], bool] = lambda seq: True) -> None:
        if max_prefill_tokens < 1:
            raise ValueError(f"max_prefill_tokens must be >= 1, got {max_prefill_tokens}")
        self.max_prefill_tokens = max_prefill_tokens
        self.max_batch = max_batch  # None: every decoding sequence in one run
        self._can_start = can_start  # e.g. a free row in the KV layout
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
        chunks: list[PrefillChunk] = []
        for seq in self.running:
            if budget == 0:
                break
            if seq.in_prefill:
                n = min(seq.num_pending_tokens, budget)
                chunks.append(PrefillChunk(seq, n))
                budget -= n
        # FIFO: a waiting sequence that cannot start blocks the ones behind it,
        # so a large request is not overtaken forever by small ones.
        while budget > 0 and self.waiting and self._can_start(self.waiting[0]):
            seq = self.waiting.popleft()
            self.running.append(seq)
            n = min(seq.num_pending_tokens, budget)
            chunks.append(PrefillChunk(seq, n))
            budget -= n
        return StepPlan(decodes=tuple(decodes), prefills=tuple(chunks))
