"""The static model runner: per-sequence KV buffers, one ORT run per sequence.

The special case, only when asked for with kv_layout "static" (`StaticSharedKV`
buffers from kv_pool.py): each sequence has its own IOBinding over its own
buffer. It implements `runner.Runner` as rows_runner.RowsRunner, the
general case, does: it changes no sequence state; the engine's postprocess
applies the step output once the step is over.
"""

from __future__ import annotations

import time

import numpy as np
import onnxruntime as ort

from worker_service.core.sequence import Sequence
from worker_service.core.step_scheduler import StepPlan
from worker_service.runtime.kv_pool import KVPool
from worker_service.runtime.last_logits import LOGITS_POSITIONS
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.prefix_cache import CachedBlock
from worker_service.runtime.runner import StepOutput
from worker_service.runtime.session_kv import HeldKV


class StaticModelRunner:
    """One ORT session and the IOBindings of the sequences it serves. Engine thread only."""

    def __init__(self, session: ort.InferenceSession, spec: ModelSpec, kv: KVPool) -> None:
        self.session = session
        self.spec = spec
        self.kv = kv
        logits_type = next(o.type for o in session.get_outputs() if o.name == spec.logits_name)
        self._logits_dtype = np.float16 if "float16" in logits_type else np.float32
        # attention_mask must be as long as the current total, not the buffer:
        # GQA derives the sequence length from it.
        self._ones = np.ones(spec.context_length, dtype=np.int64)
        self._decode_logits = np.empty((1, 1, spec.vocab_size), dtype=self._logits_dtype)
        self._decode_logits_value = ort.OrtValue.ortvalue_from_numpy(self._decode_logits)
        # A gathering graph (runtime/last_logits.py): one row of logits per run, at this.
        self._gathers = LOGITS_POSITIONS in {i.name for i in session.get_inputs()}
        self._logits_at = np.zeros((1, 1, 1), dtype=np.int64)
        self._bindings: dict[str, ort.IOBinding] = {}

    largest_batch = 1
    ort_cpu_s = 0.0  # CPU seconds of this thread inside session runs (as OrtRows's)
    verifies = False  # one run per sequence already; speculation is the arena layout's

    def keep_computed(self, seq: Sequence) -> None:
        raise AssertionError("this runner verifies no drafts")

    def can_start(self, seq: Sequence, starting: list[Sequence]) -> bool:
        return True  # its buffer was charged at submit; it is made on first use

    def run(self, plan: StepPlan) -> StepOutput:
        out = StepOutput()
        for seq in plan.decodes:
            self._run_guarded(out, seq, 1)
        for chunk in plan.prefills:
            self._run_guarded(out, chunk.seq, chunk.num_tokens)
        return out

    def park(self, seq: Sequence) -> HeldKV | None:
        """Nothing to keep: sessions need a row store (the engine refuses them here)."""
        return None

    def fill_prefix_cache(self, seq: Sequence) -> list[CachedBlock]:
        """No prefix cache on this layout (docs/features/prefix-cache.md)."""
        return []

    def forget(self, seq: Sequence) -> None:
        """Drop the sequence's binding (before its KV buffer is freed)."""
        binding = self._bindings.pop(seq.sequence_id, None)
        if binding is not None:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()

    def leaving_order(self, seqs: list[Sequence]) -> list[Sequence]:
        return seqs  # one buffer each: any order frees the same

    def _run_guarded(self, out: StepOutput, seq: Sequence, n: int) -> None:
        step = out.step_of(seq)
        try:
            logits = self._run(seq, n)
        except Exception as exc:  # one sequence's failure is that sequence's alone
            step.error = exc
            return
        step.computed_tokens = n
        if seq.num_computed_tokens + n == len(seq.token_ids):
            step.logits = logits  # a middle prompt chunk's logits are not needed

    def _binding(self, seq: Sequence) -> ort.IOBinding:
        binding = self._bindings.get(seq.sequence_id)
        if binding is None:
            buffer = self.kv.materialize(seq.kv)
            binding = self.session.io_binding()
            buffer.bind(binding)
            self._bindings[seq.sequence_id] = binding
        return binding

    def _run(self, seq: Sequence, n: int) -> np.ndarray:
        """One session run over the sequence's next n tokens; the last position's logits."""
        past = seq.num_computed_tokens
        total = past + n
        assert total <= seq.kv.max_tokens, "a sequence ran past its KV reservation"
        spec, binding = self.spec, self._binding(seq)
        # The binding references these arrays' memory: keep them alive through the run.
        inputs = [np.asarray(seq.token_ids[past:total], dtype=np.int64).reshape(1, n),
                  self._ones[:total].reshape(1, total)]
        binding.bind_cpu_input(spec.input_ids_name, inputs[0])
        binding.bind_cpu_input(spec.attention_mask_name, inputs[1])
        if spec.position_ids_name:
            inputs.append(np.arange(past, total, dtype=np.int64).reshape(1, n))
            binding.bind_cpu_input(spec.position_ids_name, inputs[2])
        if self._gathers:
            self._logits_at[0, 0, 0] = n - 1
            binding.bind_cpu_input(LOGITS_POSITIONS, self._logits_at)
        if n == 1 or self._gathers:
            logits, logits_value = self._decode_logits, self._decode_logits_value
        else:
            logits = np.empty((1, n, spec.vocab_size), dtype=self._logits_dtype)
            logits_value = ort.OrtValue.ortvalue_from_numpy(logits)
        # Logits land in host memory; the KV stays where it was allocated.
        binding.bind_ortvalue_output(spec.logits_name, logits_value)
        started_s = time.thread_time()
        self.session.run_with_iobinding(binding)
        self.ort_cpu_s += time.thread_time() - started_s
        return logits[0, -1].copy() if n == 1 or self._gathers else logits[0, -1]
