"""Typed views of the API's messages, for callers who would rather not touch protobuf."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# The views the gateway reads too live in ortserve/; the client's names stay.
from ortserve.rpc.message_views import BudgetCap as BudgetCap
from ortserve.rpc.message_views import max_tokens_source as max_tokens_source
from ortserve.rpc.message_views import sampling_dict as sampling_dict
from ortserve.v1 import types_pb2


@dataclass(frozen=True)
class Admission:
    decision: str  # "ADMITTED" | "CAPPED" | "REJECTED"
    request_id: str
    lease_id: str
    worker_id: str
    worker_address: str
    prompt_tokens: int
    max_new_tokens: int
    reserved_bytes: int
    dry_run: bool
    budget_cap: BudgetCap | None = None
    rejection: dict | None = None  # the Rejection's fields, when REJECTED
    queue_wait_ms: float = 0.0  # time waited in the scheduler's admission queue
    # Admit's proof of holding the lease (Client.release needs it); kept out of repr and logs.
    lease_secret: str = field(default="", repr=False)
    model: str = ""  # the model that answers (the request's, resolved); empty when REJECTED
    # Where max_new_tokens came from: "request", "server_default", "context_window"; "" when
    # REJECTED (or from a scheduler that does not say).
    max_new_tokens_source: str = ""

    @classmethod
    def from_pb(cls, pb: types_pb2.Admission) -> Admission:
        from .errors import rejection_dict

        return cls(
            decision=types_pb2.Decision.Name(pb.decision), request_id=pb.request_id,
            lease_id=pb.lease_id, worker_id=pb.worker_id, worker_address=pb.worker_address,
            prompt_tokens=pb.prompt_tokens, max_new_tokens=pb.max_new_tokens,
            reserved_bytes=pb.reserved_bytes, dry_run=pb.dry_run,
            budget_cap=BudgetCap.from_pb(pb.budget_cap) if pb.HasField("budget_cap") else None,
            rejection=rejection_dict(pb.rejection) if pb.HasField("rejection") else None,
            queue_wait_ms=pb.queue_wait_ms, lease_secret=pb.lease_secret, model=pb.model,
            max_new_tokens_source=max_tokens_source(pb.max_new_tokens_source),
        )


@dataclass(frozen=True)
class Queued:
    """The request waits in the scheduler's admission queue (before its Admission)."""

    position: int  # 1: next to be served
    requests_ahead: int
    bytes_ahead: int
    needed_bytes: int
    waited_ms: float
    max_wait_ms: float
    queue_length: int

    @classmethod
    def from_pb(cls, pb: types_pb2.Queued) -> Queued:
        return cls(**{f: getattr(pb, f) for f in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    generated_tokens: int
    max_new_tokens: int
    reused_prompt_tokens: int = 0  # session turns: prompt tokens whose KV was kept
    cached_tokens: int = 0  # prompt tokens the worker's prefix cache supplied


@dataclass(frozen=True)
class Timings:
    queue_ms: float
    prefill_ms: float
    ttft_ms: float
    decode_ms: float
    decode_tokens_per_s: float
    total_ms: float


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a step (types.proto TopLogprob)."""

    token_id: int
    token: str  # its text; a piece of a multi-byte character shows U+FFFD: see token_bytes
    token_bytes: bytes  # its exact UTF-8 bytes
    logprob: float  # natural log; -inf when the sampler could not choose it

    @classmethod
    def from_pb(cls, pb: types_pb2.TopLogprob) -> TopLogprob:
        return cls(pb.token_id, pb.token, pb.token_bytes, pb.logprob)

    def to_dict(self) -> dict:
        """JSON-ready: token_bytes as a list of ints (OpenAI's `bytes`)."""
        return {**asdict(self), "token_bytes": list(self.token_bytes)}


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and the most likely alternatives (types.proto
    TokenLogprob; which logits: LogprobsOptions there)."""

    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    top_logprobs: tuple[TopLogprob, ...] = ()  # most likely first; the chosen one may be among them

    @classmethod
    def from_pb(cls, pb: types_pb2.TokenLogprob) -> TokenLogprob:
        return cls(pb.token_id, pb.token, pb.token_bytes, pb.logprob,
                   tuple(TopLogprob.from_pb(t) for t in pb.top_logprobs))

    def to_dict(self) -> dict:
        return {"token_id": self.token_id, "token": self.token,
                "token_bytes": list(self.token_bytes), "logprob": self.logprob,
                "top_logprobs": [t.to_dict() for t in self.top_logprobs]}


@dataclass(frozen=True)
class ConstraintResult:
    """How a constrained output ended against its constraint (types.proto ConstraintResult)."""

    satisfied: bool  # a complete match; False: cut short (max_new_tokens, a cap, a stop sequence)
    reason: str  # when not satisfied: what ended it and what to change; empty when satisfied

    @classmethod
    def from_pb(cls, pb: types_pb2.ConstraintResult) -> ConstraintResult:
        return cls(pb.satisfied, pb.reason)


@dataclass(frozen=True)
class TextChunk:
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] = ()  # with logprobs asked: one per token id, in order


@dataclass(frozen=True)
class GenerateResult:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str  # "LENGTH" | "EOS" | "STOP_SEQUENCE" | "CONSTRAINT_COMPLETE"
    stop_sequence: str
    budget_cap: BudgetCap | None
    usage: Usage
    timings: Timings
    admission: Admission
    worker_id: str
    execution_provider: str
    sampling: dict = field(default_factory=dict)  # as applied (seed resolved)
    queued: Queued | None = None  # the last Queued event, when the request waited
    logprobs: tuple[TokenLogprob, ...] = ()  # with logprobs asked: one per token id, in order
    constraint: ConstraintResult | None = None  # set exactly when the request had a constraint
    # Speculative decoding as it ran: {"mode", "proposed_tokens", "accepted_tokens"}.
    speculation: dict = field(default_factory=dict)

    @property
    def queue_wait_ms(self) -> float:
        return self.admission.queue_wait_ms

    @property
    def model(self) -> str:
        """The model that answered (resolved by the scheduler)."""
        return self.admission.model

    @property
    def capped(self) -> bool:
        return self.budget_cap is not None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["token_ids"] = list(self.token_ids)
        out["logprobs"] = [lp.to_dict() for lp in self.logprobs]
        out["queue_wait_ms"] = self.queue_wait_ms
        out["model"] = self.model
        return out


def usage_from_pb(pb: types_pb2.Usage) -> Usage:
    return Usage(pb.prompt_tokens, pb.generated_tokens, pb.max_new_tokens, pb.reused_prompt_tokens,
                 pb.cached_tokens)


def timings_from_pb(pb: types_pb2.Timings) -> Timings:
    return Timings(pb.queue_ms, pb.prefill_ms, pb.ttft_ms, pb.decode_ms, pb.decode_tokens_per_s,
                   pb.total_ms)
