"""The worker's engine: one ORT session, one engine thread, many sequences.

Callers talk to it through `submit` (thread-safe: checks the request against
the model, charges its KV in the pool and queues it, raising synchronously)
and receive events on a callback from the engine thread. The engine thread
repeats one step, in the shape of nano-vllm's `LLMEngine.step`:

    plan = scheduler.schedule()      # which sequences, how many tokens each
    output = runner.run(plan)        # the ORT runs; what changed, per sequence
    postprocess(plan, output)        # apply it: count, sample, stop, emit, free what finished

Runners change no sequence state (runtime/runner.py): the postprocess is the
one place a step's results reach the sequences.

Every exit (finish, cancel, error, close) frees the KV once and sends one
terminal event.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import structlog

from ortserve.rules import request_rules
from ortserve.status.units import tokens
from worker_service import speculation
from worker_service.core.errors import EngineError, InvalidRequest, LeaseInUse
from worker_service.core.ngram import Drafter
from worker_service.core.sampling import greedy_choice, greedy_tokens, plain_greedy
from worker_service.core.sequence import (
    TERMINAL,
    Cancelled,
    Completed,
    Event,
    Failed,
    Sequence,
    SequenceRequest,
    TokenDelta,
)
from worker_service.core.speculative import VerifyCosts
from worker_service.core.step_scheduler import StepPlan, StepScheduler
from worker_service.core.token_mask import ConstraintCompiler, MaskBatch, step_constraints
from worker_service.core.tokenizer import Tokenizer
from worker_service.engine_config import EngineConfig
from worker_service.runtime import device as devices
from worker_service.runtime.factory import build_runtime
from worker_service.runtime.lora import Adapter, AdapterBusy, AdapterNotFound, AdapterSet
from worker_service.runtime.model import ModelSpec, load_model_spec
from worker_service.runtime.prefix_cache import CachedPrefix, PrefixCache
from worker_service.runtime.runner import Runner, StepOutput
from worker_service.runtime.session_kv import SessionInfo, SessionTable

log = structlog.get_logger(__name__)


class SequenceHandle:
    """The caller's side of a submitted sequence."""

    def __init__(self, engine: Engine, seq: Sequence) -> None:
        self._engine = engine
        self._seq = seq
        self.sequence_id = seq.sequence_id

    def cancel(self) -> None:
        """Make the sequence leave within one engine step (Cancelled event); idempotent."""
        self._engine._cancel(self._seq)


class Engine:
    """Loads a model folder onto a device and serves sequences on its own thread."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.spec: ModelSpec = load_model_spec(config.model_dir)
        if 0 < config.max_context_tokens < self.spec.context_length:
            self.spec = dataclasses.replace(self.spec, context_length=config.max_context_tokens)
        self.tokenizer = Tokenizer(self.spec.model_dir)
        self.intra_op_threads = config.intra_op_threads or devices.usable_cores()
        session = devices.create_session(self.spec, config.device, config.device_id,
                                         self.intra_op_threads, config.inter_op_threads,
                                         (("session.intra_op.allow_spinning",
                                           "1" if config.intra_op_spinning else "0"),
                                          *config.ort_session_config),
                                         last_position_logits=config.last_position_logits)
        self.providers: tuple[str, ...] = tuple(session.get_providers())  # what ORT resolved
        self.provider = self.providers[0]
        self.nodes_by_provider = devices.node_placement(session)  # ORT's own placement
        placed = devices.placement(session)
        # The CPU-preferred shape nodes a CUDA session keeps on the host (allowed, reported).
        self.nodes_off_device = placed.off_device_report() if placed is not None else []
        self.device = "cpu" if config.device == "cpu" else f"cuda:{config.device_id}"
        chunk_tokens = max(config.prefill_chunk_tokens, 1)
        # The pool, the runner and the rows behind them, for this device (runtime/factory.py).
        self.runtime = build_runtime(config, self.spec, session, chunk_tokens)
        self.kv = self.runtime.pool
        self.runner: Runner = self.runtime.runner
        self.kv_layout = self.runtime.kind
        self.prefix_cache: PrefixCache | None = self.runtime.prefix_cache
        # LoRA adapters (runtime/lora.py): a graph with LoRA inputs has a set on a batched
        # runner; --lora on a base without them is refused with the reason.
        self.adapters: AdapterSet | None = getattr(self.runner, "adapters", None)
        for name, path in config.lora_adapters:
            (self.adapters or AdapterSet(session)).load(name, path)
        # A session's K/V was computed under one adapter: its turns keep it.
        self._session_adapters: dict[str, str] = {}
        # Sessions keep K/V between turns as host copies of their rows (session_kv.py).
        self.sessions = SessionTable(self.kv) if self.runtime.capabilities.sessions else None
        if config.bench_rate_set_tokens_per_s:
            self.providers = ("BenchRateSet",)  # what Info reports: no execution provider runs
            self.provider = self.providers[0]
        # Speculation where the runner verifies drafts exactly (speculation.resolve).
        self.speculative, self.verify_drift, self.speculative_note = speculation.resolve(
            config, self.runner, self.kv_layout)
        self._costs = VerifyCosts()
        self.scheduler = StepScheduler(max_prefill_tokens=chunk_tokens,
                                       can_start=self.runner.can_start)
        # Output constraints: llguidance's tokenizer is built on the first constrained request.
        self.constraints = ConstraintCompiler(self.tokenizer.to_json, self.spec.vocab_size,
                                              self.spec.eos_token_ids)
        self._masks = MaskBatch(self.spec.vocab_size, threads=min(self.intra_op_threads, 4),
                                overlap=config.constraint_mask_overlap)

        # Held around each step: a LoRA adapter changes only between steps (its values
        # are bound into the runs, and a per-row graph restacks them all).
        self._step_lock = threading.Lock()
        self._cond = threading.Condition()
        self._inbox: list[Sequence] = []  # guarded by _cond: submitted, not yet scheduled
        self._live: dict[str, Sequence] = {}  # guarded by _cond
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="ortserve-engine", daemon=True)
        self._thread.start()
        log.info("engine_ready", model=self.spec.name, provider=self.provider, device=self.device,
                 nodes_by_provider=self.nodes_by_provider, nodes_off_device=self.nodes_off_device,
                 intra_op_threads=self.intra_op_threads, capacity_bytes=self.capacity_bytes,
                 bytes_per_token=self.spec.bytes_per_token)

    # --- the caller's API (any thread) ---------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self.kv.capacity_bytes

    def held_bytes(self) -> int:
        """KV bytes charged to live sequences (queued ones included: their bytes are theirs)."""
        return self.kv.held_bytes()

    def cached_bytes(self) -> int:
        """Bytes the prefix cache holds (inside the capacity, evictable unless pinned)."""
        return self.prefix_cache.cached_bytes() if self.prefix_cache is not None else 0

    def prefix_cache_report(self) -> tuple[int, list[int]]:
        """(cached bytes, the cache's chain-hash summary) for the scheduler's heartbeat."""
        cache = self.prefix_cache
        return (cache.cached_bytes(), cache.summary()) if cache is not None else (0, [])

    @property
    def batch_rows(self) -> int:
        """Rows of the running batch now (a racy read, for reports)."""
        return self.runtime.batch_rows

    @property
    def max_batch_rows(self) -> int:
        return self.runtime.max_batch_rows

    @property
    def _arena(self):
        """The row store (None for the static layout): the tests' name for it."""
        return self.runtime.rows

    def active_sequences(self) -> int:
        with self._cond:
            return len(self._live)

    def check(self, req: SequenceRequest) -> None:
        """Raise InvalidField or ContextWindowFull when this model cannot serve `req` as asked
        (the request rules that need the model: ortserve.rules.request_rules)."""
        request_rules.token_ids_in_vocab(req.prompt_ids, self.spec.vocab_size)
        request_rules.logit_bias_in_vocab((t for t, _ in req.sampling.logit_bias),
                                          self.spec.vocab_size)
        request_rules.stop_token_ids_in_vocab(req.stop_token_ids, self.spec.vocab_size)
        request_rules.context_window(req.prompt_tokens, req.max_new_tokens,
                                     self.spec.context_length, req.min_new_tokens)
        if req.adapter:
            self.check_adapter(req.adapter)

    def check_adapter(self, name: str) -> None:
        """Raise AdapterNotFound unless this worker serves adapter `name`."""
        if self.adapters is None:
            raise AdapterNotFound(name, [])
        self.adapters.check(name)

    def add_adapter(self, adapter: Adapter) -> None:
        """Serve an adapter its set read (AdapterSet.read), between two engine steps."""
        if self.adapters is None:
            raise AdapterNotFound(adapter.name, [])
        with self._step_lock, self._cond:
            self.adapters.add(adapter)

    def remove_adapter(self, name: str) -> Adapter:
        """Stop serving adapter `name`, between two engine steps; AdapterBusy while sequences
        run under it or open sessions hold K/V computed under it. Its prefix-cache blocks go
        with it (the cache is cleared: a later adapter of that name must not find them)."""
        if self.adapters is None:
            raise AdapterNotFound(name, [])
        with self._step_lock, self._cond:
            self.adapters.check(name)
            running = sorted(seq.req.sequence_id for seq in self._live.values()
                             if seq.req.adapter == name)
            sessions = sorted(sid for sid, held in self._session_adapters.items() if held == name)
            if running or sessions:
                raise AdapterBusy(name, running, sessions)
            adapter = self.adapters.unload(name)
        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        return adapter

    @property
    def adapter_bytes(self) -> int:
        """Bytes the loaded LoRA adapters hold (on the session's device)."""
        return self.adapters.total_bytes() if self.adapters is not None else 0

    def submit(self, req: SequenceRequest, on_event: Callable[[Event], None],
               session_id: str = "", checked: bool = False) -> SequenceHandle:
        """Check, charge KV for prompt + max_new_tokens and queue; raises synchronously.

        `checked`: the caller already ran `check(req)` (the servicer does, before it
        claims a lease, so a refused request leaves the lease alone): not run twice.

        With `session_id`, a turn of that open session: `req.prompt_ids` is the
        whole rendered conversation; the longest common token prefix with what
        the session holds is reused (not prefilled again) and the rest rewound.
        When the turn ends, the session keeps its K/V, charged for what it holds.
        `on_event` runs on the engine thread and must be cheap and non-blocking.
        """
        if not checked:
            self.check(req)
        seq = Sequence(req, on_event, self.tokenizer, self.spec.vocab_size,
                       self.spec.eos_token_ids)
        if req.constraint is not None:
            seq.constraint = self.constraints.compile(req.constraint)  # before any KV is charged
        if self.speculative == "ngram" and req.speculative:
            seq.drafter = Drafter(max_k=self.config.speculative_max_tokens)
        detail = (f"{tokens(req.prompt_tokens)} of prompt + max_new_tokens {req.max_new_tokens:,} "
                  f"at {self.spec.bytes_per_token:,} bytes/token")
        with self._cond:
            if self._closing:
                raise EngineError("the engine is closed; start a new worker")
            if req.sequence_id in self._live:
                raise LeaseInUse(req.sequence_id)
            # Pinned before the charge is made, so the eviction the charge may need leaves it.
            if req.adapter:  # again under the lock: an unload may have run since check()
                self.check_adapter(req.adapter)
            hit = (self.prefix_cache.lookup(req.prompt_ids, req.adapter)
                   if self.prefix_cache is not None else None)
            try:
                if session_id:
                    held = self._session_adapters.get(session_id, req.adapter)
                    if held != req.adapter:
                        raise InvalidRequest("adapter", f"session {session_id!r} runs under "
                                             f"adapter {held or '(base)'!r}; a turn cannot "
                                             f"switch to {req.adapter or '(base)'!r}: open "
                                             "another session for it")
                    start = self._sessions().begin_turn(session_id, req.prompt_ids,
                                                        req.max_tokens, detail)
                    seq.continue_session(session_id, start.allocation, start.reused_tokens,
                                         start.resume)
                    self._session_adapters[session_id] = req.adapter
                    if start.reused_tokens and hit is not None:  # the session's own KV wins
                        self._release_hit(hit)
                        hit = None
                else:
                    seq.charged(self.kv.allocate(req.max_tokens, detail=detail))
            except BaseException:
                self._release_hit(hit)
                raise
            if hit is not None:
                seq.start_from_cache(hit)
            self._live[req.sequence_id] = seq
            self._inbox.append(seq)
            self._cond.notify()
        return SequenceHandle(self, seq)

    def generate(self, req: SequenceRequest, timeout_s: float | None = None) -> Completed:
        """Submit and wait (tests, benchmarks); raises the sequence's error if it fails."""
        done = threading.Event()
        terminal: list[Event] = []

        def on_event(event: Event) -> None:
            if isinstance(event, TERMINAL):
                terminal.append(event)
                done.set()

        handle = self.submit(req, on_event)
        if not done.wait(timeout_s):
            handle.cancel()
            raise EngineError(f"sequence {req.sequence_id!r} did not finish in {timeout_s} s")
        event = terminal[0]
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Cancelled):
            raise EngineError(f"sequence {req.sequence_id!r} was cancelled")
        return event

    # --- sessions (any thread) -------------------------------------------------

    def _sessions(self) -> SessionTable:
        if self.sessions is None:
            raise InvalidRequest("session", f"sessions keep K/V as rows of a row store; this "
                                 f"worker runs kv_layout {self.kv_layout!r}: use kv_layout "
                                 "auto to serve sessions")
        return self.sessions

    def open_session(self, session_id: str) -> SessionInfo:
        """Open an empty session (idempotent); its first turn prefills everything."""
        with self._cond:
            return self._sessions().open(session_id)

    def session_info(self, session_id: str) -> SessionInfo:
        with self._cond:
            return self._sessions().info(session_id)

    def swap_out_session(self, session_id: str) -> int:
        """Move an idle session's K/V out of the KV capacity; returns the pool bytes freed."""
        with self._cond:
            return self._sessions().swap_out(session_id)

    def close_session(self, session_id: str) -> int:
        """Forget an idle session; returns the pool bytes freed (SessionBusy during a turn)."""
        with self._cond:
            freed = self._sessions().close(session_id)
            self._session_adapters.pop(session_id, None)
            return freed

    def close(self) -> None:
        """Stop the engine thread; queued and running sequences end with Failed. Idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _release_hit(self, hit: CachedPrefix | None) -> None:
        if hit is not None and self.prefix_cache is not None:
            self.prefix_cache.release(hit)

    def _cancel(self, seq: Sequence) -> None:
        with self._cond:
            seq.request_cancel()
            self._cond.notify()

    def stop_sequence(self, sequence_id: str, error: Exception) -> bool:
        """End a live sequence at its next step with `error` (its Failed event), its KV
        freed as on any exit; False when no such sequence is live."""
        with self._cond:
            seq = self._live.get(sequence_id)
            if seq is None or seq.done:
                return False
            seq.request_cancel(error)
            self._cond.notify()
            return True

    def held_bytes_by_key(self) -> dict[str, int]:
        """KV bytes charged now to each live sequence (by its sequence id, which is its
        lease id) and to each idle session (by its session id), in one look."""
        with self._cond:
            held = {seq.sequence_id: seq.kv.nbytes for seq in self._live.values()
                    if seq.kv is not None and not seq.kv.freed}
            if self.sessions is not None:
                held.update(self.sessions.charged_bytes_by_session())
            return held

    # --- the engine thread ---------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._inbox and not self.scheduler.has_work:
                    self._cond.wait()
                if self._closing:
                    break
                for seq in self._inbox:
                    self.scheduler.add(seq)
                self._inbox.clear()
            with self._step_lock:
                self._leave_cancelled()
                self.step()
        closing = EngineError("the worker's engine closed while the sequence was in flight; "
                              "resubmit it")
        with self._cond:
            left = self._inbox + list(self.scheduler.waiting) + list(self.scheduler.running)
            self._inbox.clear()
        for seq in left:
            self._finish(seq, Failed(seq.sequence_id, closing))
        if self.sessions is not None:
            with self._cond:
                self.sessions.drop_all()
        self.runtime.close()
        self._masks.close()

    def step(self) -> None:
        """One engine step: schedule -> run -> postprocess."""
        plan = self.scheduler.schedule()
        if plan.empty:
            return
        now = time.perf_counter()
        for chunk in plan.prefills:
            chunk.seq.mark_scheduled(now)
        if self.speculative != "off" and plan.decodes:
            plan = speculation.with_drafts(plan, self._costs, self.batch_rows)
        wait_for_masks = self._masks.start(step_constraints(plan))
        output = self.runner.run(plan)
        wait_for_masks()
        if output.decode_rows:
            self._costs.record_decode(output.decode_rows, output.decode_s)
        for seconds in output.verify_s:
            self._costs.record_verify(seconds)
        self._postprocess(plan, output)

    def _greedy_choices(self, output: StepOutput) -> dict[str, int]:
        """The greedy rows' tokens (no constraint, penalty, bias or logprobs) from one argmax
        over the step's logits, not one per row: the same tokens. A row whose argmax is
        suppressed (EOS before min_new_tokens) is left to its sampler."""
        steps = [s for s in output.steps.values() if s.logits is not None and s.error is None
                 and s.seq.constraint is None and s.seq.req.top_logprobs is None
                 and plain_greedy(s.seq.sampler)]
        chosen = greedy_tokens([s.logits for s in steps], self.spec.vocab_size) if steps else []
        return {s.seq.sequence_id: c for s, t in zip(steps, chosen, strict=True)
                if (c := greedy_choice(s.seq.sampler, t)) is not None}

    def _postprocess(self, plan: StepPlan, output: StepOutput) -> None:
        greedy = self._greedy_choices(output)
        completed: dict[Sequence, Event] = {}  # finished after the loop, in the runner's order
        for step in output.steps.values():
            seq = step.seq
            if step.prefix_restored:
                seq.prefix_restored()
            if step.error is not None:
                self._fail(seq, step.error)
                continue
            if step.verify_logits is not None:
                try:
                    finish_reason = speculation.accept_verified(step, self.runner)
                except Exception as exc:
                    self._fail(seq, exc)
                    continue
                if finish_reason is not None:
                    completed[seq] = seq.completed(finish_reason)
                continue
            seq.computed(step.computed_tokens)
            chosen = step.token if step.token is not None else greedy.get(seq.sequence_id)
            if step.logits is None and step.token is None:
                continue  # more prompt to go
            try:
                token, text, finish_reason, logprobs = seq.accept(step.logits, chosen)
            except Exception as exc:
                self._fail(seq, exc)
                continue
            # Logprobs travel with their token (the same event), so a chunk's entries
            # always match its token ids.
            seq.emit(TokenDelta(seq.sequence_id, (token,), text,
                                (logprobs,) if logprobs is not None else ()))
            if finish_reason is not None:
                completed[seq] = seq.completed(finish_reason)
        for seq in self.runner.leaving_order(list(completed)):
            self._finish(seq, completed[seq])
        self._leave_cancelled()

    def _leave_cancelled(self) -> None:
        for seq in [*self.scheduler.waiting, *self.scheduler.running]:
            if seq.cancel_requested and not seq.done:
                self._finish(seq, Cancelled(seq.sequence_id, seq.num_output_tokens)
                             if seq.cancel_error is None else
                             Failed(seq.sequence_id, seq.cancel_error))

    def _fail(self, seq: Sequence, error: Exception) -> None:
        # One sequence's failure fails that sequence, never the engine.
        if not isinstance(error, EngineError):
            log.error("sequence_failed", sequence_id=seq.sequence_id,
                      error=f"{type(error).__name__}: {error}", exc_info=error)
            error = EngineError(f"the engine failed on this sequence ({type(error).__name__}: "
                                f"{error}); the worker goes on, retry the request")
        self._finish(seq, Failed(seq.sequence_id, error))

    def _finish(self, seq: Sequence, event: Event) -> None:
        """Free the sequence's KV once, then send its one terminal event."""
        if not seq.end():
            return
        self.scheduler.remove(seq)
        if isinstance(seq.resume, CachedPrefix):  # a cache hit no row took: unpin it
            self._release_hit(seq.take_unused_prefix())
        if seq.session_id:
            # A failed turn's K/V may be partial: dropped. A finished or cancelled
            # one holds exactly its computed tokens: kept for the next turn.
            held = None
            if not isinstance(event, Failed):
                held = self.runner.park(seq)
                if held is None:  # it never got a row: what it holds is the reused prefix
                    held = seq.take_unused_prefix()
            if held is None:
                self.runner.forget(seq)
            with self._cond:
                self._sessions().end_turn(seq.session_id, seq.kv, held)
        else:
            # Its whole blocks go to the prefix cache (a failed sequence's K/V may be partial),
            # pinned: its charge covers them until it is freed, then they count.
            cached = [] if isinstance(event, Failed) else self.runner.fill_prefix_cache(seq)
            self.runner.forget(seq)
            if seq.kv is not None:
                self.kv.free(seq.kv)
            if cached and self.prefix_cache is not None:
                self.prefix_cache.unpin_all(cached)
        with self._cond:
            self._live.pop(seq.sequence_id, None)
        seq.emit(event)
