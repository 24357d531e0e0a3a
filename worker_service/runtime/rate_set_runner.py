"""A bench-only runner that runs no model: every running sequence gets one token per tick.

The served path's cost (the engine's Python around a step, events, gRPC, the
scheduler, the gateway) is measured apart from the model with it, as vLLM's
benchmarks use dummy weights: the worker's step loop, KV charges, leases and
streams are the real ones; only the ORT run is replaced by a wait until the
next tick, so each stream receives `tokens_per_s` tokens a second (while the
engine keeps up). The tokens are chosen here, not sampled (`SequenceStep.token`):
the prompt's own ids, cycled, so the text is real text. Sampling parameters are
not applied, which is why the worker refuses this runner outside the bench
(`--bench-rate-set-tokens-per-s` needs ORTSERVE_BENCH=1; worker_service/__main__.py).
"""

from __future__ import annotations

import time

from worker_service.core.sequence import Sequence
from worker_service.core.step_scheduler import StepPlan
from worker_service.runtime.prefix_cache import CachedBlock
from worker_service.runtime.runner import StepOutput
from worker_service.runtime.session_kv import HeldKV

BENCH_ENV = "ORTSERVE_BENCH"  # must be 1 for the worker to take the rate-set runner


class RateSetRunner:
    """Runner (runtime/runner.py) that waits out a tick instead of running ORT."""

    largest_batch = 0
    ort_cpu_s = 0.0  # nothing runs inside ORT
    verifies = False  # no speculative verification: there is no model to verify with

    def __init__(self, tokens_per_s: float, max_rows: int, eos_token_ids: frozenset[int]) -> None:
        if tokens_per_s <= 0:
            raise ValueError(f"tokens_per_s must be > 0, got {tokens_per_s}")
        self.tick_s = 1.0 / tokens_per_s
        self._max_rows = max_rows
        self._eos = eos_token_ids
        self._rows: set[str] = set()  # sequences holding a row (started, not forgotten)
        self._next_s = 0.0  # perf_counter of the next tick

    def can_start(self, seq: Sequence, starting: list[Sequence]) -> bool:
        return len(self._rows) + len(starting) < self._max_rows

    def run(self, plan: StepPlan) -> StepOutput:
        # One step per tick: a late step starts the next tick from now (no burst to catch up).
        now = time.perf_counter()
        if self._next_s > now:
            time.sleep(self._next_s - now)
            now = self._next_s
        self._next_s = now + self.tick_s
        out = StepOutput()
        for seq in plan.decodes:
            step = out.step_of(seq)
            step.computed_tokens = 1
            step.token = self._token(seq)
        for chunk in plan.prefills:
            seq = chunk.seq
            self._rows.add(seq.sequence_id)
            step = out.step_of(seq)
            step.computed_tokens = chunk.num_tokens
            if chunk.num_tokens >= seq.num_pending_tokens:
                step.token = self._token(seq)
        self.largest_batch = max(self.largest_batch, len(plan.decodes) + len(plan.prefills))
        return out

    def _token(self, seq: Sequence) -> int:
        """The prompt's ids in a cycle (never an EOS: the length is max_new_tokens)."""
        prompt = seq.req.prompt_ids
        for k in range(len(prompt)):
            token = prompt[(seq.num_output_tokens + k) % len(prompt)]
            if token not in self._eos:
                return token
        return 0

    def park(self, seq: Sequence) -> HeldKV | None:
        self._rows.discard(seq.sequence_id)
        return None

    def fill_prefix_cache(self, seq: Sequence) -> list[CachedBlock]:
        return []

    def forget(self, seq: Sequence) -> None:
        self._rows.discard(seq.sequence_id)

    def leaving_order(self, seqs: list[Sequence]) -> list[Sequence]:
        return seqs
