"""KV memory as the ledger charges it: tensors from an ORT allocator that reserves what is asked.

Why: `OrtValue.ortvalue_from_shape_and_type(shape, dtype, "cuda", id)` takes memory
from the CUDA allocator ORT's Python binding keeps per device, a BFC arena with
ORT's default extend strategy, kNextPowerOfTwo: an allocation that does not fit
extends the arena by the next power of two of the request (never less than
twice the last extension), and an arena gives nothing back. The prefix cache's
block area (one tensor of what the rows leave) asked 42 GiB and took a 64 GiB
region; a default worker on an H200 reserved ~40 GiB for 28 GiB of capacity.

Here the KV tensors come from an allocator registered in ORT's environment with
an `OrtArenaCfg` of arena_extend_strategy kSameAsRequested (1): each extension is
the request itself, rounded up to the arena's 256-byte granularity
(BFCArena::RoundedBytes, kMinAllocationSize), which is what
`ortvalue_from_shape_and_type(..., memory_info=...)` then allocates from
(onnxruntime.create_and_register_allocator_v2 for CUDA; create_and_register_allocator
for the CPU, which the dry run and the tests take through the same code).

What the worker reserves for KV is then what the pool charges (its capacity) plus
a stated overhead: each tensor's rounding to 256 bytes and the span copier's two
scratch tokens (`overhead_bytes`). The model's weights and ORT's activations are
the session's, not the KV's, and are not in either figure.

If the environment allocator cannot be set up (an ORT without the API), the
tensors come from ORT's default allocator and the report says so
(`strategy` "ort-default", reserved an upper bound: each tensor's next power of
two), never silently.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence

import numpy as np
import onnxruntime as ort
import structlog

log = structlog.get_logger(__name__)

ARENA_ALIGN_BYTES = 256  # BFCArena's kMinAllocationSize: every request is a multiple of it
SAME_AS_REQUESTED = 1  # OrtArenaCfg.arena_extend_strategy: kSameAsRequested (0: next power of two)

_registered: dict[tuple[str, int], ort.OrtMemoryInfo | None] = {}
_lock = threading.Lock()


def rounded_bytes(nbytes: int) -> int:
    """What the arena reserves for a request of `nbytes` (kSameAsRequested)."""
    return -(-nbytes // ARENA_ALIGN_BYTES) * ARENA_ALIGN_BYTES


def next_power_of_two(nbytes: int) -> int:
    """The most ORT's default arena may reserve for one request (the fallback's bound)."""
    return 1 << max(0, (rounded_bytes(nbytes) - 1).bit_length())


def _memory_info(device: str, device_id: int) -> ort.OrtMemoryInfo:
    name = "Cuda" if device == "cuda" else "Cpu"  # ORT's allocator names (onnxruntime::CUDA, CPU)
    return ort.OrtMemoryInfo(name, ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, device_id,
                             ort.OrtMemType.DEFAULT)


def _register(device: str, device_id: int) -> ort.OrtMemoryInfo | None:
    """The memory info of a kSameAsRequested allocator registered for the device (once per
    process), or None when ORT would not register one (its default allocator then)."""
    key = (device, device_id)
    with _lock:
        if key in _registered:
            return _registered[key]
        info = _memory_info(device, device_id)
        config = ort.OrtArenaCfg({"arena_extend_strategy": SAME_AS_REQUESTED})
        try:
            if device == "cuda":
                ort.create_and_register_allocator_v2("CUDAExecutionProvider", info,
                                                     {"device_id": str(device_id)}, config)
            else:
                ort.create_and_register_allocator(info, config)
        except Exception as exc:  # an ORT without the API, or one refusing this device
            log.warning("KV allocator: ORT's default arena instead of one that reserves what "
                        "is asked; reserved device memory may round up to powers of two",
                        device=f"{device}:{device_id}", error=f"{type(exc).__name__}: {exc}")
            info = None
        _registered[key] = info
        return info


class KVMemory:
    """The KV tensors of one row store, allocated so the device reserves what they take."""

    def __init__(self, device: str, device_id: int) -> None:
        self.device, self.device_id = device, device_id
        self._info = _register(device, device_id)
        self.strategy = "same-as-requested" if self._info is not None else "ort-default"
        self.requested_bytes = 0  # the tensors' bytes
        self.reserved_bytes = 0  # what the allocator reserved for them (see the docstring)

    def tensor(self, shape: Sequence[int], dtype: np.dtype) -> ort.OrtValue:
        """An uninitialised tensor on the device, counted in requested and reserved bytes."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        value = None
        if self._info is not None:
            try:
                value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype,
                                                                  memory_info=self._info)
            except Exception as exc:
                # An ORT whose OrtValue takes no memory_info, or that did not keep the
                # registration: its default arena, said (out of memory is raised as is).
                if not isinstance(exc, TypeError) and "shared allocator" not in str(exc):
                    raise
                log.warning("KV allocator: ORT's default arena instead of one that reserves "
                            "what is asked; reserved device memory may round up to powers "
                            "of two", device=f"{self.device}:{self.device_id}",
                            error=f"{type(exc).__name__}: {exc}")
                self._info, self.strategy = None, "ort-default"
        if value is None:
            value = ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, self.device,
                                                              self.device_id)
        self.requested_bytes += nbytes
        self.reserved_bytes += (rounded_bytes(nbytes) if self.strategy == "same-as-requested"
                                else next_power_of_two(nbytes))
        return value


CUDART_NAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")


def cuda_free_bytes(device_id: int) -> Callable[[], int] | None:
    """A probe of the GPU's free memory now (cudaMemGetInfo through the CUDA runtime ORT
    loaded, after a device synchronize), or None where no CUDA runtime can be loaded.
    Why: ORT keeps a captured CUDA graph's memory in its own arena and reports it
    nowhere; the drop in free memory around the capture is what it took."""
    cudart = _cudart()
    if cudart is None:
        return None
    free, total = ctypes.c_size_t(), ctypes.c_size_t()

    def free_bytes() -> int:
        cudart.cudaSetDevice(device_id)
        cudart.cudaDeviceSynchronize()
        if cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
            raise RuntimeError(f"cudaMemGetInfo failed on GPU {device_id}")
        return free.value
    return free_bytes


CUDA_MEMCPY_HOST_TO_DEVICE = 1  # cudaMemcpyKind


def cuda_column_copier(device_id: int) -> Callable[[int, np.ndarray], None] | None:
    """A copy of column 0 of a C-contiguous host [rows, width] array to the same place of a
    device array of that shape at a pointer: one cudaMemcpy2D of rows x itemsize bytes
    (pitch width x itemsize on both sides), through the CUDA runtime ORT loaded; None
    where none can be loaded (the caller copies the whole array). Synchronous, as
    OrtValue.update_inplace is: a step's run sees it."""
    cudart = _cudart()
    if cudart is None:
        return None
    copy = cudart.cudaMemcpy2D
    copy.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t,
                     ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int]
    return column_copier(copy, cudart.cudaSetDevice, device_id)


def column_copier(copy2d, set_device, device_id: int) -> Callable[[int, np.ndarray], None]:
    """`cuda_column_copier`'s copy over a cudaMemcpy2D-like function (a fake in tests)."""
    def copy_column(device_ptr: int, host: np.ndarray) -> None:
        rows, width = host.shape
        pitch = width * host.itemsize
        set_device(device_id)
        status = copy2d(device_ptr, pitch, host.ctypes.data, pitch, host.itemsize, rows,
                        CUDA_MEMCPY_HOST_TO_DEVICE)
        if status != 0:
            raise RuntimeError(f"cudaMemcpy2D of a {rows}-row mask column to GPU {device_id} "
                               f"failed (cudaError {status})")
    return copy_column


def _cudart():
    for name in CUDART_NAMES:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None
