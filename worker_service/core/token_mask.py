"""Output constraints over the model's vocabulary: llguidance matchers and token masks.

- `ConstraintCompiler` (one per engine): llguidance's tokenizer, built once from
  the model's tokenizer.json on first use (~0.3 s; an unconstrained worker never
  pays it), and a bounded cache of compiled matchers keyed by grammar text, so a
  repeated schema compiles once and each request gets a copy.
- `Constraint` (one per sequence): the allowed-token mask for the next token,
  `advance(token)` after each sample, `complete` (no token can follow) and
  `satisfied` (the output so far is a whole match).
- `MaskBatch` (one per engine): the masks of every constrained row of a step in
  one call into llguidance's thread pool, which releases the GIL, so the engine
  can compute them while the ORT run (which releases it too) goes on.

Pure: no grpc, protobuf or ORT.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from ortserve.output import constraint_grammar as constraints
from ortserve.output.constraint_grammar import ConstraintSpec
from worker_service.core.errors import EngineError, InvalidWorkerField

MATCHER_CACHE_ENTRIES = 64
_BITS = 32  # llguidance packs the mask into int32 words, bit i of word w = token 32w + i


def mask_words(vocab_size: int) -> int:
    return (vocab_size + _BITS - 1) // _BITS


def unpack_mask(words: np.ndarray, vocab_size: int) -> np.ndarray:
    """One packed int32 mask row -> a bool array over the vocabulary (True: allowed)."""
    bits = np.unpackbits(np.ascontiguousarray(words).view(np.uint8), bitorder="little")
    return bits[:vocab_size].view(np.bool_)


class ConstraintError(EngineError):
    """The matcher failed mid-sequence (e.g. the grammar hit llguidance's per-step limits)."""


class Constraint:
    """One sequence's constraint: its matcher and the next token's mask."""

    def __init__(self, spec: ConstraintSpec, matcher, vocab_size: int) -> None:
        self.spec = spec
        self.vocab_size = vocab_size
        self._matcher = matcher
        self._allowed: np.ndarray | None = None  # the next token's mask; None: not computed

    @property
    def matcher(self):
        return self._matcher

    def set_mask(self, words: np.ndarray) -> None:
        """The next token's mask, computed elsewhere (MaskBatch) from the current state; a
        matcher error surfaces at `allowed`, in that sequence's own accept."""
        self._allowed = unpack_mask(words, self.vocab_size)

    def allowed(self) -> np.ndarray:
        """The tokens that keep the output a prefix of a match (EOS only where it is whole)."""
        if self._allowed is None:
            import llguidance.numpy as llg_np

            words = llg_np.allocate_token_bitmask(1, self.vocab_size)
            llg_np.fill_next_token_bitmask(self._matcher, words, 0)
            self.set_mask(words[0])
        self._check()
        assert self._allowed is not None
        return self._allowed

    @property
    def has_mask(self) -> bool:
        return self._allowed is not None

    def advance(self, token: int) -> None:
        """The sampler chose `token` (from the mask): move the matcher past it."""
        self._allowed = None
        self._matcher.consume_token(token)
        self._check()

    def valid_prefix(self, tokens: Sequence[int]) -> int:
        """How many of `tokens`, from the current state, the constraint allows in a row (a
        speculative proposal is cut there before it is verified); the state is unchanged."""
        return int(self._matcher.validate_tokens(list(tokens)))

    @property
    def complete(self) -> bool:
        """No further token is possible: the output is a whole match and must end now."""
        return bool(self._matcher.is_stopped())

    @property
    def satisfied(self) -> bool:
        """The output so far is a whole match (it may still be extended)."""
        return bool(self._matcher.is_accepting())

    def _check(self) -> None:
        if self._matcher.is_error():
            raise ConstraintError(f"the {self.spec.field} matcher failed: "
                                  f"{self._matcher.get_error()}; simplify the constraint or "
                                  "send it without one")


class ConstraintCompiler:
    """Compiles specs for one vocabulary; thread-safe (callers compile at submit)."""

    def __init__(self, tokenizer_json: Callable[[], str], vocab_size: int,
                 eos_token_ids: Sequence[int], cache_entries: int = MATCHER_CACHE_ENTRIES) -> None:
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos = list(eos_token_ids)
        self._entries = cache_entries
        self._lock = threading.Lock()
        self._tokenizer = None
        self._cache: OrderedDict[str, object] = OrderedDict()  # grammar text -> pristine matcher

    def _llg_tokenizer(self):
        from llguidance import LLTokenizer

        # Under the lock: two first requests build it once.
        if self._tokenizer is None:
            self._tokenizer = LLTokenizer(self._tokenizer_json(), n_vocab=self.vocab_size,
                                          eos_token=self._eos)
        return self._tokenizer

    def compile(self, spec: ConstraintSpec) -> Constraint:
        """A fresh Constraint for `spec`; InvalidWorkerField naming the field when it cannot compile."""
        grammar = constraints.check(spec)  # the scheduler's rule, cached by text
        with self._lock:
            pristine = self._cache.get(grammar)
            if pristine is not None:
                self._cache.move_to_end(grammar)
        if pristine is None:
            from llguidance import LLMatcher

            with self._lock:
                tokenizer = self._llg_tokenizer()
            # NOTE: outside the lock: construction releases the GIL and may take ms.
            pristine = LLMatcher(tokenizer, grammar, log_level=0)
            if pristine.is_error():
                raise InvalidWorkerField(spec.field, f"{constraints.library_version()} cannot compile "
                                     f"it for this model's vocabulary: {pristine.get_error()}")
            with self._lock:
                self._cache[grammar] = pristine
                while len(self._cache) > self._entries:
                    self._cache.popitem(last=False)
        return Constraint(spec, pristine.deep_copy(), self.vocab_size)


def step_constraints(plan) -> list[Constraint]:
    """The constraints of a StepPlan's rows that will sample after its run: every decode,
    and each prefill chunk that ends its prompt."""
    found = [seq.constraint for seq in plan.decodes if seq.constraint is not None]
    found += [chunk.seq.constraint for chunk in plan.prefills
              if chunk.seq.constraint is not None and chunk.num_tokens >= chunk.seq.num_pending_tokens]
    return found


class MaskBatch:
    """The next-token masks of many constraints in one call (llguidance's thread pool).

    `start` computes them on a helper thread while the caller runs the model: both
    llguidance and ORT release the GIL, so the masks are ready when the logits are.
    A failure there is not raised on the engine thread: a constraint left without a
    mask computes its own in `allowed`, where an error fails only its sequence.
    """

    def __init__(self, vocab_size: int, threads: int = 2, overlap: bool = True) -> None:
        self.vocab_size = vocab_size
        self.overlap = overlap
        self._threads = threads
        self._executor = None
        self._pool: ThreadPoolExecutor | None = None
        self._words = np.zeros((0, mask_words(vocab_size)), dtype=np.int32)

    def start(self, batch: Sequence[Constraint]) -> Callable[[], None]:
        """Begin `fill(batch)` (on a helper thread when `overlap`); returns the wait."""
        if not batch:
            return _nothing
        if not self.overlap:
            self._fill_quietly(batch)
            return _nothing
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ortserve-masks")
        future: Future = self._pool.submit(self._fill_quietly, batch)
        return future.result

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _fill_quietly(self, batch: Sequence[Constraint]) -> None:
        # See the class docstring: a constraint left without a mask computes its own.
        with contextlib.suppress(Exception):
            self.fill(batch)

    def fill(self, batch: Sequence[Constraint]) -> None:
        """Compute each constraint's mask from its current state (`set_mask`); no GIL held
        while llguidance works, so this may run beside an ORT run."""
        todo = [c for c in batch if not c.has_mask]
        if not todo:
            return
        import llguidance
        import llguidance.numpy as llg_np

        if self._executor is None:
            self._executor = llguidance.LLExecutor(self._threads)
        if self._words.shape[0] < len(todo):
            self._words = np.zeros((len(todo), self._words.shape[1]), dtype=np.int32)
        words = self._words[: len(todo)]
        llg_np.fill_next_token_bitmask_par(self._executor,
                                           [(c.matcher, i) for i, c in enumerate(todo)], words)
        for i, c in enumerate(todo):
            c.set_mask(words[i])


def _nothing() -> None:
    return None
