"""The decode step's fixed shapes: batch-size buckets, their fixed buffers, and what a step cost.

Why (DESIGN.md, "On the GPU"): a decode step launched kernel by kernel is
launch-bound on a GPU (5.0 ms at 1 row, 7.5 ms at 32 on the profiled H200
step), and every peer removes the launches with CUDA graphs captured per batch
size (vLLM's cudagraph_mode, SGLang, TensorRT-LLM, llama.cpp, genai). A graph
replays fixed kernels over fixed addresses, so a decode step becomes:

- a bucket: rows are padded up to the next size of `BUCKETS` (capped at the
  store's rows). A padded row b in [rows, bucket) is a FREE row of the store:
  its mask has one 1 (it "holds" position 0 and writes scratch there), its id
  is any valid id, its logits and id are ignored. No live row reads a free
  row, and a row's next occupant writes position 0 before anything reads it
  (a prompt chunk, a session's or a cached prefix's import), so a padded row
  changes no real row's result; it is charged to no sequence;
- fixed buffers per bucket (`DecodeBuffers`): ids, positions, the mask at the
  row's full width (the graph reads each row's length from its mask row sum
  and the total from its width: a fixed width is a fixed shape), the gathered
  logits positions, the LoRA slots, and the outputs (logits [bucket, 1,
  vocab] and the device argmax `next_ids`): bound ONCE by address; a step
  writes the host staging arrays and copies them in place.

Where the store commits memory on touch (the host arena), a padded row would
commit pages the ledger charges to nobody: there the ladder is every size (no
row is ever padded) and the mask keeps the step's own width (no graph to
replay on a CPU, and a full-width mask makes the CPU's attention walk the
whole row). The code path is the same; only the ladder and the width differ
(`DecodeShapes`).

Steps that fit no bucket run uncaptured and are counted (`StepStats`): a
LoRA graph (its adapter inputs are rebound when the adapters change, and a
captured graph would replay the old addresses), decode split in adapter
groups, and every run that is not a decode (prompt chunks, first-chunk
batches, speculative verifications). Constraint masks and sampling happen on
the host after the run: they do not change the run's shapes (graph-safe).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnxruntime as ort

from worker_service.runtime.kv_arena import KVArena
from worker_service.runtime.last_logits import LOGITS_POSITIONS, NEXT_IDS
from worker_service.runtime.lora import SLOT_INPUT
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.row_store import RowStore

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# The run option that picks a CUDA graph (onnxruntime_run_options_config_keys.h,
# kOrtRunOptionsConfigCudaGraphAnnotation): -1 runs uncaptured; 0 is ORT's own default.
GRAPH_ID_KEY = "gpu_graph_id"
# ORT's CUDA provider captures on the third run of a graph id on the calling thread
# (min_num_runs_before_cuda_graph_capture_ = 2 regular runs allocate its memory first).
WARM_RUNS = 3


def bucket_ladder(max_rows: int, pads: bool) -> tuple[int, ...]:
    """The batch sizes a decode runs at: `BUCKETS` up to max_rows (max_rows itself the
    last) when rows may be padded, else every size 1..max_rows."""
    if not pads:
        return tuple(range(1, max_rows + 1))
    return tuple(b for b in BUCKETS if b < max_rows) + (max_rows,)


def bucket_buffer_bytes_bound(spec: ModelSpec, max_rows: int, width: int) -> int:
    """At most what padded buckets' fixed buffers (`DecodeBuffers`) over max_rows rows of
    `width` tokens hold: every optional buffer counted, logits as float32. For a caller
    sizing a KV capacity that must leave room for them (they are charged out of it)."""
    per_row = spec.vocab_size * 4 + width * 8 + 6 * 8  # logits, the mask, six [b, 1] int64s
    return sum(bucket_ladder(max_rows, pads=True)) * per_row


def bucket_for(rows: int, ladder: tuple[int, ...]) -> int:
    """The smallest bucket of `ladder` holding `rows` rows."""
    for bucket in ladder:
        if bucket >= rows:
            return bucket
    raise ValueError(f"{rows} rows exceed the largest bucket, {ladder[-1]}")


@dataclass(frozen=True)
class DecodeShapes:
    """How decode runs are shaped over one store (see the module docstring)."""

    ladder: tuple[int, ...]
    full_width: bool  # the mask at the row's whole width (a fixed shape) or the step's
    capture: bool  # replay a CUDA graph per bucket (a CUDA session with graphs enabled)

    @classmethod
    def for_store(cls, store: RowStore, capture: bool = False) -> DecodeShapes:
        """Padded buckets and full-width masks on memory allocated up front (device rows,
        the dry run's CPU ones included); every size and the step's width on the host
        arena, which commits on touch."""
        pads = not isinstance(store, KVArena)
        return cls(bucket_ladder(store.max_rows, pads), full_width=pads,
                   capture=capture and pads and store.device == "cuda")


def graphs_enabled(session: ort.InferenceSession) -> bool:
    """Whether the session's CUDA provider was created with enable_cuda_graph."""
    options = session.get_provider_options().get("CUDAExecutionProvider", {})
    return str(options.get("enable_cuda_graph", "0")).lower() in ("1", "true")


# Copies column 0 of a C-contiguous host [rows, width] array to the same place of a
# device array of that shape at a device pointer (device_memory.cuda_column_copier).
ColumnCopier = Callable[[int, np.ndarray], None]


class _Buffer:
    """A fixed tensor: a host staging array and the OrtValue ORT is bound to. On the CPU they
    are one memory; on a device, `upload` copies the array into the OrtValue in place
    (its address never changes) and `download` copies it back."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, device: str, device_id: int,
                 host: np.ndarray | None = None):
        # `host`: an existing contiguous array to wrap (buckets sharing one output buffer).
        self.host = np.zeros(shape, dtype=dtype) if host is None else host.reshape(shape)
        self.on_host = device == "cpu"
        self.value = (ort.OrtValue.ortvalue_from_numpy(self.host) if self.on_host else
                      ort.OrtValue.ortvalue_from_shape_and_type(list(shape), dtype, device,
                                                                device_id))
        self.synced = self.on_host  # whether the device holds the whole host array

    def upload(self) -> None:
        if not self.on_host:
            self.value.update_inplace(self.host)
        self.synced = True

    def upload_first_column(self, copy_column: ColumnCopier | None) -> None:
        """Copy column 0 of this [rows, width] buffer to the device: one strided copy of
        rows x 8 bytes where a copier is at hand and the device already holds the rest of
        the array (a full copy before that, and where none is at hand)."""
        if self.on_host:
            return
        if copy_column is None or not self.synced:
            self.upload()
            return
        copy_column(self.value.data_ptr(), self.host)

    def download(self) -> np.ndarray:
        return self.host if self.on_host else self.value.numpy()

    @property
    def nbytes(self) -> int:
        return self.host.nbytes


class DecodeBuffers:
    """One bucket's fixed inputs and outputs, bound once into its own IOBinding with the
    store's rows [0, bucket) (row addresses never change: a freed row's place is
    taken by the last row)."""

    def __init__(self, session: ort.InferenceSession, spec: ModelSpec, store: RowStore,
                 bucket: int, width: int | None, logits_dtype: np.dtype, gathers: bool,
                 slots: bool, next_ids: bool, shared: tuple[np.ndarray, np.ndarray] | None = None,
                 mask_counts: bool = False, copy_column: ColumnCopier | None = None) -> None:
        """`width`: the mask's fixed width (None: the step's own, bound each step).
        `shared`: flat host arrays (logits, next ids) every bucket's outputs are prefixes
        of: on the host, where buckets are every size and nothing is captured, one
        buffer serves them all (a [rows, vocab] buffer per size would be rows^2/2 rows).
        `mask_counts`: the graph reads the mask only as row sums and its width
        (mask_counts.py): each row's length stands in its first column, zeros in the rest,
        and only that column is copied to a device each step (by `copy_column`)."""
        device, device_id = store.device, getattr(store, "device_id", 0)
        self.bucket, self.width = bucket, width
        self.mask_counts = mask_counts and width is not None
        self._copy_column = copy_column

        def buffer(shape, dtype=np.int64):
            return _Buffer(shape, np.dtype(dtype), device, device_id)

        self.ids = buffer((bucket, 1))
        self.positions = buffer((bucket, 1)) if spec.position_ids_name else None
        # None: the mask is the step's own width, a host array bound each step.
        self.mask = buffer((bucket, width)) if width is not None else None
        self.logits_at = buffer((bucket, 1, 1)) if gathers else None  # row b reads position 0
        self.slots = buffer((bucket,)) if slots else None
        logits_host, ids_host = (None, None) if shared is None else (
            shared[0][:bucket * spec.vocab_size], shared[1][:bucket])
        self.logits = _Buffer((bucket, 1, spec.vocab_size), np.dtype(logits_dtype), device,
                              device_id, logits_host)
        self.next_ids = _Buffer((bucket, 1), np.dtype(np.int64), device, device_id,
                                ids_host) if next_ids else None
        self.binding = session.io_binding()
        store.bind(self.binding, 0, bucket)
        bind = self.binding.bind_ortvalue_input
        bind(spec.input_ids_name, self.ids.value)
        if self.positions is not None:
            bind(spec.position_ids_name, self.positions.value)
        if self.mask is not None:
            bind(spec.attention_mask_name, self.mask.value)
        if self.logits_at is not None:
            bind(LOGITS_POSITIONS, self.logits_at.value)
        if self.slots is not None:
            bind(SLOT_INPUT, self.slots.value)
        self.binding.bind_ortvalue_output(spec.logits_name, self.logits.value)
        if self.next_ids is not None:
            self.binding.bind_ortvalue_output(NEXT_IDS, self.next_ids.value)

    @property
    def nbytes(self) -> int:
        """Bytes of this bucket's fixed buffers (on the store's device)."""
        return sum(b.nbytes for b in (self.ids, self.positions, self.mask, self.logits_at,
                                      self.slots, self.logits, self.next_ids) if b is not None)

    def upload(self) -> None:
        for b in (self.ids, self.positions, self.slots):
            if b is not None:
                b.upload()
        if self.mask is not None:
            if self.mask_counts:
                self.mask.upload_first_column(self._copy_column)
            else:
                self.mask.upload()

    def set_lengths(self, lengths: np.ndarray, columns: np.ndarray) -> None:
        """Write each row's length (its positions to attend, padding rows' 1) into the fixed
        mask: as a count in column 0 (mask_counts), else as a right-padded row of ones."""
        assert self.mask is not None
        if self.mask_counts:
            self.mask.host[:, 0] = lengths
        else:
            np.less(columns[:self.width], lengths[:, None], out=self.mask.host,
                    casting="unsafe")


@dataclass
class StepStats:
    """What decode steps cost and how they ran, for the metrics (engine thread writes,
    scrapes read: plain numbers)."""

    captured_steps: int = 0
    uncaptured_steps: int = 0
    uncaptured_by_reason: dict[str, int] = field(default_factory=dict)
    padded_rows: int = 0  # rows run as padding, summed over steps
    host_s: float = 0.0  # wall seconds of decode steps outside the session run
    device_s: float = 0.0  # wall seconds inside it (the device's work and its launches)
    graph_bytes: int = 0  # fixed buffers of the buckets made so far (on the store's device)
    # Device memory ORT took while capturing the buckets' graphs (the device's free memory
    # before and after; 0 where nothing is captured or nothing could be asked).
    capture_bytes: int = 0
    captured_buckets: list[int] = field(default_factory=list)

    def ran(self, reason: str | None) -> None:
        """Count one run: captured (reason None) or uncaptured, and why."""
        if reason is None:
            self.captured_steps += 1
            return
        self.uncaptured_steps += 1
        self.uncaptured_by_reason[reason] = self.uncaptured_by_reason.get(reason, 0) + 1


class StepClock:
    """Splits a step's wall time into host and device (session run) seconds."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.run_s = 0.0
        # CPU seconds of the calling thread inside the runs (the bench's "inside ONNX
        # Runtime" share; pool threads, if any, are not in it).
        self.run_cpu_s = 0.0

    def timed_run(self, session: ort.InferenceSession, binding: ort.IOBinding,
                  options: ort.RunOptions | None) -> None:
        started, started_cpu = time.perf_counter(), time.thread_time()
        session.run_with_iobinding(binding, options)
        self.run_s += time.perf_counter() - started
        self.run_cpu_s += time.thread_time() - started_cpu

    def close(self, stats: StepStats) -> None:
        total = time.perf_counter() - self.started
        stats.device_s += self.run_s
        stats.host_s += max(0.0, total - self.run_s)


def run_options(graph_id: int) -> ort.RunOptions:
    """Run options naming a CUDA graph (-1: run uncaptured on a graph-enabled session)."""
    options = ort.RunOptions()
    options.add_run_config_entry(GRAPH_ID_KEY, str(graph_id))
    return options
