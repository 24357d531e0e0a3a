from ortserve.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenSessionRequest(_message.Message):
    __slots__ = ("request_id", "model", "adapter", "preferred_worker_id")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    model: str
    adapter: str
    preferred_worker_id: str
    def __init__(self, request_id: _Optional[str] = ..., model: _Optional[str] = ..., adapter: _Optional[str] = ..., preferred_worker_id: _Optional[str] = ...) -> None: ...

class SessionTurnRequest(_message.Message):
    __slots__ = ("session_id", "request")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    request: _types_pb2.GenerateRequest
    def __init__(self, session_id: _Optional[str] = ..., request: _Optional[_Union[_types_pb2.GenerateRequest, _Mapping]] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("freed_bytes", "closed")
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CLOSED_FIELD_NUMBER: _ClassVar[int]
    freed_bytes: int
    closed: bool
    def __init__(self, freed_bytes: _Optional[int] = ..., closed: _Optional[bool] = ...) -> None: ...

class ShrinkLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "worker_id", "held_tokens", "host_bytes", "disk_bytes", "if_request_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    IF_REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    worker_id: str
    held_tokens: int
    host_bytes: int
    disk_bytes: int
    if_request_id: str
    def __init__(self, lease_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., held_tokens: _Optional[int] = ..., host_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., if_request_id: _Optional[str] = ...) -> None: ...

class AdmitRequest(_message.Message):
    __slots__ = ("request", "dry_run", "max_queue_wait_ms", "stream_deadline_ms")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    STREAM_DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    request: _types_pb2.GenerateRequest
    dry_run: bool
    max_queue_wait_ms: int
    stream_deadline_ms: int
    def __init__(self, request: _Optional[_Union[_types_pb2.GenerateRequest, _Mapping]] = ..., dry_run: _Optional[bool] = ..., max_queue_wait_ms: _Optional[int] = ..., stream_deadline_ms: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("lease_id", "worker_id", "lease_secret", "outcome", "cause", "finished")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    worker_id: str
    lease_secret: str
    outcome: str
    cause: str
    finished: _types_pb2.Finished
    def __init__(self, lease_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., lease_secret: _Optional[str] = ..., outcome: _Optional[str] = ..., cause: _Optional[str] = ..., finished: _Optional[_Union[_types_pb2.Finished, _Mapping]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("freed_bytes", "released")
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    freed_bytes: int
    released: bool
    def __init__(self, freed_bytes: _Optional[int] = ..., released: _Optional[bool] = ...) -> None: ...

class GetBudgetRequest(_message.Message):
    __slots__ = ("include_leases",)
    INCLUDE_LEASES_FIELD_NUMBER: _ClassVar[int]
    include_leases: bool
    def __init__(self, include_leases: _Optional[bool] = ...) -> None: ...

class WorkerBudget(_message.Message):
    __slots__ = ("worker_id", "address", "model", "capacity_bytes", "reserved_bytes", "available_bytes", "bytes_per_token", "block_tokens", "context_length", "lease_count", "heartbeat_age_s", "leases", "execution_provider", "draining", "running_sequences", "batch_rows", "largest_batch", "version", "device", "cached_bytes", "cached_blocks", "nodes_off_device", "adapters", "host_bytes", "disk_bytes", "decode_graph_bytes", "decode_buffer_bytes", "unreachable", "time_measured", "streams", "step_ms", "next_step_ms", "itl_goal_ms", "steps_measured", "step_means", "prompt_token_ms", "prefill_chunk_tokens", "prompt_chunk_ms")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    LEASE_COUNT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AGE_S_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    LARGEST_BATCH_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NODES_OFF_DEVICE_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    DECODE_GRAPH_BYTES_FIELD_NUMBER: _ClassVar[int]
    DECODE_BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    UNREACHABLE_FIELD_NUMBER: _ClassVar[int]
    TIME_MEASURED_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    STEP_MS_FIELD_NUMBER: _ClassVar[int]
    NEXT_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    ITL_GOAL_MS_FIELD_NUMBER: _ClassVar[int]
    STEPS_MEASURED_FIELD_NUMBER: _ClassVar[int]
    STEP_MEANS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CHUNK_MS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    model: str
    capacity_bytes: int
    reserved_bytes: int
    available_bytes: int
    bytes_per_token: int
    block_tokens: int
    context_length: int
    lease_count: int
    heartbeat_age_s: float
    leases: _containers.RepeatedCompositeFieldContainer[_types_pb2.Lease]
    execution_provider: str
    draining: bool
    running_sequences: int
    batch_rows: int
    largest_batch: int
    version: str
    device: str
    cached_bytes: int
    cached_blocks: int
    nodes_off_device: _containers.RepeatedScalarFieldContainer[str]
    adapters: _containers.RepeatedCompositeFieldContainer[_types_pb2.LoraAdapter]
    host_bytes: int
    disk_bytes: int
    decode_graph_bytes: int
    decode_buffer_bytes: int
    unreachable: bool
    time_measured: bool
    streams: int
    step_ms: float
    next_step_ms: float
    itl_goal_ms: int
    steps_measured: int
    step_means: _containers.RepeatedCompositeFieldContainer[StepTiming]
    prompt_token_ms: float
    prefill_chunk_tokens: int
    prompt_chunk_ms: float
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., capacity_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., available_bytes: _Optional[int] = ..., bytes_per_token: _Optional[int] = ..., block_tokens: _Optional[int] = ..., context_length: _Optional[int] = ..., lease_count: _Optional[int] = ..., heartbeat_age_s: _Optional[float] = ..., leases: _Optional[_Iterable[_Union[_types_pb2.Lease, _Mapping]]] = ..., execution_provider: _Optional[str] = ..., draining: _Optional[bool] = ..., running_sequences: _Optional[int] = ..., batch_rows: _Optional[int] = ..., largest_batch: _Optional[int] = ..., version: _Optional[str] = ..., device: _Optional[str] = ..., cached_bytes: _Optional[int] = ..., cached_blocks: _Optional[int] = ..., nodes_off_device: _Optional[_Iterable[str]] = ..., adapters: _Optional[_Iterable[_Union[_types_pb2.LoraAdapter, _Mapping]]] = ..., host_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., decode_graph_bytes: _Optional[int] = ..., decode_buffer_bytes: _Optional[int] = ..., unreachable: _Optional[bool] = ..., time_measured: _Optional[bool] = ..., streams: _Optional[int] = ..., step_ms: _Optional[float] = ..., next_step_ms: _Optional[float] = ..., itl_goal_ms: _Optional[int] = ..., steps_measured: _Optional[int] = ..., step_means: _Optional[_Iterable[_Union[StepTiming, _Mapping]]] = ..., prompt_token_ms: _Optional[float] = ..., prefill_chunk_tokens: _Optional[int] = ..., prompt_chunk_ms: _Optional[float] = ...) -> None: ...

class Budget(_message.Message):
    __slots__ = ("workers", "total_capacity_bytes", "total_reserved_bytes", "total_available_bytes", "total_leases", "queue_length", "queue_oldest_wait_s", "queue_waiting_bytes", "max_queue_length", "max_queue_wait_s", "scheduler_version", "max_itl_ms", "max_ttft_ms", "models", "tenants", "tenants_source", "queue_aging_s", "total_host_bytes", "total_disk_bytes")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LEASES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_OLDEST_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAITING_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_WAIT_S_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_ITL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_FIELD_NUMBER: _ClassVar[int]
    TENANTS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    QUEUE_AGING_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerBudget]
    total_capacity_bytes: int
    total_reserved_bytes: int
    total_available_bytes: int
    total_leases: int
    queue_length: int
    queue_oldest_wait_s: float
    queue_waiting_bytes: int
    max_queue_length: int
    max_queue_wait_s: float
    scheduler_version: str
    max_itl_ms: int
    max_ttft_ms: int
    models: _containers.RepeatedCompositeFieldContainer[ModelBudget]
    tenants: _containers.RepeatedCompositeFieldContainer[TenantBudget]
    tenants_source: str
    queue_aging_s: float
    total_host_bytes: int
    total_disk_bytes: int
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerBudget, _Mapping]]] = ..., total_capacity_bytes: _Optional[int] = ..., total_reserved_bytes: _Optional[int] = ..., total_available_bytes: _Optional[int] = ..., total_leases: _Optional[int] = ..., queue_length: _Optional[int] = ..., queue_oldest_wait_s: _Optional[float] = ..., queue_waiting_bytes: _Optional[int] = ..., max_queue_length: _Optional[int] = ..., max_queue_wait_s: _Optional[float] = ..., scheduler_version: _Optional[str] = ..., max_itl_ms: _Optional[int] = ..., max_ttft_ms: _Optional[int] = ..., models: _Optional[_Iterable[_Union[ModelBudget, _Mapping]]] = ..., tenants: _Optional[_Iterable[_Union[TenantBudget, _Mapping]]] = ..., tenants_source: _Optional[str] = ..., queue_aging_s: _Optional[float] = ..., total_host_bytes: _Optional[int] = ..., total_disk_bytes: _Optional[int] = ...) -> None: ...

class TenantBudget(_message.Message):
    __slots__ = ("tenant", "model", "reserved_bytes", "quota_bytes", "weight", "leases", "queue_length", "queue_waiting_bytes", "host_bytes", "disk_bytes")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    LEASES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAITING_BYTES_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    model: str
    reserved_bytes: int
    quota_bytes: int
    weight: float
    leases: int
    queue_length: int
    queue_waiting_bytes: int
    host_bytes: int
    disk_bytes: int
    def __init__(self, tenant: _Optional[str] = ..., model: _Optional[str] = ..., reserved_bytes: _Optional[int] = ..., quota_bytes: _Optional[int] = ..., weight: _Optional[float] = ..., leases: _Optional[int] = ..., queue_length: _Optional[int] = ..., queue_waiting_bytes: _Optional[int] = ..., host_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class ModelBudget(_message.Message):
    __slots__ = ("model", "workers", "capacity_bytes", "reserved_bytes", "available_bytes", "context_length", "adapters", "queue_length", "waiting_adapters")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    WAITING_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    model: str
    workers: int
    capacity_bytes: int
    reserved_bytes: int
    available_bytes: int
    context_length: int
    adapters: _containers.RepeatedScalarFieldContainer[str]
    queue_length: int
    waiting_adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., workers: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., available_bytes: _Optional[int] = ..., context_length: _Optional[int] = ..., adapters: _Optional[_Iterable[str]] = ..., queue_length: _Optional[int] = ..., waiting_adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class RegisterWorkerRequest(_message.Message):
    __slots__ = ("worker_id", "address", "model", "context_length", "bytes_per_token", "capacity_bytes", "block_tokens", "live_leases", "execution_provider", "vocab_size", "version", "device", "live_sessions", "max_batch_rows", "nodes_off_device", "adapters", "decode_graph_bytes", "decode_buffer_bytes")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LIVE_LEASES_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    LIVE_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    NODES_OFF_DEVICE_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    DECODE_GRAPH_BYTES_FIELD_NUMBER: _ClassVar[int]
    DECODE_BUFFER_BYTES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    model: str
    context_length: int
    bytes_per_token: int
    capacity_bytes: int
    block_tokens: int
    live_leases: _containers.RepeatedCompositeFieldContainer[_types_pb2.Lease]
    execution_provider: str
    vocab_size: int
    version: str
    device: str
    live_sessions: _containers.RepeatedCompositeFieldContainer[LiveSession]
    max_batch_rows: int
    nodes_off_device: _containers.RepeatedScalarFieldContainer[str]
    adapters: _containers.RepeatedCompositeFieldContainer[_types_pb2.LoraAdapter]
    decode_graph_bytes: int
    decode_buffer_bytes: int
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., model: _Optional[str] = ..., context_length: _Optional[int] = ..., bytes_per_token: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., block_tokens: _Optional[int] = ..., live_leases: _Optional[_Iterable[_Union[_types_pb2.Lease, _Mapping]]] = ..., execution_provider: _Optional[str] = ..., vocab_size: _Optional[int] = ..., version: _Optional[str] = ..., device: _Optional[str] = ..., live_sessions: _Optional[_Iterable[_Union[LiveSession, _Mapping]]] = ..., max_batch_rows: _Optional[int] = ..., nodes_off_device: _Optional[_Iterable[str]] = ..., adapters: _Optional[_Iterable[_Union[_types_pb2.LoraAdapter, _Mapping]]] = ..., decode_graph_bytes: _Optional[int] = ..., decode_buffer_bytes: _Optional[int] = ...) -> None: ...

class LiveSession(_message.Message):
    __slots__ = ("session_id", "lease_id", "kind", "messages", "token_ids", "turns", "history_tokens", "tools")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    HISTORY_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    lease_id: str
    kind: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.ChatMessage]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    turns: int
    history_tokens: int
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.Tool]
    def __init__(self, session_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., kind: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[_types_pb2.ChatMessage, _Mapping]]] = ..., token_ids: _Optional[_Iterable[int]] = ..., turns: _Optional[int] = ..., history_tokens: _Optional[int] = ..., tools: _Optional[_Iterable[_Union[_types_pb2.Tool, _Mapping]]] = ...) -> None: ...

class RegisterWorkerResponse(_message.Message):
    __slots__ = ("heartbeat_interval_s", "lease_ttl_s", "refused_lease_ids", "dropped_session_ids")
    HEARTBEAT_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    REFUSED_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    heartbeat_interval_s: float
    lease_ttl_s: float
    refused_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    dropped_session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, heartbeat_interval_s: _Optional[float] = ..., lease_ttl_s: _Optional[float] = ..., refused_lease_ids: _Optional[_Iterable[str]] = ..., dropped_session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("worker_id", "live_lease_ids", "draining", "running_sequences", "batch_rows", "largest_batch", "cached_bytes", "cached_prefix_hashes", "step_timings", "prompt_token_ms", "prefill_chunk_tokens", "prompt_chunk_ms", "address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LIVE_LEASE_IDS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    RUNNING_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    LARGEST_BATCH_FIELD_NUMBER: _ClassVar[int]
    CACHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CACHED_PREFIX_HASHES_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMINGS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_CHUNK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CHUNK_MS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    live_lease_ids: _containers.RepeatedScalarFieldContainer[str]
    draining: bool
    running_sequences: int
    batch_rows: int
    largest_batch: int
    cached_bytes: int
    cached_prefix_hashes: _containers.RepeatedScalarFieldContainer[int]
    step_timings: _containers.RepeatedCompositeFieldContainer[StepTiming]
    prompt_token_ms: float
    prefill_chunk_tokens: int
    prompt_chunk_ms: float
    address: str
    def __init__(self, worker_id: _Optional[str] = ..., live_lease_ids: _Optional[_Iterable[str]] = ..., draining: _Optional[bool] = ..., running_sequences: _Optional[int] = ..., batch_rows: _Optional[int] = ..., largest_batch: _Optional[int] = ..., cached_bytes: _Optional[int] = ..., cached_prefix_hashes: _Optional[_Iterable[int]] = ..., step_timings: _Optional[_Iterable[_Union[StepTiming, _Mapping]]] = ..., prompt_token_ms: _Optional[float] = ..., prefill_chunk_tokens: _Optional[int] = ..., prompt_chunk_ms: _Optional[float] = ..., address: _Optional[str] = ...) -> None: ...

class StepTiming(_message.Message):
    __slots__ = ("rows", "steps", "seconds", "tail_seconds")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    TAIL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    rows: int
    steps: int
    seconds: float
    tail_seconds: float
    def __init__(self, rows: _Optional[int] = ..., steps: _Optional[int] = ..., seconds: _Optional[float] = ..., tail_seconds: _Optional[float] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...

class ClaimLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "worker_id", "prompt_tokens", "max_new_tokens")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    worker_id: str
    prompt_tokens: int
    max_new_tokens: int
    def __init__(self, lease_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ...) -> None: ...

class StoredResponse(_message.Message):
    __slots__ = ("id", "session_id", "record", "ttl_s", "max_responses")
    ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    MAX_RESPONSES_FIELD_NUMBER: _ClassVar[int]
    id: str
    session_id: str
    record: bytes
    ttl_s: float
    max_responses: int
    def __init__(self, id: _Optional[str] = ..., session_id: _Optional[str] = ..., record: _Optional[bytes] = ..., ttl_s: _Optional[float] = ..., max_responses: _Optional[int] = ...) -> None: ...

class StoredResponseRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class StoredResponseLookup(_message.Message):
    __slots__ = ("found", "response")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    found: bool
    response: StoredResponse
    def __init__(self, found: _Optional[bool] = ..., response: _Optional[_Union[StoredResponse, _Mapping]] = ...) -> None: ...

class StoredResponseChange(_message.Message):
    __slots__ = ("found", "closing_session_ids")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    CLOSING_SESSION_IDS_FIELD_NUMBER: _ClassVar[int]
    found: bool
    closing_session_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, found: _Optional[bool] = ..., closing_session_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class StoredResponseClaim(_message.Message):
    __slots__ = ("session_id",)
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    def __init__(self, session_id: _Optional[str] = ...) -> None: ...

class EndStoredTurnRequest(_message.Message):
    __slots__ = ("session_id", "kept")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    KEPT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    kept: bool
    def __init__(self, session_id: _Optional[str] = ..., kept: _Optional[bool] = ...) -> None: ...
