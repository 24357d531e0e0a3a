"""One sequence's request, state and events: pure Python, no ORT, no grpc.

A sequence's tokens are its prompt followed by what it generated. One counter,
`num_computed_tokens`, says how many of them the KV cache holds: prefill and
decode are the same thing (compute the pending tokens), only the chunk size
differs. The engine reads events; the servicer turns them into protobuf.
"""

from __future__ import annotations

import copy
import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from ortserve.output.constraint_grammar import ConstraintSpec
from ortserve.output.reasoning import ReasoningTokenCounter
from ortserve.rules import request_rules
from worker_service.core.errors import EngineError
from worker_service.core.logprobs import TokenLogprobs
from worker_service.core.ngram import Drafter
from worker_service.core.sampling import Sampler, SamplingConfig
from worker_service.core.token_mask import Constraint
from worker_service.core.tokenizer import StopTextStream, Tokenizer

log = structlog.get_logger(__name__)

class FinishReason(enum.Enum):
    """Why a sequence ended normally."""

    LENGTH = "length"  # max_new_tokens reached
    EOS = "eos"  # the model emitted an end-of-sequence token
    STOP_SEQUENCE = "stop_sequence"  # the output text contained a stop sequence
    STOP_TOKEN = "stop_token"  # the model generated one of the request's stop_token_ids
    CONSTRAINT_COMPLETE = "constraint_complete"  # the constraint admits no further token


@dataclass(frozen=True)
class SequenceRequest:
    """One generation: prompt ids in, at most max_new_tokens out.

    Construction applies the rules the request alone can be held to (field
    names are the proto paths); the model-dependent ones (vocabulary, context
    window) are the engine's `check`. `sequence_id` identifies the sequence on this worker (the
    lease id); `request_id` is only a label for logs.
    """

    sequence_id: str
    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    min_new_tokens: int = 0
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()
    request_id: str = ""
    # The output constraint (structured output); None: free text.
    constraint: ConstraintSpec | None = None
    # Log-probabilities per generated token with this many alternatives (0..20);
    # None: not asked, and nothing is computed.
    top_logprobs: int | None = None
    # Generation does not end at the model's EOS tokens (it runs to max_new_tokens, a
    # stop sequence or a stop token).
    ignore_eos: bool = False
    # Token ids that end generation once generated (their text kept, as vLLM does).
    stop_token_ids: tuple[int, ...] = ()
    # The LoRA adapter this sequence runs under, by its served name; "": the base model.
    adapter: str = ""
    # Speculative decoding allowed for this request (the worker's setting decides
    # whether it runs); False: every token from its own model run.
    speculative: bool = True
    # Seconds the prompt and answer stay in the prefix cache once this sequence ends
    # (GenerateRequest.keep_prefix_s; 0: its prompt's blocks only, plain LRU).
    keep_prefix_s: float = 0.0
    # A stored response's follow-up: may match the answer blocks a kept request left
    # (GenerateRequest.continues_kept_answer); others match prefilled blocks only.
    continues_kept_answer: bool = False
    # The longest gap between tokens this stream accepts, in ms (GenerateRequest.max_itl_ms
    # as the scheduler resolved it; 0: none): a step that decodes it spends on prompt
    # chunks only what keeps the step within it (core/prefill_budget.py).
    max_itl_ms: int = 0
    # perf_counter() when the request reached this process: timings start here,
    # so ttft_ms includes claim, tokenize and queueing.
    arrived_at: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        # The request rules (ortserve.rules.request_rules), the scheduler's too, with one wording.
        request_rules.prompt_tokens(len(self.prompt_ids))
        request_rules.new_tokens(self.max_new_tokens, self.min_new_tokens)
        request_rules.stop_sequences(self.stop)
        request_rules.stop_tokens(self.stop_token_ids, self.ignore_eos, self.constraint is not None)
        self.sampling.validate()
        request_rules.constraint(self.constraint)
        if self.top_logprobs is not None:
            request_rules.top_logprobs(self.top_logprobs)

    def with_max_new_tokens(self, max_new_tokens: int) -> SequenceRequest:
        """This request with another ceiling (the lease's), without validating the rest
        again: `dataclasses.replace` would run every rule a second time."""
        request_rules.new_tokens(max_new_tokens, self.min_new_tokens)
        changed = copy.copy(self)
        object.__setattr__(changed, "max_new_tokens", max_new_tokens)  # frozen: set once, here
        return changed

    def with_max_itl_ms(self, max_itl_ms: int) -> SequenceRequest:
        """This request held to another gap goal (the lease's), validated as that alone."""
        if max_itl_ms < 0:
            raise ValueError(f"max_itl_ms must be >= 0 (0: no goal), got {max_itl_ms}")
        changed = copy.copy(self)
        object.__setattr__(changed, "max_itl_ms", max_itl_ms)  # frozen: set once, here
        return changed

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def max_tokens(self) -> int:
        """The most tokens this sequence can hold: what its KV reservation is for."""
        return len(self.prompt_ids) + self.max_new_tokens


@dataclass(frozen=True)
class TokenDelta:
    """One generated token (EOS included) and the text it completes (may be ""); with
    `logprobs` (one per token id) when the request asked for them."""

    sequence_id: str
    token_ids: tuple[int, ...]
    text: str
    logprobs: tuple[TokenLogprobs, ...] = ()


@dataclass(frozen=True)
class Completed:
    """Terminal: generation ended normally."""

    sequence_id: str
    finish_reason: FinishReason
    stop_sequence: str
    prompt_tokens: int
    generated_tokens: int  # an ending EOS token included
    max_new_tokens: int
    queue_ms: float  # arrival -> its first step
    prefill_ms: float
    ttft_ms: float  # arrival -> first generated token
    decode_ms: float
    decode_tokens_per_s: float
    total_ms: float
    seed: int | None
    text: str  # the whole output, without a stop sequence or what followed it
    token_ids: tuple[int, ...] = ()  # every generated token
    reused_prompt_tokens: int = 0  # prompt tokens a session already held (not prefilled again)
    # Constrained requests: whether the output is a whole match, and if not, why (None: no
    # constraint).
    constraint_satisfied: bool | None = None
    constraint_reason: str = ""
    cached_prompt_tokens: int = 0  # prompt tokens copied from the prefix cache (not prefilled)
    stop_token_id: int = 0  # the stop token generated, when finish_reason is STOP_TOKEN
    # Speculative decoding: tokens proposed and verified, and those the output kept.
    draft_proposed_tokens: int = 0
    draft_accepted_tokens: int = 0
    speculative_mode: str = "off"  # what ran: "ngram" or "off"
    # A reasoning model's output: tokens up to the one closing its reasoning (None: the
    # model's template writes no reasoning, so nothing was counted).
    reasoning_tokens: int | None = None


@dataclass(frozen=True)
class Cancelled:
    """Terminal: the caller cancelled."""

    sequence_id: str
    generated_tokens: int


@dataclass(frozen=True)
class Failed:
    """Terminal: this sequence failed; the engine goes on."""

    sequence_id: str
    error: EngineError


Event = TokenDelta | Completed | Cancelled | Failed
TERMINAL = (Completed, Cancelled, Failed)


class Sequence:
    """Engine-side state of one sequence: tokens, sampler, text stream, KV handle."""

    def __init__(self, req: SequenceRequest, on_event: Callable[[Event], None],
                 tokenizer: Tokenizer, vocab_size: int, eos_token_ids: tuple[int, ...]) -> None:
        self.req = req
        self.sequence_id = req.sequence_id
        self.on_event = on_event
        self.sampler = Sampler(req.sampling, vocab_size)
        # ignore_eos: the model's EOS tokens end nothing (a stop token still does).
        self.eos_token_ids = frozenset(() if req.ignore_eos else eos_token_ids)
        self.stop_token_ids = frozenset(req.stop_token_ids)
        self.stream = StopTextStream(tokenizer, req.prompt_ids, req.stop)
        # A reasoning model (its template writes the tags): its reasoning tokens counted
        # here, exactly, from each token's bytes (Finished.usage.reasoning_tokens).
        self.reasoning: ReasoningTokenCounter | None = None
        family = getattr(tokenizer, "reasoning_format", "")
        if family:
            self.reasoning = ReasoningTokenCounter(family,
                                                   tokenizer.opens_reasoning(req.prompt_ids))
            self._token_bytes = tokenizer.token_bytes
        self.token_ids = list(req.prompt_ids)  # prompt + output; the repetition penalty reads it
        self.num_computed_tokens = 0  # tokens whose K/V the cache holds
        # The runtime's objects, typed Any so the pure core imports nothing above it.
        self.kv: Any = None  # the KV pool's allocation (charged / continue_session)
        # A session turn: its session, the prompt prefix whose K/V it reuses (counted
        # as computed) and that K/V (HeldKV) until its row takes it.
        self.session_id = ""
        self.reused_tokens = 0
        self.resume: Any = None
        # The output constraint compiled for this vocabulary (the engine sets it at submit).
        self.constraint: Constraint | None = None
        self.cached_tokens = 0  # prompt tokens a prefix cache hit supplies (start_from_cache)
        self.cancel_requested = False  # set under the engine's lock, read by the engine thread
        self.cancel_error: Exception | None = None  # set with it: end Failed with this, not Cancelled
        # Speculative decoding's per-sequence state: set at submit when speculation runs
        # for this sequence (the worker's mode and the request allow it), else None.
        self.drafter: Drafter | None = None
        self.done = False
        self.t_prefill_start = self.t_first = self.t_last = 0.0
        if req.min_new_tokens > 0:
            # min_new_tokens: EOS and the stop tokens are masked until that many tokens exist.
            self.sampler.suppress(sorted(self.eos_token_ids | self.stop_token_ids))

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.req.prompt_tokens

    @property
    def num_pending_tokens(self) -> int:
        """Tokens still to run through the model before the next sample."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < self.req.prompt_tokens

    def emit(self, event: Event) -> None:
        try:
            self.on_event(event)
        except Exception:
            # A broken callback must not take the engine thread down.
            log.exception("event_callback_failed", sequence_id=self.sequence_id,
                          event=type(event).__name__)

    def charged(self, kv: Any) -> None:
        """The KV pool charged `kv` for this sequence's prompt + max_new_tokens (at submit)."""
        self.kv = kv

    def continue_session(self, session_id: str, kv: Any, reused_tokens: int,
                         resume: Any) -> None:
        """This sequence is a turn of session `session_id`, charged `kv` (at submit).

        The session already holds the K/V of the first `reused_tokens` prompt
        tokens (`resume`, None when nothing is reused): they count as computed,
        so only the rest is prefilled; `resume` stays here until a row takes it.
        """
        self.charged(kv)
        self.session_id = session_id
        self.reused_tokens = self.num_computed_tokens = reused_tokens
        self.resume = resume

    def start_from_cache(self, prefix: Any) -> None:
        """A prefix cache hit (runtime/prefix_cache.CachedPrefix, at submit): its
        `prefix.tokens` prompt tokens count as computed and are copied into the row
        when it is made, so only the rest is prefilled."""
        self.cached_tokens = self.num_computed_tokens = prefix.tokens
        self.resume = prefix

    def prefix_restored(self) -> None:
        """The reused prefix's K/V is in this sequence's row now: the copy here can go."""
        self.resume = None

    def take_unused_prefix(self) -> Any:
        """The reused prefix's K/V when no row took it yet (the turn ended first), else None."""
        resume, self.resume = self.resume, None
        return resume

    def request_cancel(self, error: Exception | None = None) -> None:
        """Ask the engine to end this sequence at its next step (under the engine's lock):
        Cancelled, or Failed with `error` when given (the worker ends it, not the caller)."""
        self.cancel_requested = True
        if error is not None and self.cancel_error is None:
            self.cancel_error = error

    def end(self) -> bool:
        """Mark the sequence ended; False when it already was, so every exit ends it once."""
        if self.done:
            return False
        self.done = True
        return True

    def computed(self, num_tokens: int) -> None:
        """The model ran `num_tokens` more of this sequence's tokens into the cache."""
        self.num_computed_tokens += num_tokens

    def mark_scheduled(self, now: float) -> None:
        """The step that runs this sequence's first tokens starts now (ends its queueing)."""
        if not self.t_prefill_start:
            self.t_prefill_start = now

    def accept(self, logits: np.ndarray, chosen: int | None = None, draft: int | None = None
               ) -> tuple[int, str, FinishReason | None, TokenLogprobs | None]:
        """Sample the next token from the last position's logits and append it.

        `chosen`: the token the sampler would pick, already picked (the engine's one
        argmax over a step's plain-greedy rows: sampling.greedy_tokens).
        `draft`: the token proposed for this position (speculative decoding): the
        sampler accepts or replaces it (Sampler.choose), the result distributed as
        without it; it was accepted exactly when the returned token equals it.
        Returns (token id, text that may go out now, finish reason or None, the
        token's log-probabilities when the request asked for them, else None).
        """
        constraint = self.constraint
        offered = {} if draft is None else {"draft": draft}
        if chosen is not None:
            token, logprobs = chosen, None
        elif constraint is None:
            token, logprobs = self.sampler.choose(logits, self.token_ids, self.req.top_logprobs,
                                                  **offered)
        else:
            token, logprobs = self.sampler.choose(logits, self.token_ids, self.req.top_logprobs,
                                                  allowed=constraint.allowed(), **offered)
        now = time.perf_counter()
        if self.num_output_tokens == 0:
            self.t_first = now
        self.t_last = now
        self.token_ids.append(token)
        generated = self.num_output_tokens
        if generated == self.req.min_new_tokens:
            self.sampler.suppress([])
        armed = generated >= self.req.min_new_tokens
        complete = False
        if constraint is not None:
            constraint.advance(token)  # EOS too: it is allowed only where the match is whole
            complete = constraint.complete
        if self.reasoning is not None and token not in self.eos_token_ids:
            self.reasoning.push(self._token_bytes(token))
        if token in self.eos_token_ids:
            # EOS counts as a generated token but adds no text.
            text = self.stream.push(None, final=True, stops_armed=armed)
            return token, text, FinishReason.EOS, logprobs
        stop_token = token in self.stop_token_ids
        final = complete or stop_token or generated >= self.req.max_new_tokens
        text = self.stream.push(token, final=final, stops_armed=armed)
        if self.stream.stop_sequence:
            return token, text, FinishReason.STOP_SEQUENCE, logprobs
        if stop_token:
            return token, text, FinishReason.STOP_TOKEN, logprobs
        if complete:
            # Nothing can follow: ending now saves the model run that could only pick EOS.
            return token, text, FinishReason.CONSTRAINT_COMPLETE, logprobs
        return token, text, FinishReason.LENGTH if final else None, logprobs

    def completed(self, finish_reason: FinishReason) -> Completed:
        end = time.perf_counter()
        generated = self.num_output_tokens
        decode_s = self.t_last - self.t_first
        arrived = self.req.arrived_at
        return Completed(
            sequence_id=self.sequence_id, finish_reason=finish_reason,
            stop_sequence=self.stream.stop_sequence, prompt_tokens=self.req.prompt_tokens,
            generated_tokens=generated, max_new_tokens=self.req.max_new_tokens,
            queue_ms=(self.t_prefill_start - arrived) * 1e3,
            prefill_ms=(self.t_first - self.t_prefill_start) * 1e3,
            ttft_ms=(self.t_first - arrived) * 1e3, decode_ms=decode_s * 1e3,
            decode_tokens_per_s=(generated - 1) / decode_s if generated > 1 and decode_s > 0 else 0.0,
            total_ms=(end - arrived) * 1e3, seed=self.sampler.seed, text=self.stream.text,
            token_ids=tuple(self.token_ids[self.req.prompt_tokens:]),
            reused_prompt_tokens=self.reused_tokens, cached_prompt_tokens=self.cached_tokens,
            stop_token_id=self.token_ids[-1] if finish_reason is FinishReason.STOP_TOKEN else 0,
            draft_proposed_tokens=self.drafter.proposed_tokens if self.drafter else 0,
            draft_accepted_tokens=self.drafter.accepted_tokens if self.drafter else 0,
            speculative_mode="ngram" if self.drafter else "off",
            reasoning_tokens=self.reasoning.tokens if self.reasoning is not None else None,
            **self._constraint_outcome(finish_reason),
        )

    def _constraint_outcome(self, finish_reason: FinishReason) -> dict[str, Any]:
        if self.constraint is None:
            return {}
        if self.constraint.satisfied:
            return {"constraint_satisfied": True}
        field = self.constraint.spec.field
        if finish_reason is FinishReason.STOP_SEQUENCE:
            why = (f"the stop sequence {self.stream.stop_sequence!r} ended the output before "
                   f"it completed {field}; drop stop sequences the constrained output may contain")
        elif finish_reason is FinishReason.STOP_TOKEN:
            why = (f"the stop token {self.token_ids[-1]} ended the output before it completed "
                   f"{field}; drop stop_token_ids the constrained output may contain")
        else:
            why = (f"the output reached max_new_tokens ({self.req.max_new_tokens:,}) before it "
                   f"completed {field}; it is a truncated prefix: raise max_new_tokens (if the "
                   "budget capped it, see budget_cap) or ask for a shorter output")
        return {"constraint_satisfied": False, "constraint_reason": why}
