"""The worker's KV pool: byte accounting, allocate/free, and its two budgets.

`KVPool` is the worker's side of the ledger: it charges each sequence
`bytes_for(prompt + max_new_tokens)` (the scheduler's own formula, from
ortserve.rules.kv_math) against `capacity_bytes` under one lock, so the worker
never holds more than it reported. That is the DEVICE budget: the memory the
running rows live in (the host arena on CPU, the device rows on CUDA). The
HOST budget (`HostBudget`) bounds the K/V kept in host memory outside it:
swapped sessions, and on CUDA (`parks_on_host`) the sessions parked between
turns too. What the pool charges against is a `KVAccounting` (a row store,
row_store.py, or the per-sequence `StaticSharedKV`, which also allocates).
"""

from __future__ import annotations

import threading
from typing import Protocol

import onnxruntime as ort

from ortserve.rules import kv_math
from worker_service.core.errors import CapacityExceeded
from worker_service.runtime.model import ModelSpec


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


class KVAccounting(Protocol):
    """How a memory charges sequences: its granularity and bytes per sequence."""

    block_tokens: int  # allocation granularity in tokens

    def bytes_for(self, max_tokens: int) -> int:
        """Bytes a sequence of up to `max_tokens` tokens physically holds (what the ledger charges)."""
        ...


class KVLayout(KVAccounting, Protocol):
    """A per-sequence way of holding KV: the pool materializes each sequence's buffer."""

    def allocate(self, max_tokens: int) -> KVBuffer:
        ...


class HostBudget:
    """Bytes of K/V the worker keeps in host memory outside the device budget. Thread-safe."""

    def __init__(self, limit_bytes: int) -> None:
        if limit_bytes < 0:
            raise ValueError(f"the host budget must be >= 0 bytes, got {limit_bytes}")
        self.limit_bytes = limit_bytes
        self._used_bytes = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        with self._lock:
            return self._used_bytes

    def take(self, nbytes: int) -> bool:
        """Count `nbytes` more when they fit the limit; False (nothing counted) otherwise."""
        with self._lock:
            if self._used_bytes + nbytes > self.limit_bytes:
                return False
            self._used_bytes += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            if nbytes > self._used_bytes:
                raise RuntimeError(f"the host budget gives back {nbytes:,} bytes but counts only "
                                   f"{self._used_bytes:,}")
            self._used_bytes -= nbytes


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
        return kv_math.bytes_for(max_tokens, self.spec.bytes_per_token, self.block_tokens)

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

    def device_names(self) -> set[str]:
        """Where the OrtValues live ("cpu" or "cuda"), for checks."""
        return {value.device_name() for _, _, value in self._values or []}

    def free(self) -> None:
        self._values = None

    @property
    def freed(self) -> bool:
        return self._values is None


class KVAllocation:
    """One sequence's charge in the pool; its buffer is made on the engine thread."""

    def __init__(self, max_tokens: int, nbytes: int) -> None:
        self.max_tokens = max_tokens
        self.nbytes = nbytes
        self.buffer: KVBuffer | None = None
        self.freed = False


class EvictableCache(Protocol):
    """What the pool asks of the prefix cache (runtime/prefix_cache.py), under the pool's lock."""

    def counted_bytes_locked(self) -> int:
        """Bytes the cache holds that no charge covers (evictable)."""
        ...

    def evict_locked(self, nbytes: int, why: str = "admission") -> int:
        """Evict at least `nbytes` when it can; returns the bytes freed."""
        ...


class KVPool:
    """What the worker's sequences may hold for KV, and what they hold now. Thread-safe.

    With a prefix cache attached the capacity is shared: charges + the cache's
    counted (evictable) bytes <= capacity_bytes, and a charge that would pass it
    evicts cached blocks first (docs/features/prefix-cache.md).
    """

    def __init__(self, layout: KVAccounting, capacity_bytes: int,
                 host: HostBudget | None = None, parks_on_host: bool = False) -> None:
        self.layout = layout
        self.capacity_bytes = capacity_bytes  # the device budget
        self.host = host if host is not None else HostBudget(0)
        # True when the device budget is not host memory: K/V parked between a session's
        # turns is then a host copy and counts against `host` as well.
        self.parks_on_host = parks_on_host
        # Re-entrant: the prefix cache shares it, and evicts while the pool holds it.
        self.lock = self._lock = threading.RLock()
        self._held_bytes = 0  # guarded by _lock
        self._cache: EvictableCache | None = None

    def attach_cache(self, cache: EvictableCache) -> None:
        self._cache = cache

    def held_bytes_locked(self) -> int:
        return self._held_bytes

    def _room_locked(self, grow: int) -> int:
        """Bytes in use besides `grow` more: charges plus the cache's counted bytes, after
        evicting what `grow` needs (the cache yields to every charge)."""
        if self._cache is None:
            return self._held_bytes
        over = self._held_bytes + grow + self._cache.counted_bytes_locked() - self.capacity_bytes
        if over > 0:
            self._cache.evict_locked(over)
        return self._held_bytes + self._cache.counted_bytes_locked()

    @property
    def block_tokens(self) -> int:
        return self.layout.block_tokens

    def bytes_for(self, max_tokens: int) -> int:
        return self.layout.bytes_for(max_tokens)

    def held_bytes(self) -> int:
        """Bytes charged to live sequences: a queued one counts, its buffer is guaranteed."""
        with self._lock:
            return self._held_bytes

    def allocate(self, max_tokens: int, detail: str = "") -> KVAllocation:
        """Charge a sequence of up to `max_tokens`; raises CapacityExceeded when it does not fit."""
        needed = self.bytes_for(max_tokens)
        with self._lock:
            # One lock hold for check, eviction and charge: never more than capacity_bytes.
            if self._room_locked(needed) + needed > self.capacity_bytes:
                raise CapacityExceeded(needed, self._held_bytes, self.capacity_bytes, detail=detail)
            self._held_bytes += needed
        return KVAllocation(max_tokens, needed)

    def materialize(self, allocation: KVAllocation) -> KVBuffer:
        """The allocation's buffer, created on first use (on the engine thread)."""
        if allocation.freed:
            raise RuntimeError("KV allocation used after free()")
        if allocation.buffer is None:
            if not isinstance(self.layout, StaticSharedKV):
                raise RuntimeError("this pool's sequences are rows of a row store: no buffers")
            try:
                allocation.buffer = self.layout.allocate(allocation.max_tokens)
            except Exception as exc:
                raise CapacityExceeded(allocation.nbytes, self.held_bytes(), self.capacity_bytes,
                                       detail=f"the allocation failed: {exc}") from exc
        return allocation.buffer

    def resize(self, allocation: KVAllocation, max_tokens: int, detail: str = "") -> None:
        """Re-charge a live allocation for up to `max_tokens` (a session between turns).

        Growing checks capacity under the lock like `allocate` (CapacityExceeded
        leaves the charge as it was); shrinking never fails. Only allocations
        without a materialized buffer may resize: an arena row's charge is set
        when its row is allocated, a static buffer's size is fixed.
        """
        if allocation.buffer is not None:
            raise RuntimeError("a materialized KV buffer cannot be resized")
        needed = self.bytes_for(max_tokens)
        with self._lock:
            if allocation.freed:
                raise RuntimeError("KV allocation used after free()")
            grow = needed - allocation.nbytes
            if grow > 0 and self._room_locked(grow) + grow > self.capacity_bytes:
                raise CapacityExceeded(needed, self._held_bytes - allocation.nbytes,
                                       self.capacity_bytes, detail=detail)
            self._held_bytes += grow
            allocation.nbytes = needed
            allocation.max_tokens = max_tokens

    def take_capacity(self, nbytes: int) -> int | None:
        """Lower the capacity by `nbytes` (a LoRA adapter now holds them), evicting cached
        blocks first; returns None when done, else the bytes in use that leave no room
        (nothing changes)."""
        with self._lock:
            in_use = self._room_locked(nbytes)
            if in_use + nbytes > self.capacity_bytes:
                return in_use
            self.capacity_bytes -= nbytes
            return None

    def give_capacity(self, nbytes: int) -> None:
        """Raise the capacity by `nbytes` (an unloaded adapter's bytes come back)."""
        with self._lock:
            self.capacity_bytes += nbytes

    def free(self, allocation: KVAllocation) -> None:
        """Free the buffer and return the charge. Idempotent."""
        with self._lock:
            if allocation.freed:
                return
            allocation.freed = True
        # The memory goes first, then the charge: a new allocation never overlaps it.
        if allocation.buffer is not None:
            allocation.buffer.free()
            allocation.buffer = None
        with self._lock:
            self._held_bytes -= allocation.nbytes
