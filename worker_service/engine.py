"""The worker's engine: one ORT session, one engine thread, many sequences.

The engine thread serves every admitted sequence iteration by iteration: each
iteration admits the queued ones (allocating their KV buffer, sized to
prompt + max_new_tokens), prefills them, then runs one decode step for each
running one, round-robin, one sequence per session run. Callers talk to it
through `submit` (thread-safe, validates and reserves KV synchronously) and
receive events on a callback from the engine thread. Every exit (finish,
cancel, error, close) frees the KV buffer once and sends one terminal event.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import structlog

from ortserve.units import tokens
from worker_service.errors import (
    CapacityExceeded,
    ContextWindowFull,
    DeviceUnavailable,
    EngineError,
    InvalidRequest,
    ModelLoadError,
)
from worker_service.kv_cache import KVBuffer, KVLayout, StaticSharedKV
from worker_service.model import ModelSpec, load_model_spec
from worker_service.sampling import Sampler, SamplingConfig
from worker_service.tokenizer import StopTextStream, Tokenizer

log = structlog.get_logger(__name__)

_CUDA = "CUDAExecutionProvider"
_CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class EngineConfig:
    """How to run one model folder."""

    model_dir: Path
    device: str = "cpu"  # "cpu" | "cuda" (the caller resolves "auto")
    device_id: int = 0
    intra_op_threads: int = 0  # 0: the cores this process may use (default ORT threading is slow)
    inter_op_threads: int = 1
    kv_capacity_bytes: int = 512 * 2**20
    # Prompts run in chunks of this many tokens, one chunk per engine iteration:
    # bounds the host logits of a run (chunk x vocab floats) and lets running
    # sequences keep decoding while a long prompt is prefilled.
    prefill_chunk_tokens: int = 512


@dataclass(frozen=True)
class SequenceRequest:
    """One generation: prompt ids in, at most max_new_tokens out."""

    request_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    min_new_tokens: int = 0
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Started:
    """Prefill is starting."""

    request_id: str
    queue_ms: float


@dataclass(frozen=True)
class TokenDelta:
    """One generated token (EOS included) and the text it completes (may be "")."""

    request_id: str
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class Completed:
    """Terminal: generation ended normally."""

    request_id: str
    finish_reason: str  # "length" | "eos" | "stop_sequence"
    stop_sequence: str
    prompt_tokens: int
    generated_tokens: int  # an ending EOS token included
    max_new_tokens: int
    queue_ms: float
    prefill_ms: float
    ttft_ms: float
    decode_ms: float
    decode_tokens_per_s: float
    total_ms: float
    seed: int | None
    text: str  # the whole output text, without a stop sequence or what followed it
    token_ids: tuple[int, ...] = ()  # every generated token


@dataclass(frozen=True)
class Cancelled:
    """Terminal: the caller cancelled."""

    request_id: str
    generated_tokens: int


@dataclass(frozen=True)
class Failed:
    """Terminal: this sequence failed; the engine goes on."""

    request_id: str
    error: EngineError


Event = Started | TokenDelta | Completed | Cancelled | Failed
_TERMINAL = (Completed, Cancelled, Failed)


class Sequence:
    """Engine-thread state of one sequence: its buffer, binding, sampler and output so far."""

    def __init__(self, req: SequenceRequest, on_event: Callable[[Event], None], sampler: Sampler,
                 tokenizer: Tokenizer, reserved_bytes: int, eos_token_ids: tuple[int, ...]) -> None:
        self.req = req
        self.on_event = on_event
        self.sampler = sampler
        self.reserved_bytes = reserved_bytes
        self.eos_token_ids = frozenset(eos_token_ids)
        self.stream = StopTextStream(tokenizer, req.prompt_ids, req.stop)
        self.history = list(req.prompt_ids)  # prompt + output, for the repetition penalty
        self.output_ids: list[int] = []
        self.kv: KVBuffer | None = None
        self.binding: ort.IOBinding | None = None
        self.inputs: list[np.ndarray] = []
        self.cache_tokens = 0  # positions written into the KV buffer (prompt first, chunk by chunk)
        self.cancel_requested = False  # set under the engine's lock, read by the engine thread
        self.done = False
        self.t_submit = time.perf_counter()
        self.t_prefill_start = self.t_first = self.t_last = 0.0
        if req.min_new_tokens > 0:
            # min_new_tokens: EOS is masked until that many tokens exist.
            sampler.suppress(sorted(self.eos_token_ids))

    def emit(self, event: Event) -> None:
        try:
            self.on_event(event)
        except Exception:
            # A broken callback must not take the engine thread down.
            log.exception("event_callback_failed", request_id=self.req.request_id,
                          event=type(event).__name__)

    def choose_and_accept(self, logits: np.ndarray) -> tuple[int, str, str | None]:
        """Sample the next token from the last position's logits and append it.

        Returns (token id, text that may go out now, finish reason or None).
        """
        token = self.sampler(logits, self.history)
        now = time.perf_counter()
        if not self.output_ids:
            self.t_first = now
        self.t_last = now
        self.output_ids.append(token)
        self.history.append(token)
        generated = len(self.output_ids)
        if generated == self.req.min_new_tokens:
            self.sampler.suppress([])
        armed = generated >= self.req.min_new_tokens
        if token in self.eos_token_ids:
            # EOS counts as a generated token but adds no text.
            return token, self.stream.push(None, final=True, stops_armed=armed), "eos"
        final = generated >= self.req.max_new_tokens
        text = self.stream.push(token, final=final, stops_armed=armed)
        if self.stream.stop_sequence:
            return token, text, "stop_sequence"
        return token, text, "length" if final else None

    def completed(self, finish_reason: str) -> Completed:
        end = time.perf_counter()
        generated = len(self.output_ids)
        decode_s = self.t_last - self.t_first
        return Completed(
            request_id=self.req.request_id, finish_reason=finish_reason,
            stop_sequence=self.stream.stop_sequence, prompt_tokens=len(self.req.prompt_ids),
            generated_tokens=generated, max_new_tokens=self.req.max_new_tokens,
            queue_ms=(self.t_prefill_start - self.t_submit) * 1e3,
            prefill_ms=(self.t_first - self.t_prefill_start) * 1e3,
            ttft_ms=(self.t_first - self.t_submit) * 1e3, decode_ms=decode_s * 1e3,
            decode_tokens_per_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0.0,
            total_ms=(end - self.t_submit) * 1e3, seed=self.sampler.seed, text=self.stream.text,
            token_ids=tuple(self.output_ids),
        )


class SequenceHandle:
    """The caller's side of a submitted sequence."""

    def __init__(self, engine: Engine, seq: Sequence) -> None:
        self._engine = engine
        self._seq = seq
        self.request_id = seq.req.request_id

    def cancel(self) -> None:
        """Make the sequence leave within one engine step (Cancelled event); idempotent."""
        self._engine._cancel(self._seq)


class Engine:
    """Loads a model folder onto a device and serves sequences on its own thread."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.spec: ModelSpec = load_model_spec(config.model_dir)
        self.tokenizer = Tokenizer(self.spec.model_dir)
        self.intra_op_threads = config.intra_op_threads or len(os.sched_getaffinity(0))
        self.session = _create_session(self.spec, config, self.intra_op_threads)
        self.provider = self.session.get_providers()[0]
        self.device = "cpu" if config.device == "cpu" else f"cuda:{config.device_id}"
        self.kv: KVLayout = StaticSharedKV(self.spec, config.device, config.device_id)
        self.capacity_bytes = config.kv_capacity_bytes
        self._check_session_io()
        logits_type = next(o.type for o in self.session.get_outputs() if o.name == self.spec.logits_name)
        self._logits_dtype = np.float16 if "float16" in logits_type else np.float32
        # attention_mask must be as long as the current total, not the buffer:
        # GQA derives the sequence length from it.
        self._ones = np.ones(self.spec.context_length, dtype=np.int64)
        self._decode_logits = np.empty((1, 1, self.spec.vocab_size), dtype=self._logits_dtype)
        self._decode_logits_value = ort.OrtValue.ortvalue_from_numpy(self._decode_logits)

        self._cond = threading.Condition()
        self._queue: deque[Sequence] = deque()  # guarded by _cond
        self._live: dict[str, Sequence] = {}  # guarded by _cond
        self._reserved_bytes = 0  # guarded by _cond
        self._closing = False
        self._running: list[Sequence] = []  # engine thread only
        self._thread = threading.Thread(target=self._loop, name="ortserve-engine", daemon=True)
        self._thread.start()
        log.info("engine_ready", model=self.spec.name, provider=self.provider, device=self.device,
                 intra_op_threads=self.intra_op_threads, capacity_bytes=self.capacity_bytes,
                 bytes_per_token=self.spec.bytes_per_token)

    # --- the caller's API (any thread) ---------------------------------------

    def held_bytes(self) -> int:
        """KV bytes held by live sequences now: a queued sequence's reservation counts, since
        its buffer is guaranteed to it; the reservation equals what the buffer holds."""
        with self._cond:
            return self._reserved_bytes

    def active_sequences(self) -> int:
        with self._cond:
            return len(self._live)

    def validate(self, req: SequenceRequest) -> None:
        """Raise InvalidRequest or ContextWindowFull for a request that cannot be served as asked."""
        prompt_tokens = len(req.prompt_ids)
        if prompt_tokens == 0:
            raise InvalidRequest("prompt", "the prompt is empty: send at least one token")
        ids = np.asarray(req.prompt_ids, dtype=np.int64)
        bad = np.flatnonzero((ids < 0) | (ids >= self.spec.vocab_size))
        if bad.size:
            raise InvalidRequest("prompt", f"token id {int(ids[bad[0]])} at position {int(bad[0])} "
                                 f"is outside the vocabulary [0, {self.spec.vocab_size}) of "
                                 f"{self.spec.name}; tokenize with this model's tokenizer")
        if req.max_new_tokens < 1:
            raise InvalidRequest("max_new_tokens",
                                 f"max_new_tokens must be >= 1, got {req.max_new_tokens}")
        if not 0 <= req.min_new_tokens <= req.max_new_tokens:
            raise InvalidRequest("min_new_tokens", f"min_new_tokens {req.min_new_tokens} must be "
                                 f"between 0 and max_new_tokens {req.max_new_tokens}")
        context = self.spec.context_length
        if prompt_tokens >= context or prompt_tokens + req.max_new_tokens > context:
            raise ContextWindowFull(prompt_tokens, req.max_new_tokens, context)
        for i, stop in enumerate(req.stop):
            if not isinstance(stop, str) or not stop:
                raise InvalidRequest("stop", f"stop sequence {i} is empty; drop it or give text")
        req.sampling.validate()

    def submit(self, req: SequenceRequest, on_event: Callable[[Event], None]) -> SequenceHandle:
        """Validate, reserve KV for prompt + max_new_tokens and queue; raises synchronously.

        `on_event` runs on the engine thread and must be cheap and non-blocking.
        """
        self.validate(req)
        prompt_tokens = len(req.prompt_ids)
        needed_bytes = self.kv.bytes_for(prompt_tokens + req.max_new_tokens)
        sampler = Sampler(req.sampling, self.spec.vocab_size)
        seq = Sequence(req, on_event, sampler, self.tokenizer, needed_bytes, self.spec.eos_token_ids)
        with self._cond:
            if self._closing:
                raise EngineError("the engine is closed; start a new worker")
            if req.request_id in self._live:
                raise InvalidRequest("request_id", f"request {req.request_id!r} is already in "
                                     "flight on this worker; use a fresh id")
            # One lock hold for check and reserve: the worker never holds more than it reported.
            if self._reserved_bytes + needed_bytes > self.capacity_bytes:
                raise CapacityExceeded(
                    needed_bytes, self._reserved_bytes, self.capacity_bytes,
                    detail=f"{tokens(prompt_tokens)} of prompt + max_new_tokens "
                           f"{req.max_new_tokens:,} at {self.spec.bytes_per_token:,} bytes/token")
            self._reserved_bytes += needed_bytes
            self._live[req.request_id] = seq
            self._queue.append(seq)
            self._cond.notify()
        return SequenceHandle(self, seq)

    def generate(self, req: SequenceRequest, timeout_s: float | None = None) -> Completed:
        """Submit and wait (tests, benchmarks); raises the sequence's error if it fails."""
        done = threading.Event()
        terminal: list[Event] = []

        def on_event(event: Event) -> None:
            if isinstance(event, _TERMINAL):
                terminal.append(event)
                done.set()

        handle = self.submit(req, on_event)
        if not done.wait(timeout_s):
            handle.cancel()
            raise EngineError(f"request {req.request_id!r} did not finish in {timeout_s} s")
        event = terminal[0]
        if isinstance(event, Failed):
            raise event.error
        if isinstance(event, Cancelled):
            raise EngineError(f"request {req.request_id!r} was cancelled")
        return event

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

    def _cancel(self, seq: Sequence) -> None:
        with self._cond:
            seq.cancel_requested = True
            self._cond.notify()

    # --- the engine thread ---------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not self._queue and not self._running:
                    self._cond.wait()
                if self._closing:
                    break
                admitted = list(self._queue)
                self._queue.clear()
            stepped = list(self._running)  # the admitted ones get their first chunk below
            for seq in admitted:
                self._guarded(seq, self._admit)
            for seq in stepped:
                self._guarded(seq, self._step)
        closing = EngineError("the worker's engine closed while the sequence was in flight; "
                              "resubmit it")
        with self._cond:
            left = list(self._queue) + self._running
            self._queue.clear()
        for seq in left:
            self._finish(seq, Failed(seq.req.request_id, closing))

    def _guarded(self, seq: Sequence, step: Callable[[Sequence], None]) -> None:
        # One sequence's failure fails that sequence, never the engine.
        if seq.done:
            return
        try:
            if not seq.cancel_requested:
                step(seq)
        except EngineError as exc:
            self._finish(seq, Failed(seq.req.request_id, exc))
        except Exception as exc:
            log.exception("sequence_failed", request_id=seq.req.request_id)
            self._finish(seq, Failed(seq.req.request_id, EngineError(
                f"the engine failed on this sequence ({type(exc).__name__}: {exc}); "
                "the worker goes on, retry the request")))
        if seq.cancel_requested and not seq.done:
            self._finish(seq, Cancelled(seq.req.request_id, len(seq.output_ids)))

    def _admit(self, seq: Sequence) -> None:
        seq.t_prefill_start = time.perf_counter()
        seq.emit(Started(seq.req.request_id, (seq.t_prefill_start - seq.t_submit) * 1e3))
        try:
            seq.kv = self.kv.allocate(len(seq.req.prompt_ids) + seq.req.max_new_tokens)
        except Exception as exc:
            raise CapacityExceeded(seq.reserved_bytes, self.held_bytes(), self.capacity_bytes,
                                   detail=f"allocation on {self.device} failed: {exc}") from exc
        seq.binding = self.session.io_binding()
        seq.kv.bind(seq.binding)
        self._running.append(seq)
        self._step(seq)

    def _step(self, seq: Sequence) -> None:
        """One run for the sequence: its next prompt chunk, or one decode token."""
        prompt = seq.req.prompt_ids
        if seq.cache_tokens < len(prompt):
            chunk = prompt[seq.cache_tokens: seq.cache_tokens + max(self.config.prefill_chunk_tokens, 1)]
            logits = self._run(seq, chunk)
            if seq.cache_tokens < len(prompt):
                return  # more prompt to go; logits of a middle chunk are not needed
        else:
            logits = self._run(seq, (seq.output_ids[-1],))
        self._accept(seq, logits)

    def _run(self, seq: Sequence, new_ids: tuple[int, ...] | list[int]) -> np.ndarray:
        """One session run over new_ids appended to the sequence's cache; last position's logits."""
        n = len(new_ids)
        past = seq.cache_tokens
        total = past + n
        assert seq.kv is not None and seq.binding is not None and total <= seq.kv.max_tokens
        spec, binding = self.spec, seq.binding
        # The binding references these arrays' memory: keep them alive through the run.
        seq.inputs = [np.asarray(new_ids, dtype=np.int64).reshape(1, n),
                      self._ones[:total].reshape(1, total)]
        binding.bind_cpu_input(spec.input_ids_name, seq.inputs[0])
        binding.bind_cpu_input(spec.attention_mask_name, seq.inputs[1])
        if spec.position_ids_name:
            seq.inputs.append(np.arange(past, total, dtype=np.int64).reshape(1, n))
            binding.bind_cpu_input(spec.position_ids_name, seq.inputs[2])
        if n == 1:
            out, out_value = self._decode_logits, self._decode_logits_value
        else:
            out = np.empty((1, n, spec.vocab_size), dtype=self._logits_dtype)
            out_value = ort.OrtValue.ortvalue_from_numpy(out)
        # Logits land in host memory; the KV stays where it was allocated.
        binding.bind_ortvalue_output(spec.logits_name, out_value)
        self.session.run_with_iobinding(binding)
        seq.cache_tokens = total
        return out[0, -1]

    def _accept(self, seq: Sequence, logits: np.ndarray) -> None:
        token, text, finish_reason = seq.choose_and_accept(logits)
        seq.emit(TokenDelta(seq.req.request_id, (token,), text))
        if finish_reason is not None:
            self._finish(seq, seq.completed(finish_reason))

    def _finish(self, seq: Sequence, event: Event) -> None:
        """Free the sequence's KV once, then send its one terminal event."""
        if seq.done:
            return
        seq.done = True
        if seq.binding is not None:
            seq.binding.clear_binding_inputs()
            seq.binding.clear_binding_outputs()
            seq.binding = None
        if seq.kv is not None:
            seq.kv.free()
        if seq in self._running:
            self._running.remove(seq)
        with self._cond:
            self._reserved_bytes -= seq.reserved_bytes
            self._live.pop(seq.req.request_id, None)
        seq.emit(event)

    def _check_session_io(self) -> None:
        names = {i.name for i in self.session.get_inputs()}
        needed = {self.spec.input_ids_name, self.spec.attention_mask_name,
                  self.spec.past_key_name.format(i=0)}
        if not needed <= names:
            raise ModelLoadError(f"the session of {self.spec.model_file} lacks inputs "
                                 f"{sorted(needed - names)}; rebuild the model folder")


def _create_session(spec: ModelSpec, config: EngineConfig, intra_op_threads: int
                    ) -> ort.InferenceSession:
    if config.device not in ("cpu", "cuda"):
        raise DeviceUnavailable(f"device {config.device!r} is not one of 'cpu', 'cuda'")
    options = ort.SessionOptions()
    # Explicit threads: ORT's default pool is clearly slower on small machines (MODEL_NOTES).
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = config.inter_op_threads
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # The missing-CUDA warnings are reported, with a remedy, by DeviceUnavailable.
    options.log_severity_level = 3
    preload_log = ""
    if config.device == "cuda":
        providers: list = [(_CUDA, {"device_id": config.device_id}), _CPU]
        preload_log = _preload_cuda_libraries()
    else:
        providers = [_CPU]
    try:
        session = ort.InferenceSession(str(spec.model_file), options, providers=providers)
    except Exception as exc:
        raise ModelLoadError(f"ONNX Runtime could not load {spec.model_file}: {exc}") from exc
    active = session.get_providers()
    if config.device == "cuda" and (not active or active[0] != _CUDA):
        raise DeviceUnavailable(
            f"{_CUDA} not active: the session runs on {active} because "
            f"{describe_missing_cuda(config.device_id, preload_log)}; ONNX Runtime falls back to "
            "CPU silently, so the worker refuses to start. Install the CUDA and cuDNN libraries "
            "onnxruntime-gpu needs on a machine with an NVIDIA GPU, or run with --device cpu")
    return session


def _preload_cuda_libraries() -> str:
    # onnxruntime-gpu finds pip-installed CUDA/cuDNN (nvidia-* wheels) only after
    # preload_dlls; it prints what it could not load, which the diagnosis reuses.
    captured = io.StringIO()
    with contextlib.suppress(Exception), contextlib.redirect_stdout(captured):
        ort.preload_dlls()
    return captured.getvalue()


def describe_missing_cuda(device_id: int = 0, preload_log: str = "") -> str:
    """Best-effort account of why the CUDA provider did not come up."""
    if _CUDA not in ort.get_available_providers():
        return "this onnxruntime build has no CUDA provider (install onnxruntime-gpu, not onnxruntime)"
    reasons = []
    capi = Path(ort.__file__).parent / "capi"
    try:
        ctypes.CDLL(str(capi / "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(str(capi / "libonnxruntime_providers_cuda.so"))
    except OSError as exc:
        reasons.append(f"its CUDA provider library cannot load ({exc})")
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        reasons.append("no NVIDIA GPU is visible (no /dev/nvidia0)")
    elif not Path(f"/dev/nvidia{device_id}").exists():
        reasons.append(f"GPU {device_id} is not visible (no /dev/nvidia{device_id})")
    failed = [line.strip() for line in preload_log.splitlines() if line.startswith("Failed to load")]
    if failed and not reasons:
        reasons.append("; ".join(failed[:3]))
    return " and ".join(reasons) or "the CUDA provider failed to initialise (see ORT's log)"
