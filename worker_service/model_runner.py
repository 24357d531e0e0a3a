"""The model runner: runs one step plan through the ORT session; returns logits rows.

It reads a sequence's tokens and its computed-token count but changes no
sequence state: the engine's postprocess does that, once the step is over.
With the per-sequence `StaticSharedKV` layout each sequence has its own
IOBinding over its own buffer, and a decode batch is one run per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from worker_service.kv_cache import KVPool
from worker_service.model import ModelSpec
from worker_service.sequence import Sequence
from worker_service.step_scheduler import StepPlan


@dataclass
class StepOutput:
    """What one step computed: tokens run per sequence, last-position logits of those
    that sample next, and the sequences whose run failed (they fail alone)."""

    computed_tokens: dict[str, int] = field(default_factory=dict)
    logits: dict[str, np.ndarray] = field(default_factory=dict)
    errors: dict[str, Exception] = field(default_factory=dict)


class ModelRunner:
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
        self._bindings: dict[str, ort.IOBinding] = {}

    def run(self, plan: StepPlan) -> StepOutput:
        out = StepOutput()
        for seq in plan.decodes:
            self._run_guarded(out, seq, 1)
        for chunk in plan.prefills:
            self._run_guarded(out, chunk.seq, chunk.num_tokens)
        return out

    def forget(self, seq: Sequence) -> None:
        """Drop the sequence's binding (before its KV buffer is freed)."""
        binding = self._bindings.pop(seq.sequence_id, None)
        if binding is not None:
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()

    def _run_guarded(self, out: StepOutput, seq: Sequence, n: int) -> None:
        try:
            logits = self._run(seq, n)
        except Exception as exc:  # one sequence's failure is that sequence's alone
            out.errors[seq.sequence_id] = exc
            return
        out.computed_tokens[seq.sequence_id] = n
        if seq.num_computed_tokens + n == len(seq.token_ids):
            out.logits[seq.sequence_id] = logits  # a middle prompt chunk's logits are not needed

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
        if n == 1:
            logits, logits_value = self._decode_logits, self._decode_logits_value
        else:
            logits = np.empty((1, n, spec.vocab_size), dtype=self._logits_dtype)
            logits_value = ort.OrtValue.ortvalue_from_numpy(logits)
        # Logits land in host memory; the KV stays where it was allocated.
        binding.bind_ortvalue_output(spec.logits_name, logits_value)
        self.session.run_with_iobinding(binding)
        return logits[0, -1].copy() if n == 1 else logits[0, -1]
