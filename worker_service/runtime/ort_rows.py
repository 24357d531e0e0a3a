"""The ORT runs over a row store's rows (`OrtRows`): binds the rows and runs a builder graph
over them, prompt chunks and batched single-token decode. Which rows run is the runner's
(rows_runner.py): this only binds and runs.

Why three entry points (DESIGN.md, "Batching"): GroupQueryAttention takes each
row's length from its attention-mask row sum and the total from the mask's
width, so one run decodes B sequences of different lengths with right-padded
masks; but it refuses more than one new token over a past at B > 1, so
prompt chunks over a past run batch 1 into the sequence's own row. First
chunks (no past in any row) do batch: GQA treats a run whose new tokens are
the mask's whole width as a first prompt, and each row's own length is its
mask's ones (right padding), so several waiting prompts prefill in one run
(`prefill_first`).

Both bind the store's rows as past input and present output (one buffer), so
nothing is copied per step. The store is host memory (kv_arena.py) or device
memory (device_rows.py): this code is the same for both; only the inputs'
and logits' small host arrays cross to a device. A graph with a `logits_positions` input
(runtime/last_logits.py) computes logits only at the position each row reads:
its logits are [rows, 1, vocab] in every entry point. Host arrays for ids,
mask and logits are preallocated once; returned logits are views into them,
valid until the next call.

Decode runs in batch-size buckets with fixed buffers bound once per bucket
(decode_step.py), held by a `DecodeBuckets` (decode_buckets.py): padded rows on device rows, every size on the host arena;
`decode_rows` hands back each row's greedy id (the graph's `next_ids` on a
device, numpy's float32 argmax of the host logits on the CPU) and the logits
only when asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np
import onnxruntime as ort

from worker_service.runtime.decode_buckets import DecodeBuckets, Decoded
from worker_service.runtime.decode_step import DecodeBuffers, DecodeShapes, StepClock, StepStats
from worker_service.runtime.last_logits import LOGITS_POSITIONS
from worker_service.runtime.lora import BASE, SLOT_INPUT, AdapterSet, lora_inputs
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.row_store import RowStore


class OrtRows:
    """One ORT session bound over one row store's rows; see the module docstring."""

    def __init__(self, session: ort.InferenceSession, spec: ModelSpec, store: RowStore,
                 max_chunk_tokens: int = 512, lora: AdapterSet | None = None,
                 shapes: DecodeShapes | None = None, graph_ids_from: int = 1,
                 mask_counts: bool | None = None) -> None:
        """`shapes`: how decode runs are shaped (decode_step.py); None: the store's own
        (padded buckets and full-width masks on device rows, every size on the arena).
        `graph_ids_from`: the CUDA graph id of the first bucket (0 is ORT's default; a
        second runner on the same session, cuda_check's, takes other ids). `mask_counts`:
        decode masks as counts (runtime/mask_counts.py); None: where the graph allows."""
        if store.spec is not spec and store.spec != spec:
            raise ValueError("the row store was made for another model spec")
        self.session = session
        self.spec = spec
        self.store = store
        self.max_chunk_tokens = max_chunk_tokens
        logits_type = next(o.type for o in session.get_outputs() if o.name == spec.logits_name)
        self.logits_dtype = np.dtype(np.float16 if "float16" in logits_type else np.float32)
        rows, ctx, vocab = store.max_rows, spec.context_length, spec.vocab_size
        # Flat buffers: the first B x W entries viewed as [B, W] are contiguous, as ORT needs.
        self._ids = np.zeros(max(rows, max_chunk_tokens), dtype=np.int64)
        self._positions = np.zeros(max(rows, max_chunk_tokens), dtype=np.int64)
        self._mask = np.zeros(max(rows * ctx, max_chunk_tokens), dtype=np.int64)
        self._columns = np.arange(ctx, dtype=np.int64)
        self._decode_logits = np.empty(rows * vocab, dtype=self.logits_dtype)
        # A chunk's logits are [1, n, vocab]; only the last row is used (grows on demand).
        self._prefill_logits = np.empty(vocab, dtype=self.logits_dtype)
        # Row b's position within the run whose logits it reads, when the graph gathers.
        self.gathers = LOGITS_POSITIONS in {i.name for i in session.get_inputs()}
        self._logits_at = np.zeros(max(rows, max_chunk_tokens), dtype=np.int64)
        # Decode runs in buckets with fixed buffers (runtime/decode_buckets.py); a bucket's KV
        # rows [0, bucket) and buffers are bound once: row addresses never change.
        self.buckets = DecodeBuckets(session, spec, store, self.logits_dtype, self.gathers,
                                     shapes, graph_ids_from, self._decode_logits, mask_counts)
        # The options of every run that replays no graph (None: a session without graphs).
        self._uncaptured = self.buckets.uncaptured
        # One binding per row for prompt chunks: a row's address never changes (a
        # moved row lands in another row's place), so a row's KV is bound once.
        self._prefill_bindings: dict[int, ort.IOBinding] = {}
        # First-chunk batches over rows [start, stop): bound once per (start, stop).
        self._first_bindings: dict[tuple[int, int], ort.IOBinding] = {}
        # LoRA weights are graph inputs (runtime/lora.py): every run binds its adapter's
        # values; a graph with LoRA inputs always has a set (the base binds zeros).
        if lora is None and lora_inputs(session):
            # On the rows' device (device rows say which; the host arena is the CPU).
            lora = AdapterSet(session, getattr(store, "device", "cpu"),
                              getattr(store, "device_id", 0))
        self.lora = lora
        self._bound_adapter: dict[int, str] = {}  # id(binding) -> adapter bound in it
        self._slots = np.zeros(max(rows, max_chunk_tokens), dtype=np.int64)
        # Decode runs over a part [start, stop) of the rows: one per adapter group.
        self._decode_part_bindings: dict[tuple[int, int], ort.IOBinding] = {}
        self.runs = 0
        self.largest_batch = 0
        # CPU seconds this (engine) thread spent inside session runs: the bench's
        # "inside ONNX Runtime" share (pool threads, if any, are not in it).
        self.ort_cpu_s = 0.0

    @property
    def arena(self) -> RowStore:
        """The row store (the bench scripts' name for it)."""
        return self.store

    def invalidate(self) -> None:
        """Forget cached KV bindings. Not needed after store.free (addresses are fixed, and a
        freed row's place is taken by the last row: every binding still points at live or
        free rows); for a caller that replaced the store's memory. Captured graphs keep
        their addresses: replacing the memory under them needs a new session."""
        self.buckets.clear()
        self._prefill_bindings.clear()
        self._first_bindings.clear()
        self._decode_part_bindings.clear()
        self._bound_adapter.clear()

    def _bind_adapter(self, binding: ort.IOBinding, adapter: str,
                      per_row: Sequence[str] | None = None) -> None:
        """Bind `adapter`'s LoRA values into binding unless it already holds them. A
        per-row graph binds every adapter stacked (once) and each row's slot: `per_row`,
        or `adapter` for every row of the run."""
        if self.lora is None:
            if adapter != BASE or any(per_row or ()):
                raise ValueError(f"adapter {adapter!r} asked of a graph without LoRA inputs")
            return
        if self.lora.per_row:
            key = f"#stacked-{self.lora.version}"
            if self._bound_adapter.get(id(binding)) != key:
                self.lora.bind_stacked(binding)
                self._bound_adapter[id(binding)] = key
            return
        # The set's version too: an adapter unloaded and loaded again under its name has
        # other values.
        key = f"{adapter}#{self.lora.version}"
        if self._bound_adapter.get(id(binding)) != key:
            self.lora.bind(binding, adapter)
            self._bound_adapter[id(binding)] = key

    def prefill(self, row: int, past_tokens: int, ids: Sequence[int],
                adapter: str = BASE) -> np.ndarray:
        """Run ids (>= 1 tokens) batch 1 into `row` after its past_tokens; last logits [vocab]."""
        return self._run_row(row, past_tokens, ids, every_position=False, adapter=adapter)[0]

    def verify(self, row: int, past_tokens: int, ids: Sequence[int],
               adapter: str = BASE) -> np.ndarray:
        """Run ids batch 1 into `row` after its past_tokens, as `prefill`, and return the
        logits at EVERY position [len(ids), vocab] (a speculative verification: position i
        scores the token after ids[i]). A view, valid until the next call.

        The row then holds past_tokens + len(ids) positions; the caller rewinds it
        (arena.note_written) to the ones its output kept, and the next run overwrites
        the rest.
        """
        return self._run_row(row, past_tokens, ids, every_position=True, adapter=adapter)

    def _run_row(self, row: int, past_tokens: int, ids: Sequence[int],
                 every_position: bool, adapter: str = BASE) -> np.ndarray:
        n = len(ids)
        if not 1 <= n <= self.max_chunk_tokens:
            raise ValueError(f"a prompt chunk is 1..{self.max_chunk_tokens} tokens, got {n}")
        total = past_tokens + n
        self._check_room(row, past_tokens, total)
        spec = self.spec
        binding = self._prefill_bindings.get(row)
        if binding is None:
            binding = self._prefill_bindings[row] = self.session.io_binding()
            self.store.bind(binding, row, row + 1)
        self._bind_adapter(binding, adapter)
        self._bind_slots(binding, [adapter])
        ids_view = self._ids[:n].reshape(1, n)
        ids_view[0] = ids
        # All ones of the total width: the graph reads seqlens_k = sum - 1 and the total.
        mask = self._mask[:total].reshape(1, total)
        mask.fill(1)
        binding.bind_cpu_input(spec.input_ids_name, ids_view)
        binding.bind_cpu_input(spec.attention_mask_name, mask)
        if spec.position_ids_name:
            positions = self._positions[:n].reshape(1, n)
            positions[0] = np.arange(past_tokens, total)
            binding.bind_cpu_input(spec.position_ids_name, positions)
        if every_position and self.gathers:
            at = self._logits_at[:n].reshape(1, n, 1)
            at[0, :, 0] = np.arange(n)
            binding.bind_cpu_input(LOGITS_POSITIONS, at)
            positions = n
        else:
            positions = self._bind_logits_at(binding, [n - 1])
        if self._prefill_logits.size < positions * spec.vocab_size:
            self._prefill_logits = np.empty(positions * spec.vocab_size, dtype=self.logits_dtype)
        logits = self._prefill_logits[:positions * spec.vocab_size]
        binding.bind_output(spec.logits_name, "cpu", 0, self.logits_dtype,
                            [1, positions, spec.vocab_size], logits.ctypes.data)
        started_s = time.thread_time()
        self.session.run_with_iobinding(binding, self._uncaptured)
        self.ort_cpu_s += time.thread_time() - started_s
        self.store.note_written(row, total)
        self.runs += 1
        self.largest_batch = max(self.largest_batch, 1)
        by_position = logits.reshape(positions, spec.vocab_size)
        return by_position if every_position else by_position[positions - 1:]

    def prefill_first(self, start_row: int, chunks: Sequence[Sequence[int]],
                      adapter: str = BASE) -> np.ndarray:
        """First prompt chunks of rows [start, start + len(chunks)) in ONE run; those rows hold
        nothing yet. Right-padded to the longest chunk W: row b's mask has len(chunks[b]) ones.

        Returns logits [rows, vocab]: each row's at its own last token. The padded
        positions [len_b, W) of row b's KV hold scratch (GQA writes every new
        position): accounted as touched, so W must fit each row's charge; the row's
        next run (at its own length) overwrites them before any run reads them.
        """
        rows = len(chunks)
        lengths = [len(c) for c in chunks]
        width = max(lengths, default=0)
        if rows < 1 or min(lengths) < 1 or rows * width > self.max_chunk_tokens:
            raise ValueError(f"a first-chunk batch is >= 1 rows of >= 1 tokens, at most "
                             f"{self.max_chunk_tokens} padded tokens; got {rows} rows x {width}")
        for b in range(rows):
            self._check_room(start_row + b, 0, width)
        spec, key = self.spec, (start_row, start_row + rows)
        binding = self._first_bindings.get(key)
        if binding is None:
            binding = self._first_bindings[key] = self.session.io_binding()
            self.store.bind(binding, *key)
        self._bind_adapter(binding, adapter)
        self._bind_slots(binding, [adapter] * rows)
        ids = self._ids[:rows * width].reshape(rows, width)
        ids.fill(spec.eos_token_ids[0] if spec.eos_token_ids else 0)  # any valid id pads
        mask = self._mask[:rows * width].reshape(rows, width)
        for b, chunk in enumerate(chunks):
            ids[b, :lengths[b]] = chunk
        np.less(self._columns[:width], np.asarray(lengths, dtype=np.int64)[:, None], out=mask,
                casting="unsafe")
        binding.bind_cpu_input(spec.input_ids_name, ids)
        binding.bind_cpu_input(spec.attention_mask_name, mask)
        if spec.position_ids_name:
            positions = self._positions[:rows * width].reshape(rows, width)
            positions[:] = self._columns[:width]
            binding.bind_cpu_input(spec.position_ids_name, positions)
        last = [length - 1 for length in lengths]
        positions = self._bind_logits_at(binding, last, width)
        if self.gathers:
            # Its own array: the caller keeps the rows (a full-width run's are copied out).
            logits = np.empty(rows * spec.vocab_size, dtype=self.logits_dtype)
        else:
            if self._prefill_logits.size < rows * width * spec.vocab_size:
                self._prefill_logits = np.empty(rows * width * spec.vocab_size,
                                                dtype=self.logits_dtype)
            logits = self._prefill_logits[:rows * width * spec.vocab_size]
        binding.bind_output(spec.logits_name, "cpu", 0, self.logits_dtype,
                            [rows, positions, spec.vocab_size], logits.ctypes.data)
        started_s = time.thread_time()
        self.session.run_with_iobinding(binding, self._uncaptured)
        self.ort_cpu_s += time.thread_time() - started_s
        for b in range(rows):
            self.store.note_written(start_row + b, lengths[b], touched_tokens=width)
        self.runs += 1
        self.largest_batch = max(self.largest_batch, rows)
        if self.gathers:
            return logits.reshape(rows, spec.vocab_size)
        by_position = logits.reshape(rows, width, spec.vocab_size)
        return by_position[np.arange(rows), np.asarray(last)]

    def decode(self, rows: int, past_tokens_per_row: Sequence[int], next_ids: Sequence[int],
               active: Sequence[bool] | None = None,
               adapters: Sequence[str] | None = None) -> np.ndarray:
        """One token for each of rows [0, rows) in ONE run; logits [rows, vocab] (host, a
        view valid until the next run). `decode_rows` without the device's choice."""
        return self.decode_rows(rows, past_tokens_per_row, next_ids, active, adapters).logits()

    def decode_rows(self, rows: int, past_tokens_per_row: Sequence[int],
                    next_ids: Sequence[int], active: Sequence[bool] | None = None,
                    adapters: Sequence[str] | None = None) -> Decoded:
        """One token for each of rows [0, rows) in ONE run (a bucket's, runtime/decode_step.py):
        each row's greedy choice (the graph's `next_ids`, when it has it) and its logits,
        brought to the host only when asked for.

        Row b has written past_tokens_per_row[b] positions; its new token lands at
        that position. The mask is right-padded: row b has past_b + 1 ones, then
        zeros, to the bucket's width (the row's whole width when shapes are fixed,
        else max(past) + 1). Rows [rows, bucket) are padding (free rows; see
        decode_step.py).

        active[b] False: row b is still being prefilled and rides along so rows
        stay [0, n) without moving anything. Its next_id is any valid id; the run
        writes scratch at its position past_b, which its next prompt chunk (at the
        same past) overwrites before anything reads it. Its logits are meaningless
        and its held tokens stay past_b (the scratch page is still accounted).

        adapters[b]: row b's LoRA adapter (BASE: none). The LoRA weights are
        batch-shared inputs, so each maximal run of rows with one adapter is one
        run over its rows [start, stop) (uncaptured); None: every row is the base.
        """
        clock = StepClock()
        if not 1 <= rows <= self.store.rows:
            raise ValueError(f"decode over rows [0, {rows}) but the store has "
                             f"{self.store.rows} live rows")
        if len(past_tokens_per_row) != rows or len(next_ids) != rows or (
                active is not None and len(active) != rows):
            raise ValueError(f"decode over {rows} rows needs {rows} past lengths, ids (and active "
                             f"flags), got {len(past_tokens_per_row)}, {len(next_ids)}")
        past = np.asarray(past_tokens_per_row, dtype=np.int64)
        for b in range(rows):
            self._check_room(b, int(past[b]), int(past[b]) + 1)
        if adapters is not None and len(adapters) != rows:
            raise ValueError(f"decode over {rows} rows needs {rows} adapters, "
                             f"got {len(adapters)}")
        ids = np.asarray(next_ids, dtype=np.int64)
        groups = ([(0, rows, BASE)] if self.lora is not None and self.lora.per_row
                  else adapter_groups(adapters, rows))
        if len(groups) == 1:
            decoded = self._decode_bucket(clock, rows, past, ids, groups[0][2], adapters)
        else:
            for start, stop, adapter in groups:
                self._decode_part(clock, start, stop, past[start:stop], ids[start:stop], adapter)
            self.step_stats.ran("adapter groups")
            host = self._part_logits(rows)()
            decoded = Decoded(rows, np.argmax(host, axis=1), lambda: host, host)
        for b in range(rows):
            if active is None or active[b]:
                self.store.note_written(b, int(past[b]) + 1)
            else:
                self.store.note_written(b, int(past[b]), touched_tokens=int(past[b]) + 1)
        self.largest_batch = max(self.largest_batch, rows)
        self.ort_cpu_s += clock.run_cpu_s
        clock.close(self.step_stats)
        return decoded

    def _decode_bucket(self, clock: StepClock, rows: int, past: np.ndarray, ids: np.ndarray,
                       adapter: str, per_row: Sequence[str] | None) -> Decoded:
        """One run over rows [0, bucket) (runtime/decode_buckets.py)."""
        lora = self.lora

        def bind_lora(buffers: DecodeBuffers) -> None:
            self._bind_adapter(buffers.binding, adapter)
            if buffers.slots is not None and lora is not None:
                buffers.slots.host[:rows] = [lora.slot(a) for a in (per_row or [adapter] * rows)]
                buffers.slots.host[rows:] = lora.slot(BASE)
        decoded = self.buckets.run(clock, rows, past, ids, lora is not None, self._slotted,
                                   bind_lora)
        self.runs += 1
        return decoded

    @property
    def _slotted(self) -> bool:
        """Whether decode binds per-row adapter slots (a per-row LoRA graph)."""
        return self.lora is not None and self.lora.per_row

    @property
    def shapes(self) -> DecodeShapes:
        """How decode runs are shaped (the buckets')."""
        return self.buckets.shapes

    @property
    def graphs(self) -> bool:
        """Whether the session's CUDA provider has graphs enabled."""
        return self.buckets.graphs

    @property
    def step_stats(self) -> StepStats:
        """How decode steps ran (the buckets' figures)."""
        return self.buckets.stats

    def warm_graphs(self, free_bytes: Callable[[], int] | None = None) -> list[int]:
        """Make every bucket's fixed buffers and capture every bucket's graph now
        (DecodeBuckets.warm; `free_bytes` measures the capture); the buckets captured."""
        return self.buckets.warm(self.lora is not None, self._slotted, free_bytes)

    def _part_logits(self, rows: int) -> Callable[[], np.ndarray]:
        logits = self._decode_logits[:rows * self.spec.vocab_size].reshape(rows,
                                                                         self.spec.vocab_size)
        return lambda: logits if logits.dtype == np.float32 else logits.astype(np.float32)

    def _decode_part(self, clock: StepClock, start: int, stop: int, past: np.ndarray,
                     next_ids: np.ndarray, adapter: str) -> None:
        """One run decoding rows [start, stop) with one adapter (a batch split by adapter
        groups: no bucket, no graph); logits land at rows [start, stop) of the host decode
        logits."""
        spec, n = self.spec, stop - start
        binding = self._decode_part_bindings.get((start, stop))
        if binding is None:
            binding = self._decode_part_bindings[(start, stop)] = self.session.io_binding()
            self.store.bind(binding, start, stop)
        self._bind_adapter(binding, adapter)
        width = int(past.max()) + 1
        ids_view = self._ids[:n].reshape(n, 1)
        ids_view[:, 0] = next_ids
        mask = self._mask[:n * width].reshape(n, width)
        np.less(self._columns[:width], past[:, None] + 1, out=mask, casting="unsafe")
        binding.bind_cpu_input(spec.input_ids_name, ids_view)
        binding.bind_cpu_input(spec.attention_mask_name, mask)
        if spec.position_ids_name:
            positions = self._positions[:n].reshape(n, 1)
            positions[:, 0] = past
            binding.bind_cpu_input(spec.position_ids_name, positions)
        self._bind_logits_at(binding, [0] * n)
        logits = self._decode_logits[start * spec.vocab_size:stop * spec.vocab_size]
        binding.bind_output(spec.logits_name, "cpu", 0, self.logits_dtype,
                            [n, 1, spec.vocab_size], logits.ctypes.data)
        clock.timed_run(self.session, binding, self._uncaptured)
        self.runs += 1

    def _bind_slots(self, binding: ort.IOBinding, adapters: Sequence[str]) -> None:
        """A per-row graph: row b of the run reads adapter slot adapters[b]."""
        if self.lora is None or not self.lora.per_row:
            return
        slots = self._slots[:len(adapters)]
        slots[:] = [self.lora.slot(a) for a in adapters]
        binding.bind_cpu_input(SLOT_INPUT, slots)

    def _bind_logits_at(self, binding: ort.IOBinding, last: Sequence[int],
                        width: int | None = None) -> int:
        """Bind each row's read position (a gathering graph); the positions per row the
        logits output has: 1 when the graph gathers, else the run's width (`width`, or
        the one row's last + 1)."""
        if not self.gathers:
            return width if width is not None else last[0] + 1
        at = self._logits_at[:len(last)].reshape(len(last), 1, 1)
        at[:, 0, 0] = last
        binding.bind_cpu_input(LOGITS_POSITIONS, at)
        return 1

    def _check_room(self, row: int, past_tokens: int, total_tokens: int) -> None:
        # A run writes positions [past, total): never past the row's charge, never a gap.
        if not 0 <= row < self.store.rows:
            raise ValueError(f"row {row} is not live (rows are [0, {self.store.rows}))")
        written = self.store.written_tokens(row)
        if past_tokens != written:
            raise ValueError(f"row {row} holds {written:,} tokens but the run says the past "
                             f"is {past_tokens:,}")
        if total_tokens > self.store.max_tokens(row):
            raise ValueError(f"row {row} is charged for {self.store.max_tokens(row):,} tokens; "
                             f"a run to {total_tokens:,} would write beyond it")


def adapter_groups(adapters: Sequence[str] | None, rows: int) -> list[tuple[int, int, str]]:
    """Maximal runs of rows [0, rows) with one adapter, as (start, stop, adapter)."""
    if adapters is None:
        return [(0, rows, BASE)]
    groups: list[tuple[int, int, str]] = []
    start = 0
    for b in range(1, rows + 1):
        if b == rows or adapters[b] != adapters[start]:
            groups.append((start, b, adapters[start]))
            start = b
    return groups
