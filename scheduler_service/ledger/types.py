"""The ledger's value types: what workers report, what requests ask, what admission answers.

Pure data with the checks that keep it sane; the arithmetic over it is in
placement.py and ledger.py, the sentences in sentences.py. The lowest floor of
the wing: it imports nothing from it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ortserve.rules import kv_math, prefix_hash, request_rules
from ortserve.status.errors import InvalidField
from ortserve.status.units import human_bytes, human_bytes_at_least


class Decision(enum.Enum):
    ADMITTED = "admitted"
    CAPPED = "capped"
    REJECTED = "rejected"


class NewTokensSource(enum.IntEnum):
    """Where an admission's requested max_new_tokens came from (the proto's
    MaxNewTokensSource numbers, so the servicer passes it on as it is)."""

    REQUEST = 1  # the request set max_new_tokens
    SERVER_DEFAULT = 2  # unset: the scheduler's --default-max-new-tokens for the model
    CONTEXT_WINDOW = 3  # unset, no default (or one beyond it): the remaining context window


class Cause(enum.Enum):
    """Why a request was rejected; each maps to its own gRPC status code."""

    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # INVALID_ARGUMENT
    EXCEEDS_CAPACITY = "exceeds_capacity"  # FAILED_PRECONDITION
    BUDGET_BUSY = "budget_busy"  # RESOURCE_EXHAUSTED + RetryInfo
    NO_WORKER = "no_worker"  # UNAVAILABLE
    QUEUE_FULL = "queue_full"  # RESOURCE_EXHAUSTED + RetryInfo (admission_queue)
    QUEUE_TIMEOUT = "queue_timeout"  # RESOURCE_EXHAUSTED + RetryInfo (admission_queue)
    TENANT_QUOTA = "tenant_quota"  # RESOURCE_EXHAUSTED (+ RetryInfo when its quota can hold it)
    TENANT_RATE = "tenant_rate"  # RESOURCE_EXHAUSTED + RetryInfo (its requests_per_s bucket is empty)
    # Time (time_budget.py): one more stream would pass a latency goal, and the wait for
    # streams to end would pass its TTFT goal or deadline (or its deadline fits too few tokens).
    TIME_BUSY = "time_busy"  # RESOURCE_EXHAUSTED + RetryInfo (the estimated wait)
    TIME_GOAL_UNREACHABLE = "time_goal_unreachable"  # FAILED_PRECONDITION: below one row's step


class CapLimit(enum.Enum):
    """What a cap was held to: the worker's free bytes, or the tenant's room in its quota."""

    WORKER = "worker"
    TENANT_QUOTA = "tenant_quota"
    DEADLINE = "deadline"  # the call's deadline at the predicted step time (time_budget.py)


@dataclass(frozen=True)
class WorkerGeometry:
    """What a worker reports about itself at registration."""

    worker_id: str
    address: str
    model: str
    context_length: int
    bytes_per_token: int
    capacity_bytes: int
    block_tokens: int = 1
    execution_provider: str = ""
    vocab_size: int = 0  # 0: unknown (token-id prompts then go through Tokenize)
    version: str = ""  # the worker's ortserve version, reported, not acted on
    device: str = ""  # the device it resolved ("cpu", "cuda:0"), reported
    # The most sequences it runs at once; admitted ones beyond wait there for a row.
    # 0: no limit (a layout without rows, or an older worker that does not say).
    max_batch_rows: int = 0
    # Graph nodes ORT runs off its device (allowed shape nodes), reported, not acted on.
    nodes_off_device: tuple[str, ...] = ()
    # The LoRA adapters it serves, (name, bytes held) each, sorted by name: their bytes
    # are already out of capacity_bytes. Loading or unloading one moves both at once.
    adapters: tuple[tuple[str, int], ...] = ()
    # Where each came from on the worker, (name, path) sorted by name: reported (GetBudget),
    # not acted on; an adapter a worker did not give a path for has none here.
    adapter_paths: tuple[tuple[str, str], ...] = ()
    # What the worker's decode path holds beside the KV on its device, measured there and
    # already out of capacity_bytes (reported): captured CUDA graphs, the buckets' buffers.
    decode_graph_bytes: int = 0
    decode_buffer_bytes: int = 0

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise InvalidField("worker_id", "must not be empty: start the worker with --worker-id")
        for name in ("context_length", "bytes_per_token", "block_tokens"):
            if getattr(self, name) < 1:
                raise InvalidField(name, f"must be >= 1, got {getattr(self, name)}")
        if self.capacity_bytes < self.block_bytes:
            raise InvalidField(
                "capacity_bytes",
                f"{human_bytes(self.capacity_bytes)} ({self.capacity_bytes:,} bytes) is less than "
                f"one KV block ({self.block_tokens:,} tokens = {human_bytes(self.block_bytes)}): "
                "such a worker can never serve; start it with --kv-capacity of at least "
                f"{human_bytes_at_least(self.block_bytes)} (better: one full context window)",
                capacity_bytes=self.capacity_bytes, block_bytes=self.block_bytes)

    @property
    def block_bytes(self) -> int:
        return self.block_tokens * self.bytes_per_token

    def serves_adapter(self, name: str) -> bool:
        """Whether a request naming adapter `name` ("": the base) can run here."""
        return not name or any(held == name for held, _ in self.adapters)

    def bytes_for(self, n_tokens: int) -> int:
        """Bytes a sequence of `n_tokens` holds: whole blocks, rounded up."""
        return kv_math.bytes_for(n_tokens, self.bytes_per_token, self.block_tokens)

    def tokens_within(self, n_bytes: int) -> int:
        """The most tokens whose reservation fits in `n_bytes`."""
        return kv_math.tokens_within(n_bytes, self.bytes_per_token, self.block_tokens)


@dataclass(frozen=True)
class AdmissionRequest:
    """The numbers admission needs; the servicer counts the prompt first."""

    request_id: str
    prompt_tokens: int
    max_new_tokens: int | None = None  # None: default_max_new_tokens, or the remaining window
    min_new_tokens: int = 0
    strict: bool = False  # cap policy STRICT: reject rather than cap
    # Placed only on workers serving this model (the servicer resolves the request's
    # name first: placement.resolve_model). Empty: any worker, as in a one-model pool.
    model: str = ""
    # The prompt's token ids when known: placement prefers the worker whose prefix cache
    # holds its longest prefix (docs/features/prefix-cache.md). Empty: placement by bytes alone.
    prompt_ids: tuple[int, ...] = field(default=(), repr=False)
    # Who it is charged to ("": no tenant, the pool's room only; tenants.TenantTable.resolve).
    tenant: str = ""
    # The admission queue serves lower first (vLLM's convention), then by arrival.
    priority: int = 0
    # The server's ceiling for a request that sets none (--default-max-new-tokens, resolved
    # for the model); None: such a request asks for the remaining context window.
    default_max_new_tokens: int | None = None
    # Admitted by Scheduler.Admit for its caller to stream from the worker itself (the
    # two-step path): the worker's release then reports how it ended, for the metrics.
    two_step: bool = False
    # The LoRA adapter it runs under ("": the base): placed only on a worker serving it.
    adapter: str = ""
    # A placement hint (GenerateRequest.preferred_worker_id): among whole fits, this worker
    # after a free row and before a cached prefix; "": none. Never changes the decision.
    preferred_worker: str = ""
    # Latency goals (time_budget.py): the request's own, 0 = the server's default (if any).
    max_itl_ms: int = 0
    max_ttft_ms: int = 0
    # When the call's deadline passes, on the ledger's clock (Generate's); None: none known.
    deadline_at: float | None = None
    # Requests ahead of it in its model's line in the admission queue when it arrived: its
    # wait for time is theirs first (time_budget.check).
    queued_ahead: int = 0
    # Seconds it already waited in the admission queue when tried again from it: spent of its
    # TTFT goal, which counts from its arrival (time_budget.check).
    queue_waited_s: float = 0.0
    _hashes: dict[int, list[int]] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Field names are the proto's, so the servicer can pass them on as BadRequest.
        request_rules.prompt_tokens(self.prompt_tokens)
        request_rules.new_tokens(self.max_new_tokens, self.min_new_tokens)

    def prefix_hashes(self, block_tokens: int) -> list[int]:
        """The chain hashes of the prompt's blocks a cache hit could supply (all but its
        last token), computed once per block size: a queued request is decided many times."""
        hashes = self._hashes.get(block_tokens)
        if hashes is None:
            usable = (len(self.prompt_ids) - 1) // block_tokens
            hashes = prefix_hash.chain_hashes(
                self.prompt_ids, block_tokens, min(usable, prefix_hash.SUMMARY_DEPTH_BLOCKS))
            self._hashes[block_tokens] = hashes
        return hashes

    def requested_new_tokens(self, context_length: int) -> tuple[int, NewTokensSource]:
        """The ceiling this request asks for on a worker of `context_length`, and where it
        came from: its own max_new_tokens; else the server default, within the remaining
        window and at least min_new_tokens; else the remaining window."""
        window = max(context_length - self.prompt_tokens, 0)
        if self.max_new_tokens is not None:
            return self.max_new_tokens, NewTokensSource.REQUEST
        if self.default_max_new_tokens:
            wanted = max(self.default_max_new_tokens, self.min_new_tokens)
            if wanted <= window:
                return wanted, NewTokensSource.SERVER_DEFAULT
        return window, NewTokensSource.CONTEXT_WINDOW

    @property
    def floor_new_tokens(self) -> int:
        """The fewest new tokens worth admitting: min_new_tokens, and at least one."""
        return max(self.min_new_tokens, 1)


@dataclass(frozen=True)
class NewTokensCap:
    """How and why max_new_tokens was reduced; travels with the lease (convert.py sends it
    as the BudgetCap message; the clients' BudgetCap is their view of that message)."""

    requested_max_new_tokens: int
    admitted_max_new_tokens: int
    requested_was_unset: bool
    requested_bytes: int
    admitted_bytes: int
    available_bytes: int
    capacity_bytes: int
    bytes_per_token: int
    prompt_tokens: int
    worker_id: str
    reason: str = ""  # rendered by sentences.cap_reason from the numbers above
    limit: CapLimit = CapLimit.WORKER  # TENANT_QUOTA: the tenant's room, not the worker's, bound it
    tenant: str = ""
    tenant_quota_bytes: int = 0  # TENANT_QUOTA: the tenant's quota on this model
    tenant_reserved_bytes: int = 0  # TENANT_QUOTA: what its other leases held just before
    # Where requested_max_new_tokens came from (requested_was_unset: the default or the window).
    requested_source: NewTokensSource = NewTokensSource.REQUEST
    # DEADLINE: the predicted step and the call's time left that bound it.
    predicted_step_ms: float = 0.0
    deadline_ms: float = 0.0


@dataclass(frozen=True)
class Lease:
    """Bytes of one worker's budget held for one request."""

    lease_id: str
    worker_id: str
    request_id: str
    prompt_tokens: int
    max_new_tokens: int
    reserved_bytes: int
    budget_cap: NewTokensCap | None = None
    created_at: float = 0.0
    claimed: bool = False
    claimed_at: float = 0.0
    # A session's lease: it holds the session's KV between turns, out of the worker's
    # batch rows (placement counts only the others as sequences that need a row).
    session: bool = False
    tenant: str = ""  # who it is charged to ("": no tenant)
    two_step: bool = False  # Admit's: its caller streams from the worker (AdmissionRequest)
    # A session's parked K/V outside the KV capacity, as its worker last said (ShrinkLease,
    # registration): host bytes (swapped out) and disk bytes (its file in --session-dir).
    # Never in reserved_bytes: admission and the capacity invariant do not see them.
    host_bytes: int = 0
    disk_bytes: int = 0
    max_itl_ms: int = 0  # the gap goal admission keeps it within (0: none; time_budget.py)
    # A session's lease while a turn runs on it (resized for the turn, not yet shrunk by its
    # worker at the turn's end): it decodes then, a stream like any other for time.
    turn_running: bool = False
    turn_started_at: float = 0.0  # when its running turn was granted (the ledger's clock)

    @property
    def decoding(self) -> bool:
        """Whether it holds a batch row now: a session's lease only while a turn runs."""
        return not self.session or self.turn_running

    @property
    def decoding_since(self) -> float:
        """When its generation started: its turn's grant for a session, else its admission."""
        return self.turn_started_at if self.session else self.created_at


@dataclass(frozen=True)
class TenantRoom:
    """A tenant's quota on a model and what its leases there hold, read under the ledger's lock."""

    tenant: str
    model: str
    quota_bytes: int
    reserved_bytes: int
    capacity_bytes: int  # the model's workers' capacity the quota was computed from
    share: float | None = None  # the quota as a share of that capacity; None: absolute bytes

    @property
    def room_bytes(self) -> int:
        return max(0, self.quota_bytes - self.reserved_bytes)


@dataclass(frozen=True)
class TenantUsage:
    """One tenant's standing on one model, for GetBudget and the metrics."""

    tenant: str
    model: str
    reserved_bytes: int
    leases: int
    quota_bytes: int | None  # None: no quota
    weight: float
    host_bytes: int = 0  # its sessions' parked copies in host memory (outside the quota)
    disk_bytes: int = 0  # its sessions' files in disk tiers (outside the quota)


@dataclass(frozen=True)
class Rejection:
    cause: Cause
    prompt_tokens: int
    min_new_tokens: int
    message: str = ""  # message and remedy: filled by sentences.rendered
    remedy: str = ""
    requested_max_new_tokens: int = 0
    admissible_max_new_tokens: int = 0
    context_length: int = 0
    needed_bytes: int = 0
    available_bytes: int = 0
    capacity_bytes: int = 0
    bytes_per_token: int = 0
    cap_refused: bool = False
    retry_after_s: float = 0.0
    prompt_tokens_unknown: bool = False  # text prompt, no worker to count it: prompt_tokens is 0
    largest_worker_id: str = ""  # the worker with the largest capacity
    max_fit_new_tokens: int = 0  # new tokens that fit that worker's whole capacity
    registered_workers: int = 0  # NO_WORKER: registered but none answered
    worker_error: str = ""  # NO_WORKER: the last worker error, clipped
    model: str = ""  # NO_WORKER: the model no worker serves now ("": any model)
    queue_length: int = 0  # QUEUE_*: requests waiting when it was decided
    max_queue_length: int = 0  # QUEUE_*: the queue's bound
    requests_ahead: int = 0  # QUEUE_TIMEOUT: still ahead of this one
    bytes_ahead: int = 0  # QUEUE_*: bytes the requests ahead wait for
    waited_s: float = 0.0  # QUEUE_TIMEOUT, TIME_BUSY from the queue: how long it waited
    max_queue_wait_s: float = 0.0  # QUEUE_TIMEOUT: the wait it was allowed
    tenant: str = ""  # TENANT_QUOTA: the tenant whose quota refused it
    tenant_quota_bytes: int = 0  # TENANT_QUOTA: its quota on the model
    tenant_reserved_bytes: int = 0  # TENANT_QUOTA: what its leases hold now
    tenant_quota_text: str = ""  # TENANT_QUOTA: how the quota was set ("30 % of 1.0 GiB = ...")
    tenant_requests_per_s: float = 0.0  # TENANT_RATE: the tenant's rate
    tenant_burst: int = 0  # TENANT_RATE: its bucket's size
    # TIME_*: the time budget's numbers (time_budget.TimeCheck)
    worker_id: str = ""  # the worker the numbers are of
    predicted_step_ms: float = 0.0  # the step with one more stream
    itl_goal_ms: int = 0  # the strictest gap goal it would have to keep
    ttft_goal_ms: int = 0  # the request's TTFT goal (0: none)
    fastest_step_ms: float = 0.0  # the step with one stream alone
    streams: int = 0  # streams on that worker now
    estimated_wait_s: float = 0.0  # until enough of them end
    deadline_ms: float = 0.0  # the call's time left (0: no deadline)
    time_waits: bool = False  # TIME_BUSY that the queue can cure (the wait fits its goals)
    prefill_ms: float = 0.0  # TIME_BUSY: its prompt's chunks beside the streams running now
    prefill_budget_tokens: int = 0  # TIME_BUSY: the prompt tokens a step beside them may run
    prompts_ahead_tokens: int = 0  # TIME_BUSY: prompt tokens admitted before it not yet run
    first_token_ms: float = 0.0  # TIME_BUSY: the wait, then its chunks beside those left
    # TIME_BUSY for its first token: the step with it keeps the gap goals, but the wait and
    # its prompt's chunks beside the streams pass its TTFT goal (time_budget.py).
    first_token_late: bool = False

    @property
    def waits_for_tenant_room(self) -> bool:
        """TENANT_QUOTA that the tenant's own leases ending would cure (it fits the quota)."""
        return self.cause is Cause.TENANT_QUOTA and self.needed_bytes <= self.tenant_quota_bytes

    @property
    def waits_for_time(self) -> bool:
        """TIME_BUSY whose estimated wait fits its TTFT goal and deadline: it queues."""
        return self.cause is Cause.TIME_BUSY and self.time_waits


@dataclass(frozen=True)
class Expired:
    """A lease the ledger dropped on its own, kept until someone logs it."""

    lease: Lease
    why: str  # "worker silent", "never claimed", "worker replaced"
    age_s: float


@dataclass(frozen=True)
class AdmissionDecision:
    """The ledger's answer to an AdmissionRequest: the decision, its numbers and the lease
    (convert.py sends it as the Admission message; the client's Admission is its view)."""

    decision: Decision
    request_id: str
    prompt_tokens: int
    max_new_tokens: int = 0
    reserved_bytes: int = 0
    worker: WorkerGeometry | None = None
    lease: Lease | None = None  # None when rejected or dry_run
    budget_cap: NewTokensCap | None = None
    rejection: Rejection | None = None
    dry_run: bool = False
    queue_wait_s: float = 0.0  # time spent in the admission queue before this decision
    tenant: str = ""  # who the request is charged to ("": no tenant), for the metrics
    # Where the requested ceiling came from (unset when rejected).
    max_new_tokens_source: NewTokensSource | None = None
    # Not the ledger's: what the worker that counted a chat prompt said of its reasoning,
    # passed on to the caller in the Admission (the servicer sets them).
    reasoning_format: str = ""
    prompt_opens_reasoning: bool = False
    tool_call_format: str = ""
    template_kwargs_unread: tuple[str, ...] = ()  # chat_template_kwargs the template ignored


@dataclass(frozen=True)
class BatchStats:
    """What a worker's last heartbeat said of its batch (reported, not acted on)."""

    running_sequences: int = 0
    batch_rows: int = 0
    largest_batch: int = 0


@dataclass(frozen=True)
class PrefixCacheReport:
    """What a worker's last heartbeat said of its prefix cache: the bytes it holds (inside
    its capacity, evictable: admission counts them as available) and the chain hashes of
    the blocks it holds near prompt starts (placement follows them)."""

    cached_bytes: int = 0
    hashes: frozenset[int] = frozenset()

    def cached_tokens(self, req: AdmissionRequest, block_tokens: int) -> int:
        """Prompt tokens of `req` this worker's cache would supply (0: none, or unknown)."""
        if not self.hashes or not req.prompt_ids:
            return 0
        return prefix_hash.matched_blocks(req.prefix_hashes(block_tokens), self.hashes) * block_tokens


@dataclass(frozen=True)
class WorkerSnapshot:
    geometry: WorkerGeometry
    reserved_bytes: int
    heartbeat_age_s: float
    leases: tuple[Lease, ...]
    draining: bool = False
    unreachable: bool = False  # a call failed before it answered; cleared by its heartbeat
    batch: BatchStats = field(default_factory=lambda: BatchStats())
    prefix: PrefixCacheReport = field(default_factory=lambda: PrefixCacheReport())

    @property
    def available_bytes(self) -> int:
        return self.geometry.capacity_bytes - self.reserved_bytes

    @property
    def host_bytes(self) -> int:
        """Parked session copies in host memory (a tier apart from capacity)."""
        return sum(lease.host_bytes for lease in self.leases)

    @property
    def disk_bytes(self) -> int:
        """Session files in the worker's disk tier (a tier apart from capacity)."""
        return sum(lease.disk_bytes for lease in self.leases)
