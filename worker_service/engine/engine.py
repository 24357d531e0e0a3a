"""The worker's engine: one ORT session, one engine thread, many sequences.

Callers talk to it through `submit` (thread-safe: checks the request against
the model, charges its KV in the pool and queues it, raising synchronously)
and receive events on a callback from the engine thread. The engine thread
repeats one step, in the shape of nano-vllm's `LLMEngine.step`:

    plan = scheduler.schedule()      # which sequences, how many tokens each
    output = runner.run(plan)        # the ORT runs; what changed, per sequence
    postprocess(output)              # apply it: count, sample, stop, emit, free what finished

Runners change no sequence state (runtime/runner.py): the postprocess
(postprocess.py) is the one place a step's results reach the sequences.

Every exit (finish, cancel, error, close) frees the KV once and sends one
terminal event.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from ortserve.rules import request_rules
from ortserve.status.units import human_bytes, tokens
from worker_service.core.errors import EngineError, InvalidWorkerField, LeaseInUse
from worker_service.core.ngram import Drafter
from worker_service.core.prefill_budget import PrefillPace, strictest_goal_ms
from worker_service.core.sequence import (
    TERMINAL,
    Cancelled,
    Completed,
    Event,
    Failed,
    Sequence,
    SequenceRequest,
)
from worker_service.core.speculative import VerifyCosts
from worker_service.core.step_scheduler import StepPlan, StepScheduler
from worker_service.core.token_mask import ConstraintCompiler, MaskBatch, step_constraints
from worker_service.core.tokenizer import Tokenizer
from worker_service.engine import speculation
from worker_service.engine.adapters import EngineAdapters
from worker_service.engine.config import EngineConfig
from worker_service.engine.postprocess import apply_step
from worker_service.engine.session_turns import SessionKVTurns
from worker_service.engine.step_times import StepTimes
from worker_service.runtime.factory import build_runtime, open_device_session
from worker_service.runtime.lora import AdapterSet
from worker_service.runtime.model import ModelSpec, load_model_spec
from worker_service.runtime.prefix_cache import CachedPrefix, PrefixCache
from worker_service.runtime.runner import Runner, StepOutput
from worker_service.runtime.session_disk import SessionDisk
from worker_service.runtime.session_file import ModelIdentity
from worker_service.runtime.session_kv import SessionInfo, SessionTable

log = structlog.get_logger("worker_service.engine")  # the engine's lines, as before the move to engine/


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
        loaded = open_device_session(config, self.spec)
        session = loaded.session
        self.providers: tuple[str, ...] = loaded.providers  # what ORT resolved
        self.provider = self.providers[0]
        self.nodes_by_provider = loaded.nodes_by_provider
        self.nodes_off_device = loaded.nodes_off_device
        self.device = loaded.device
        self.intra_op_threads = loaded.intra_op_threads
        chunk_tokens = max(config.prefill_chunk_tokens, 1)
        # The pool, the runner and the rows behind them, for this device (runtime/factory.py).
        self.runtime = build_runtime(config, self.spec, session, chunk_tokens)
        self.kv = self.runtime.pool
        self.runner: Runner = self.runtime.runner
        self.kv_layout = self.runtime.kind
        self.prefix_cache: PrefixCache | None = self.runtime.prefix_cache
        # LoRA adapters (runtime/lora.py): a graph with LoRA inputs has a set on a batched
        # runner; --lora on a base without them is refused with the reason.
        served: AdapterSet | None = getattr(self.runner, "adapters", None)
        for name, path in config.lora_adapters:
            (served or AdapterSet(session)).load(name, path)
        # Speculation where the runner verifies drafts exactly (speculation.resolve).
        self.speculative, self.verify_drift, self.speculative_note = speculation.resolve(
            config, self.runner, self.kv_layout)
        self._costs = VerifyCosts()
        self.step_times = StepTimes()  # the heartbeat reports them (the time budget)
        # What a decode step and a prompt token cost here: prompt chunks beside decodes are
        # held to the decodes' gap goal (core/prefill_budget.py).
        self.prefill_pace = PrefillPace()
        self.scheduler = StepScheduler(max_prefill_tokens=chunk_tokens,
                                       can_start=self.runner.can_start,
                                       prefill_budget=self._prefill_budget)
        # Output constraints: llguidance's tokenizer is built on the first constrained request.
        self.constraints = ConstraintCompiler(self.tokenizer.to_json, self.spec.vocab_size,
                                              self.spec.eos_token_ids)
        self._masks = MaskBatch(self.spec.vocab_size, threads=min(self.intra_op_threads, 4),
                                overlap=config.constraint_mask_overlap)

        self._step_lock = threading.Lock()  # held around each step (engine_adapters.py)
        self._cond = threading.Condition()
        self.adapters = EngineAdapters(served, self._step_lock, self._cond, self._using_adapter,
                                       self.prefix_cache)
        # Sessions keep K/V between turns as host copies of their rows (session_turns.py),
        # parked on disk with --session-dir, its files valid for this model's K/V only.
        disk = (SessionDisk(Path(config.session_dir), config.session_disk_bytes,
                            ModelIdentity.of(self.spec)) if config.session_dir else None)
        self.session_turns = SessionKVTurns(
            SessionTable(self.kv, disk=disk) if self.runtime.capabilities.sessions else None,
            self.kv_layout, self._cond)
        self._inbox: list[Sequence] = []  # guarded by _cond: submitted, not yet scheduled
        self._live: dict[str, Sequence] = {}  # guarded by _cond
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="ortserve-engine", daemon=True)
        self._graphs_ready = threading.Event()
        self._thread.start()
        # A capture must see no other thread's CUDA calls: nothing else starts before it ends.
        self._graphs_ready.wait()
        self._charge_decode_path()
        log.info("engine_ready", model=self.spec.name, provider=self.provider, device=self.device,
                 nodes_by_provider=self.nodes_by_provider, nodes_off_device=self.nodes_off_device,
                 intra_op_threads=self.intra_op_threads, capacity_bytes=self.capacity_bytes,
                 bytes_per_token=self.spec.bytes_per_token,
                 kv_reserved_bytes=self.runtime.reserved_bytes,
                 kv_charged_bytes=self.runtime.allocated_bytes,
                 kv_allocator=self.runtime.memory_strategy or "host (committed on touch)")

    def _charge_decode_path(self) -> None:
        """Take what the decode path holds beside the KV on its device (the buckets' fixed
        buffers, the captured graphs' measured memory) off the KV capacity, before
        anything is admitted: the capacity registered with the scheduler is what is left,
        so what the worker holds never exceeds what the ledger charged."""
        stats = getattr(self.runner, "step_stats", None)
        self.decode_buffer_bytes = stats.graph_bytes if stats is not None else 0
        self.decode_graph_bytes = stats.capture_bytes if stats is not None else 0
        charge = self.decode_buffer_bytes + self.decode_graph_bytes
        if charge and self.kv.take_capacity(charge) is not None:
            capacity = self.capacity_bytes
            self.close()
            raise InvalidWorkerField(
                "kv_capacity", f"the decode buckets' fixed buffers "
                f"({human_bytes(self.decode_buffer_bytes)}) and captured CUDA graphs "
                f"({human_bytes(self.decode_graph_bytes)}) take {human_bytes(charge)} "
                f"({charge:,} bytes) of the KV capacity, which is only {human_bytes(capacity)} "
                f"({capacity:,} bytes); raise --kv-capacity, lower --max-batch-rows, or "
                "start with --cuda-graphs off")
        if charge:
            log.info("decode path charged", decode_buffer_bytes=self.decode_buffer_bytes,
                     decode_graph_bytes=self.decode_graph_bytes,
                     capacity_bytes=self.capacity_bytes,
                     note="taken off the KV capacity before anything is admitted")

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
    def sessions(self) -> SessionTable | None:
        """What each session holds (None where the runtime parks no rows)."""
        return self.session_turns.table

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
            self.adapters.check(req.adapter)

    def _using_adapter(self, name: str) -> tuple[list[str], list[str]]:
        """The live sequences and the sessions under adapter `name` (holding _cond)."""
        running = sorted(seq.req.sequence_id for seq in self._live.values()
                         if seq.req.adapter == name)
        return running, self.session_turns.under(name)

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
                self.adapters.check(req.adapter)
            hit = (self.prefix_cache.lookup(req.prompt_ids, req.adapter,
                                            req.continues_kept_answer)
                   if self.prefix_cache is not None else None)
            try:
                if session_id:
                    reused = self.session_turns.begin(seq, session_id, detail)
                    if reused and hit is not None:  # the session's own KV wins
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

    # --- sessions (any thread; session_turns.py) ------------------------------

    def open_session(self, session_id: str) -> SessionInfo:
        return self.session_turns.open(session_id)

    def session_info(self, session_id: str) -> SessionInfo:
        return self.session_turns.info(session_id)

    def swap_out_session(self, session_id: str) -> int:
        return self.session_turns.swap_out(session_id)

    def close_session(self, session_id: str) -> int:
        return self.session_turns.close(session_id)

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
            held.update(self.session_turns.charged_bytes())
            return held

    # --- the engine thread ---------------------------------------------------

    def _loop(self) -> None:
        # CUDA graphs are captured on the thread that replays them (runtime/decode_step.py).
        try:
            getattr(self.runner, "warm_graphs", lambda: None)()
        finally:
            self._graphs_ready.set()
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
        self.session_turns.drop_all()
        self.runtime.close()
        self._masks.close()

    def step(self) -> None:
        """One engine step: schedule -> run -> postprocess."""
        plan = self.scheduler.schedule()
        if plan.empty:
            return
        try:
            self._run_step(plan)
        except Exception as exc:
            # A step that failed whole (a sequence's own error comes back in its step
            # output): its sequences fail and free their KV, the engine thread goes on.
            for seq in plan.sequences:
                self._fail(seq, exc)

    def _run_step(self, plan: StepPlan) -> None:
        now = time.perf_counter()
        for chunk in plan.prefills:
            chunk.seq.mark_scheduled(now)
        if self.speculative != "off" and plan.decodes:
            plan = speculation.with_drafts(plan, self._costs, self.batch_rows)
        wait_for_masks = self._masks.start(step_constraints(plan))
        output = self.runner.run(plan)
        wait_for_masks()
        self._costs.record(output.decode_rows, output.decode_s, output.verify_s)
        self._postprocess(output)
        # The whole step, postprocessing included: a stream's token gap. The scheduler gets
        # the steps without chunks (the decode step); the chunks' cost feeds their budget.
        elapsed_s = time.perf_counter() - now
        prompt_tokens = sum(c.num_tokens for c in plan.prefills)
        self.step_times.record(output.decode_rows, elapsed_s, prompt_tokens)
        self.prefill_pace.record(len(plan.decodes), len(plan.prefills), prompt_tokens, elapsed_s)

    def _prefill_budget(self, decodes: list[Sequence]) -> int:
        """Prompt tokens a step with these decodes may run: within their strictest gap goal."""
        goal_ms = strictest_goal_ms(seq.req.max_itl_ms for seq in decodes)
        return self.prefill_pace.budget_tokens(goal_ms, len(decodes),
                                               self.scheduler.max_prefill_tokens)

    def _postprocess(self, output: StepOutput) -> None:
        """Apply the step's output (postprocess.py), then free what failed or finished."""
        applied = apply_step(output, self.runner, self.spec.vocab_size)
        for seq, error in applied.failed:
            self._fail(seq, error)
        for seq in self.runner.leaving_order(list(applied.completed)):
            self._finish(seq, applied.completed[seq])
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
            self.session_turns.end(seq, isinstance(event, Failed), self.runner)
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
