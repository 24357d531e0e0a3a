"""The rows runner: plan one step's rows and run them (through ort_rows.OrtRows, which binds
ORT); hand back a StepOutput.

It implements `runner.Runner` (as static_model_runner.StaticModelRunner does):
it reads a sequence's tokens, its computed-token count and its KV but changes
no sequence state; the engine's postprocess applies the step output once the
step is over.

- `RowsRunner`: every running sequence is one row of a row store
  (row_store.py: the host arena on CPU, device rows on CUDA), and one session
  run advances all of them by one token; the first
  chunks of new sequences then run batched (right-padded, one run per group),
  and chunks over a past batch 1 into their rows.
- `StaticModelRunner` (static_model_runner.py) is the special case: per-sequence
  `StaticSharedKV` buffers, only when asked for with kv_layout "static".
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import structlog

from worker_service.core.sequence import Sequence
from worker_service.core.step_scheduler import PrefillChunk, StepPlan, first_chunk_groups
from worker_service.runtime import device_memory
from worker_service.runtime.decode_step import StepStats
from worker_service.runtime.lora import AdapterSet
from worker_service.runtime.model import ModelSpec
from worker_service.runtime.ort_rows import OrtRows, adapter_groups
from worker_service.runtime.prefix_cache import CachedBlock, CachedPrefix, PrefixCache
from worker_service.runtime.row_store import RowStore
from worker_service.runtime.runner import StepOutput, takes_greedy_id
from worker_service.runtime.session_kv import HeldKV

log = structlog.get_logger(__name__)


class RowsRunner:
    """Every running sequence is a row of one row store; a step is ONE batched run over all
    rows, then the prompt chunks batch 1. Engine thread only.

    A prefilling row rides along in the batched run inactive (it writes scratch that
    its next chunk overwrites), so rows never need reordering; its prompt tokens
    run only in its chunks, never one at a time over a past, whose floats differ
    (core/step_scheduler.py): a prompt computes the same K/V and logits whether it
    started from a prefix cache hit or from nothing.
    """

    def __init__(self, session: ort.InferenceSession, spec: ModelSpec, store: RowStore,
                 max_chunk_tokens: int, batch_first_chunks: bool = True) -> None:
        self.session = session
        self.batch_first_chunks = batch_first_chunks
        self.spec = spec
        self.store = store
        self.batch = OrtRows(session, spec, store, max_chunk_tokens=max_chunk_tokens)
        self._by_row: list[Sequence] = []  # row b's sequence; rows are [0, n)
        self.prefix_cache: PrefixCache | None = None  # set by the engine when it has one

    verifies = True

    @property
    def arena(self) -> RowStore:
        """The row store (the bench scripts' name for it)."""
        return self.store

    @property
    def adapters(self) -> AdapterSet | None:
        """The LoRA adapters of this graph (None: it has no LoRA inputs)."""
        return self.batch.lora

    @property
    def largest_batch(self) -> int:
        return self.batch.largest_batch

    @property
    def ort_cpu_s(self) -> float:
        return self.batch.ort_cpu_s

    @property
    def step_stats(self) -> StepStats:
        """Decode steps: captured or not (and why), host vs device seconds (metrics)."""
        return self.batch.step_stats

    def warm_graphs(self, free_bytes: Callable[[], int] | None = None) -> list[int]:
        """Make the decode buckets' fixed buffers and capture a CUDA graph per bucket, on the
        calling (engine) thread, before the first step; [] where nothing is captured (the
        CPU, graphs off). `free_bytes`: the device's free memory (default on CUDA: asked of
        the CUDA runtime) read around the capture, whose drop is charged with the buffers
        (`decode_charged_bytes`). A capture ORT refuses turns graphs off for this runner,
        and the log says why: the steps run uncaptured (and the metrics count them so)."""
        if free_bytes is None and self.store.device == "cuda":
            free_bytes = device_memory.cuda_free_bytes(getattr(self.store, "device_id", 0))
        try:
            buckets = self.batch.warm_graphs(free_bytes)
        except Exception as exc:  # noqa: BLE001 - refused capture: run uncaptured
            self.batch.buckets.shapes = dataclasses.replace(self.batch.shapes, capture=False)
            log.warning("CUDA graph capture failed; decode steps run uncaptured",
                        cause=f"{type(exc).__name__}: {exc}",
                        capture_bytes=self.step_stats.capture_bytes)
            return []
        if buckets:
            log.info("CUDA graphs captured", buckets=buckets,
                     fixed_buffer_bytes=self.step_stats.graph_bytes,
                     capture_bytes=self.step_stats.capture_bytes,
                     measured="the GPU's free memory before and after the capture"
                     if free_bytes is not None else "not measured: no CUDA runtime to ask")
        return buckets

    @property
    def decode_charged_bytes(self) -> int:
        """Bytes the decode path holds beside the KV on its device (buffers + graphs)."""
        return self.batch.buckets.charged_bytes

    def can_start(self, seq: Sequence, starting: list[Sequence]) -> bool:
        return self.store.can_allocate(seq.kv.max_tokens, [s.kv.max_tokens for s in starting])

    def run(self, plan: StepPlan) -> StepOutput:
        out = StepOutput()
        restored: list[Sequence] = []
        first: list[PrefillChunk] = []  # new rows with nothing to restore: batched first chunks
        for chunk in plan.prefills:
            seq = chunk.seq
            if seq in self._by_row:
                continue
            if chunk.first and seq.resume is None:
                first.append(chunk)
                continue
            if not self._take_row(out, seq):
                continue
            if isinstance(seq.resume, CachedPrefix):
                self._import_cached(len(self._by_row) - 1, seq.resume)
                restored.append(seq)
            elif seq.resume is not None:
                # A session turn: its reused prefix goes back into the new row.
                resume = seq.resume
                self.store.import_row(len(self._by_row) - 1, resume.keys, resume.values,
                                      len(resume.tokens))
                restored.append(seq)
        rows = list(self._by_row)
        active = [not seq.in_prefill for seq in rows]
        decoded = not any(active)  # no row decodes: no shared run
        drafts = plan.drafts
        if rows and drafts and all(seq.sequence_id in drafts for seq in rows):
            # Every row verifies: each runs its last token and its draft batch 1 (GQA takes
            # several new tokens over a past only at batch 1), and no shared run is needed.
            decoded = True
            for b, seq in enumerate(rows):
                self._verify(out, b, seq, seq.num_computed_tokens, None, drafts[seq.sequence_id])
        elif not decoded:
            past = [seq.num_computed_tokens for seq in rows]
            started = time.perf_counter()
            try:
                decoded_rows = self.batch.decode_rows(
                    len(rows), past, [seq.token_ids[p] for seq, p in zip(rows, past, strict=True)],
                    active, adapters=[seq.req.adapter for seq in rows])
                chosen = decoded_rows.next_ids
                # Logits reach the host only for a row that reads them (sampled, constrained,
                # a draft, ...); on the CPU they are there already (a view, no copy).
                logits = decoded_rows.logits() if self.store.device == "cpu" or any(
                    active[b] and (seq.sequence_id in drafts or not takes_greedy_id(seq))
                    for b, seq in enumerate(rows)) else None
            except Exception as exc:  # the run was shared: every row in it failed
                for seq in rows:
                    out.step_of(seq).error = exc
            else:
                decoded = True
                out.decode_s, out.decode_rows = time.perf_counter() - started, len(rows)
                for b, seq in enumerate(rows):
                    if not active[b]:
                        continue
                    step = out.step_of(seq)
                    step.computed_tokens = 1
                    if past[b] + 1 == len(seq.token_ids):
                        # A view: the decode buffer is rewritten only by the next step's run,
                        # after this step's postprocess has sampled from it.
                        step.logits = logits[b] if logits is not None else None
                        step.greedy_token = int(chosen[b])
                for b, seq in enumerate(rows):
                    draft = drafts.get(seq.sequence_id)
                    if draft and out.step_of(seq).logits is not None:
                        # The shared run scored the draft's first token; one more run batch
                        # 1 scores the rest.
                        self._verify(out, b, seq, past[b] + 1, logits[b], draft)
        # First chunks: new rows after the decoded ones, one run per group (after the
        # decode, so the decoding streams' step is not delayed by them).
        self._run_first_chunks(out, first)
        if decoded:  # chunks over a past: batch 1, after the decode (a failed one failed them)
            for chunk in plan.prefills:
                if not any(chunk is c for c in first):
                    self._prefill(out, chunk.seq, chunk.num_tokens)
        for seq in restored:  # in its row now, whatever the run did
            out.step_of(seq).prefix_restored = True
        return out

    def _verify(self, out: StepOutput, row: int, seq: Sequence, past: int,
                first_logits: np.ndarray | None, draft: tuple[int, ...]) -> None:
        """Run the draft (after the sequence's last token when the shared run did not) from
        `past` in the sequence's row; its step gets the logits at every drafted position.

        The run writes up to position len(token_ids) + len(draft) - 1: the engine clamps
        a draft to the sequence's reservation, and the arena refuses a run beyond it.
        """
        step = out.step_of(seq)
        ids = list(draft) if first_logits is not None else [seq.token_ids[past], *draft]
        started = time.perf_counter()
        try:
            logits = self.batch.verify(row, past, ids, seq.req.adapter)
        except Exception as exc:
            step.error = exc
            return
        out.verify_s.append(time.perf_counter() - started)
        # Copies: the verify buffer is reused by the next row's run.
        step.verify_logits = (np.concatenate([first_logits[None], logits]) if first_logits
                              is not None else logits.copy())
        step.draft = tuple(draft)
        step.logits = None
        step.greedy_token = None  # the verification chooses (speculation.accept_verified)
        step.computed_tokens = 1 + len(draft)

    def verify_drift(self, past_tokens: int = 48, positions: int = 3) -> float:
        """The largest logit difference between a verification run and single-token decode
        runs over the same tokens (a probe at start-up, on a scratch row; 0.0 when exact).

        ORT's CPU attention takes a different path for several new tokens over a past
        than for one; a graph that quantizes its activations (int4 MatMulNBits at
        accuracy level 4) can turn that path's last-bit differences into whole
        quantization steps. Greedy output equals the non-speculative output only where
        this is small next to the gap between the best two logits.
        """
        arena, vocab = self.arena, self.spec.vocab_size
        if arena.rows:
            raise RuntimeError("the drift probe runs before any sequence has a row")
        ids = np.random.default_rng(0).integers(0, vocab, past_tokens + positions).tolist()
        row = arena.allocate(past_tokens + positions)
        try:
            self.batch.prefill(row, 0, ids[:past_tokens])
            decoded = []
            for i in range(positions):
                decoded.append(self.batch.decode(1, [past_tokens + i], [ids[past_tokens + i]])[0]
                               .astype(np.float64))
            arena.note_written(row, past_tokens)
            verified = self.batch.verify(row, past_tokens, ids[past_tokens:]).astype(np.float64)
            return float(max(np.abs(d - v).max() for d, v in zip(decoded, verified, strict=True)))
        finally:
            arena.free(row)  # addresses are fixed: no binding needs forgetting

    def keep_computed(self, seq: Sequence) -> None:
        """Rewind the row to the sequence's computed tokens (its rejected proposals go)."""
        row = self._by_row.index(seq)
        self.arena.note_written(row, seq.num_computed_tokens)

    def _take_row(self, out: StepOutput, seq: Sequence) -> bool:
        """Give the sequence the next row; False (the sequence's step failed) when none is free."""
        try:
            row = self.store.allocate(seq.kv.max_tokens)
        except Exception as exc:
            out.step_of(seq).error = exc
            return False
        assert row == len(self._by_row)
        self._by_row.append(seq)
        return True

    def _run_first_chunks(self, out: StepOutput, chunks: list[PrefillChunk]) -> None:
        if not chunks:
            return
        groups = first_chunk_groups([c.num_tokens for c in chunks],
                                    [c.seq.kv.max_tokens for c in chunks],
                                    self.batch.max_chunk_tokens) if self.batch_first_chunks else [
            [i] for i in range(len(chunks))]
        for group in groups:
            # Rows of one adapter side by side: the decode runs once per run of one adapter.
            members = sorted((chunks[i] for i in group), key=lambda c: c.seq.req.adapter)
            start = len(self._by_row)
            members = [c for c in members if self._take_row(out, c.seq)]
            if len(members) == 1:
                self._prefill(out, members[0].seq, members[0].num_tokens)
            elif members:
                self._prefill_first(out, start, members)

    def _prefill_first(self, out: StepOutput, start_row: int, chunks: list[PrefillChunk]) -> None:
        # One run per run of rows with one LoRA adapter (its weights are batch-shared inputs).
        for start, stop, _ in adapter_groups([c.seq.req.adapter for c in chunks], len(chunks)):
            self._prefill_first_group(out, start_row + start, chunks[start:stop])

    def _prefill_first_group(self, out: StepOutput, start_row: int,
                             chunks: list[PrefillChunk]) -> None:
        try:
            logits = self.batch.prefill_first(
                start_row, [c.seq.token_ids[:c.num_tokens] for c in chunks],
                adapter=chunks[0].seq.req.adapter)
        except Exception as exc:  # a shared run: every row in it failed
            for c in chunks:
                out.step_of(c.seq).error = exc
            return
        for b, c in enumerate(chunks):
            step = out.step_of(c.seq)
            step.computed_tokens = c.num_tokens
            if c.num_tokens == len(c.seq.token_ids):
                step.logits = logits[b]  # its own array (prefill_first copies the rows out)

    def _prefill(self, out: StepOutput, seq: Sequence, num_tokens: int) -> None:
        step = out.step_of(seq)
        start = seq.num_computed_tokens + step.computed_tokens
        n = min(num_tokens, len(seq.token_ids) - start)  # the batched run took one already
        if n <= 0 or step.error is not None:
            return
        try:
            logits = self.batch.prefill(self._by_row.index(seq), start,
                                        seq.token_ids[start:start + n], adapter=seq.req.adapter)
        except Exception as exc:
            step.error = exc
            return
        step.computed_tokens += n
        if start + n == len(seq.token_ids):
            step.logits = logits.copy()

    def _import_cached(self, row: int, prefix: CachedPrefix) -> None:
        """A prefix cache hit: copy its blocks into the new row, unpinning each once copied
        (the row's charge covered it until then; now the cache counts it again)."""
        assert self.prefix_cache is not None
        for b in range(prefix.copied, len(prefix.blocks)):
            self.store.import_block(row, b, prefix.blocks[b].kv)
            self.prefix_cache.copied(prefix, b)
        self.store.note_written(row, prefix.tokens)

    def fill_prefix_cache(self, seq: Sequence) -> list[CachedBlock]:
        """A sequence is over: copy its row's whole blocks the cache lacks into it, pinned
        (returning the row's pages as they go); the engine unpins them once the sequence's
        charge is freed."""
        cache = self.prefix_cache
        if cache is None or seq not in self._by_row:
            return []
        row = self._by_row.index(seq)
        # Prompt tokens only: generated ones were computed one at a time over a past, whose
        # floats differ from a prefill's, and a later prompt that hit them would not get
        # the K/V its miss computes (docs/features/prefix-cache.md, "A hit is exact").
        # Unless kept (keep_prefix_s, a stored response): then the answer's too, the K/V a
        # session would have kept for the follow-up, which is who asks for them.
        keep_s = seq.req.keep_prefix_s
        held = min(self.store.written_tokens(row), seq.num_computed_tokens,
                   len(seq.token_ids) if keep_s > 0 else seq.req.prompt_tokens)
        until = cache.keep_until(keep_s)
        new = []
        # Blocks holding generated tokens go under answer keys (prefix_cache.answer_key):
        # only a stored response's follow-up matches them.
        answer_from = seq.req.prompt_tokens // cache.block_tokens if keep_s > 0 else None
        for index, key in cache.missing(seq.token_ids[:held], seq.req.adapter, keep_s,
                                        answer_from):
            block = cache.insert_pinned(key, index, self.store.export_block(row, index), until)
            if block is not None:
                new.append(block)
        return new

    def park(self, seq: Sequence) -> HeldKV | None:
        """A session turn is over: copy its row's K/V to host arrays, then free the row.

        None when the turn never got a row: it still holds the prefix it was to reuse.
        """
        if seq not in self._by_row:
            return None
        keys, values = self.store.export_row(self._by_row.index(seq))
        n = keys[0].shape[1] if keys else 0
        self.forget(seq)
        return HeldKV(tuple(seq.token_ids[:n]), keys, values)

    def leaving_order(self, seqs: list[Sequence]) -> list[Sequence]:
        """Highest row first: a freed last row moves nothing, and a step whose sequences all
        end frees them with no copy (in row order, half of them would move a row each)."""
        row = {id(seq): i for i, seq in enumerate(self._by_row)}
        return sorted(seqs, key=lambda seq: row.get(id(seq), -1), reverse=True)

    def forget(self, seq: Sequence) -> None:
        """Free the sequence's row; the last row moves into the hole (rows stay [0, n))."""
        if seq not in self._by_row:
            return
        row = self._by_row.index(seq)
        moved = self.store.free(row)
        last = self._by_row.pop()
        if moved:
            self._by_row[row] = last
        # No binding is forgotten: row addresses never change (the moved row now sits at an
        # address a binding already covers), so a leaving sequence costs no rebinding and,
        # on CUDA, no graph capture (OrtRows.invalidate is for replaced memory only).
