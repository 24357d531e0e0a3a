"""KV-cache layouts: how a sequence's keys and values are held, and what that costs.

The engine and the ledger see only `KVLayout` (what a sequence of N tokens
physically holds, and allocating it) and `KVBuffer` (binding it to a run), so
a paged layout for continuous batching can replace `StaticSharedKV` later.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import onnxruntime as ort

from worker_service.model import ModelSpec


class KVBuffer(Protocol):
    """One sequence's KV storage."""

    nbytes: int
    max_tokens: int

    def bind(self, binding: ort.IOBinding) -> None:
        """Bind the past inputs and present outputs of every layer for the next run."""
        ...

    def free(self) -> None:
        """Release the storage; later binds fail. Idempotent."""
        ...


class KVLayout(Protocol):
    """A way of holding KV for sequences of a given model on a given device."""

    block_tokens: int  # allocation granularity in tokens

    def bytes_for(self, max_tokens: int) -> int:
        """Bytes a sequence of up to `max_tokens` tokens physically holds (what the ledger charges)."""
        ...

    def allocate(self, max_tokens: int) -> KVBuffer:
        ...


class StaticSharedKV:
    """Per-sequence buffers of exactly max_tokens tokens, shared between past and present.

    Each layer's key and value is one OrtValue [1, kv_heads, max_tokens, head_dim]
    bound both as past_key_values.N.* input and present.N.* output, so
    GroupQueryAttention appends the new positions in place
    (past_present_share_buffer) and nothing is copied or reallocated per step.
    With device "cuda" the OrtValues live in device memory for the whole sequence.
    """

    block_tokens = 1

    def __init__(self, spec: ModelSpec, device: str = "cpu", device_id: int = 0) -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"KV device must be 'cpu' or 'cuda', got {device!r}")
        self.spec = spec
        self.device = device
        self.device_id = device_id

    def bytes_for(self, max_tokens: int) -> int:
        blocks = -(-max_tokens // self.block_tokens)
        return blocks * self.block_tokens * self.spec.bytes_per_token

    def allocate(self, max_tokens: int) -> StaticKVBuffer:
        return StaticKVBuffer(self, max_tokens)


class StaticKVBuffer:
    """A StaticSharedKV sequence buffer (see there)."""

    def __init__(self, layout: StaticSharedKV, max_tokens: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"a KV buffer needs at least 1 token, got {max_tokens}")
        spec = layout.spec
        self.max_tokens = max_tokens
        self.nbytes = layout.bytes_for(max_tokens)
        shape = [1, spec.kv_heads, max_tokens, spec.head_dim]
        # Contents need no initialising: attention reads only positions below the
        # mask's total length, which prefill and decode have already written.
        self._values: list[tuple[str, str, ort.OrtValue]] | None = [
            (past.format(i=i), present.format(i=i),
             ort.OrtValue.ortvalue_from_shape_and_type(shape, spec.kv_dtype.type, layout.device,
                                                       layout.device_id))
            for i in range(spec.num_layers)
            for past, present in ((spec.past_key_name, spec.present_key_name),
                                  (spec.past_value_name, spec.present_value_name))
        ]

    def bind(self, binding: ort.IOBinding) -> None:
        if self._values is None:
            raise RuntimeError("KV buffer used after free()")
        for past_name, present_name, value in self._values:
            binding.bind_ortvalue_input(past_name, value)
            binding.bind_ortvalue_output(present_name, value)

    def ortvalues(self) -> list[tuple[str, str, ort.OrtValue]]:
        """(past input name, present output name, OrtValue) per layer and key/value, for checks."""
        if self._values is None:
            raise RuntimeError("KV buffer used after free()")
        return list(self._values)

    def device_names(self) -> set[str]:
        """Where the OrtValues live ("cpu" or "cuda"), for checks."""
        return {value.device_name() for _, _, value in self._values or []}

    def free(self) -> None:
        self._values = None

    @property
    def freed(self) -> bool:
        return self._values is None


def kv_dtype_name(dtype: np.dtype) -> str:
    """np.float32 -> "float32" (what Info reports)."""
    return np.dtype(dtype).name
