"""The decode step's buckets for one OrtRows: their fixed buffers, the graph each replays,
and why a step ran uncaptured.

Why apart from ort_rows.py: the runner's three entry points (prompt chunks, first-chunk
batches, decode) share the row store and the session; only decode runs in batch-size
buckets with fixed buffers bound once and, on a CUDA session with graphs, one captured graph
per bucket (decode_step.py says why). This object owns that concern; OrtRows holds one
and hands it the step (composition: the runner still checks the rows and notes what each
run wrote).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from worker_service.runtime import device_memory
from worker_service.runtime.decode_step import (
    WARM_RUNS,
    DecodeBuffers,
    DecodeShapes,
    StepClock,
    StepStats,
    bucket_for,
    graphs_enabled,
    run_options,
)
from worker_service.runtime.last_logits import NEXT_IDS
from worker_service.runtime.mask_counts import model_reads_only_counts
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.row_store import RowStore


@dataclass
class Decoded:
    """A decode run's results for rows [0, rows)."""

    rows: int
    # Each row's greedy choice (the first maximum of its logits): the graph's next_ids on a
    # device, numpy's float32 argmax of the host logits where the graph has none (the
    # CPU, a run split by adapter groups).
    next_ids: np.ndarray
    _fetch: Callable[[], np.ndarray]
    _logits: np.ndarray | None = None

    def logits(self) -> np.ndarray:
        """[rows, vocab] float32 on the host: a view of the run's output buffer on the CPU
        (valid until the next run), one copy and one cast for the batch from a device."""
        if self._logits is None:
            self._logits = self._fetch()
        return self._logits


# Binds what a bucket's run needs from the runner's LoRA set (the adapter's values, the
# per-row slots) into its buffers before the inputs are uploaded.
BindLora = Callable[[DecodeBuffers], None]


class DecodeBuckets:
    """The decode buckets over one store (see the module docstring). Engine thread only."""

    def __init__(self, session: ort.InferenceSession, spec: ModelSpec, store: RowStore,
                 logits_dtype: np.dtype, gathers: bool, shapes: DecodeShapes | None,
                 graph_ids_from: int, shared_logits: np.ndarray,
                 mask_counts: bool | None = None) -> None:
        """`shapes`: how decode runs are shaped; None: the store's own (padded buckets and
        full-width masks on device rows, every size on the arena). `graph_ids_from`: the
        CUDA graph id of the first bucket (0 is ORT's default; a second runner on the same
        session, cuda_check's, takes other ids). `shared_logits`: the runner's flat host
        logits, which the host buckets' outputs are prefixes of. `mask_counts`: write each
        row's length as a count in the fixed mask's first column (mask_counts.py); None:
        where the model's graph reads the mask only as row sums and its width."""
        self.session, self.spec, self.store = session, spec, store
        self.logits_dtype, self.gathers = logits_dtype, gathers
        self.graph_ids_from = graph_ids_from
        self.graphs = graphs_enabled(session)
        self.shapes = shapes or DecodeShapes.for_store(store, capture=self.graphs)
        self._buckets: dict[int, DecodeBuffers] = {}
        self.has_next_ids = NEXT_IDS in {o.name for o in session.get_outputs()}
        rows = store.max_rows
        self._shared_logits = shared_logits
        self._next_ids = np.zeros(rows, dtype=np.int64)  # the host buckets' shared output
        self._lengths = np.zeros(rows, dtype=np.int64)
        self._columns = np.arange(spec.context_length, dtype=np.int64)
        self._mask = np.zeros(rows * spec.context_length, dtype=np.int64)
        self._pad_id = spec.eos_token_ids[0] if spec.eos_token_ids else 0  # any valid id
        self.stats = StepStats()
        if mask_counts is None:
            mask_counts, self.mask_note = model_reads_only_counts(spec.model_file,
                                                                  spec.attention_mask_name)
        else:
            self.mask_note = "set by the caller"
        self.mask_counts = mask_counts
        # On a device, one strided copy of the counts column per step (else the whole mask).
        self._copy_column = (device_memory.cuda_column_copier(getattr(store, "device_id", 0))
                             if mask_counts and store.device == "cuda" else None)
        self._graph_run_options: dict[int, ort.RunOptions] = {}
        # Every other run on a graph-enabled session says -1 (uncaptured): ORT would
        # otherwise capture its default graph (id 0) on the third run of any shape.
        self.uncaptured: ort.RunOptions | None = run_options(-1) if self.graphs else None

    def clear(self) -> None:
        """Forget the buckets' bindings (the store's memory was replaced); buffers made again
        are counted again."""
        self._buckets.clear()
        self.stats.graph_bytes = 0

    def buffers(self, bucket: int, per_row_slots: bool) -> DecodeBuffers:
        """Bucket `bucket`'s fixed buffers, made and bound on first use."""
        buffers = self._buckets.get(bucket)
        if buffers is None:
            shapes = self.shapes
            buffers = self._buckets[bucket] = DecodeBuffers(
                self.session, self.spec, self.store, bucket,
                self.store.seq_tokens if shapes.full_width else None, self.logits_dtype,
                self.gathers, slots=per_row_slots, next_ids=self.has_next_ids,
                shared=None if shapes.full_width else (self._shared_logits, self._next_ids),
                mask_counts=self.mask_counts, copy_column=self._copy_column)
            self.stats.graph_bytes += buffers.nbytes if shapes.full_width else 0
        return buffers

    def run(self, clock: StepClock, rows: int, past: np.ndarray, ids: np.ndarray,
            lora: bool, per_row_slots: bool, bind_lora: BindLora) -> Decoded:
        """One run over rows [0, bucket): the rows, then padding (see decode_step.py)."""
        spec, shapes = self.spec, self.shapes
        bucket = bucket_for(rows, shapes.ladder)
        buffers = self.buffers(bucket, per_row_slots)
        binding = buffers.binding
        buffers.ids.host[:rows, 0] = ids
        buffers.ids.host[rows:, 0] = self._pad_id
        if buffers.positions is not None:
            buffers.positions.host[:rows, 0] = past
            buffers.positions.host[rows:, 0] = 0
        bind_lora(buffers)
        lengths = self._lengths[:bucket]
        np.add(past, 1, out=lengths[:rows])
        lengths[rows:] = 1  # a padded row holds position 0: its scratch goes there
        if buffers.mask is not None:
            buffers.set_lengths(lengths, self._columns)
        else:
            width = int(past.max()) + 1
            mask = self._mask[:bucket * width].reshape(bucket, width)
            np.less(self._columns[:width], lengths[:, None], out=mask, casting="unsafe")
            binding.bind_cpu_input(spec.attention_mask_name, mask)
        buffers.upload()
        reason = self.uncaptured_reason(lora)
        options = self.graph_options(bucket) if reason is None else self.uncaptured
        clock.timed_run(self.session, binding, options)
        self.stats.ran(reason)
        self.stats.padded_rows += bucket - rows
        logits = buffers.logits

        def fetch() -> np.ndarray:
            host = logits.download()[:rows].reshape(rows, spec.vocab_size)
            # One cast for the batch: no host code ever scans half floats row by row.
            return host if host.dtype == np.float32 else host.astype(np.float32)
        if buffers.next_ids is not None:  # chosen on the device: only ids come down
            return Decoded(rows, buffers.next_ids.download()[:rows, 0], fetch)
        # No device argmax (the CPU: numpy's float32 argmax beats ORT's CPU ArgMax ~100x;
        # or an unedited graph): one host call over the batch's float32 logits.
        host = fetch()
        return Decoded(rows, np.argmax(host, axis=1), fetch, host)

    def uncaptured_reason(self, lora: bool) -> str | None:
        """None when this run replays (or captures) its bucket's graph; else why not."""
        if not self.shapes.capture:
            return "no capture on this device" if self.store.device == "cpu" else "graphs off"
        if lora:
            return "LoRA inputs"  # rebound when adapters change: a graph would keep old ones
        return None

    def graph_options(self, bucket: int) -> ort.RunOptions:
        options = self._graph_run_options.get(bucket)
        if options is None:
            # Graph ids from graph_ids_from (0 is ORT's default annotation), one per bucket.
            options = self._graph_run_options[bucket] = run_options(
                self.graph_ids_from + self.shapes.ladder.index(bucket))
        return options

    def warm(self, lora: bool, per_row_slots: bool,
             free_bytes: Callable[[], int] | None = None) -> list[int]:
        """Make every bucket's fixed buffers and capture every bucket's graph now (ORT
        captures on a graph id's third run, on the calling thread: the engine thread calls
        this before its first step), so what they hold is known, and charged, before any
        sequence is admitted. Runs over free rows only, so it needs an empty store;
        returns the buckets captured.

        `free_bytes`: the device's free memory now (device_memory.cuda_free_bytes); read
        before and after the capture, the drop is `stats.capture_bytes` (ORT allocates a
        graph's memory in its own arena, which no API reports)."""
        if self.shapes.full_width:
            # Fixed buffers on the store's device: made now, whether captured or not.
            for bucket in self.shapes.ladder:
                self.buffers(bucket, per_row_slots)
        if not self.shapes.capture or lora:
            return []  # nothing replays: graphs off, the CPU, or LoRA inputs (uncaptured)
        if self.store.rows:
            raise RuntimeError("graphs are captured before any sequence has a row")
        before = free_bytes() if free_bytes is not None else None
        try:
            for bucket in self.shapes.ladder:
                buffers = self.buffers(bucket, per_row_slots)
                buffers.ids.host[:] = self._pad_id
                if buffers.positions is not None:
                    buffers.positions.host[:] = 0
                assert buffers.mask is not None
                buffers.mask.host[:] = 0  # each row holds position 0 (ones or a count: alike)
                buffers.mask.host[:, 0] = 1
                buffers.upload()
                for _ in range(WARM_RUNS):
                    self.session.run_with_iobinding(buffers.binding, self.graph_options(bucket))
                self.stats.captured_buckets.append(bucket)
        finally:
            # Measured even when a capture fails part way: what ORT took stays taken.
            if before is not None and free_bytes is not None:
                self.stats.capture_bytes = max(0, before - free_bytes())
        return list(self.stats.captured_buckets)

    @property
    def charged_bytes(self) -> int:
        """What the decode path holds on the KV's device beside the KV: the buckets' fixed
        buffers and the captured graphs' memory (the engine takes it off the capacity)."""
        return self.stats.graph_bytes + self.stats.capture_bytes
