from ortserve.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkerSessionRequest(_message.Message):
    __slots__ = ("session_id", "lease_id")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    lease_id: str
    def __init__(self, session_id: _Optional[str] = ..., lease_id: _Optional[str] = ...) -> None: ...

class WorkerGenerateRequest(_message.Message):
    __slots__ = ("lease_id", "request", "prompt_token_ids", "session_id")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    request: _types_pb2.GenerateRequest
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    session_id: str
    def __init__(self, lease_id: _Optional[str] = ..., request: _Optional[_Union[_types_pb2.GenerateRequest, _Mapping]] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., session_id: _Optional[str] = ...) -> None: ...

class RelayRequest(_message.Message):
    __slots__ = ("stream_id", "start", "cancel", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    start: WorkerGenerateRequest
    cancel: bool
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, stream_id: _Optional[int] = ..., start: _Optional[_Union[WorkerGenerateRequest, _Mapping]] = ..., cancel: _Optional[bool] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RelayFrames(_message.Message):
    __slots__ = ("frames",)
    FRAMES_FIELD_NUMBER: _ClassVar[int]
    frames: _containers.RepeatedCompositeFieldContainer[RelayFrame]
    def __init__(self, frames: _Optional[_Iterable[_Union[RelayFrame, _Mapping]]] = ...) -> None: ...

class RelayFrame(_message.Message):
    __slots__ = ("stream_id", "event", "end", "status")
    STREAM_ID_FIELD_NUMBER: _ClassVar[int]
    EVENT_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    stream_id: int
    event: bytes
    end: bool
    status: bytes
    def __init__(self, stream_id: _Optional[int] = ..., event: _Optional[bytes] = ..., end: _Optional[bool] = ..., status: _Optional[bytes] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "model", "model_dir", "context_length", "bytes_per_token", "capacity_bytes", "held_bytes", "block_tokens", "requested_device", "device", "execution_provider", "num_layers", "kv_heads", "head_dim", "kv_dtype", "eos_token_ids", "vocab_size", "intra_op_threads", "active_sequences", "kv_layout", "batch_rows", "max_batch_rows", "largest_batch", "nodes_by_provider", "version", "nodes_off_device", "kv_allocated_bytes", "speculative", "held_leases", "adapters", "kv_reserved_bytes", "kv_reserved_overhead_bytes")
    class NodesByProviderEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIR_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    INTRA_OP_THREADS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    KV_LAYOUT_FIELD_NUMBER: _ClassVar[int]
    BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_ROWS_FIELD_NUMBER: _ClassVar[int]
    LARGEST_BATCH_FIELD_NUMBER: _ClassVar[int]
    NODES_BY_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_OFF_DEVICE_FIELD_NUMBER: _ClassVar[int]
    KV_ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPECULATIVE_FIELD_NUMBER: _ClassVar[int]
    HELD_LEASES_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    KV_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_RESERVED_OVERHEAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    model: str
    model_dir: str
    context_length: int
    bytes_per_token: int
    capacity_bytes: int
    held_bytes: int
    block_tokens: int
    requested_device: str
    device: str
    execution_provider: str
    num_layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str
    eos_token_ids: _containers.RepeatedScalarFieldContainer[int]
    vocab_size: int
    intra_op_threads: int
    active_sequences: int
    kv_layout: str
    batch_rows: int
    max_batch_rows: int
    largest_batch: int
    nodes_by_provider: _containers.ScalarMap[str, int]
    version: str
    nodes_off_device: _containers.RepeatedScalarFieldContainer[str]
    kv_allocated_bytes: int
    speculative: str
    held_leases: _containers.RepeatedCompositeFieldContainer[HeldLease]
    adapters: _containers.RepeatedCompositeFieldContainer[_types_pb2.LoraAdapter]
    kv_reserved_bytes: int
    kv_reserved_overhead_bytes: int
    def __init__(self, worker_id: _Optional[str] = ..., model: _Optional[str] = ..., model_dir: _Optional[str] = ..., context_length: _Optional[int] = ..., bytes_per_token: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., held_bytes: _Optional[int] = ..., block_tokens: _Optional[int] = ..., requested_device: _Optional[str] = ..., device: _Optional[str] = ..., execution_provider: _Optional[str] = ..., num_layers: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., kv_dtype: _Optional[str] = ..., eos_token_ids: _Optional[_Iterable[int]] = ..., vocab_size: _Optional[int] = ..., intra_op_threads: _Optional[int] = ..., active_sequences: _Optional[int] = ..., kv_layout: _Optional[str] = ..., batch_rows: _Optional[int] = ..., max_batch_rows: _Optional[int] = ..., largest_batch: _Optional[int] = ..., nodes_by_provider: _Optional[_Mapping[str, int]] = ..., version: _Optional[str] = ..., nodes_off_device: _Optional[_Iterable[str]] = ..., kv_allocated_bytes: _Optional[int] = ..., speculative: _Optional[str] = ..., held_leases: _Optional[_Iterable[_Union[HeldLease, _Mapping]]] = ..., adapters: _Optional[_Iterable[_Union[_types_pb2.LoraAdapter, _Mapping]]] = ..., kv_reserved_bytes: _Optional[int] = ..., kv_reserved_overhead_bytes: _Optional[int] = ...) -> None: ...

class HeldLease(_message.Message):
    __slots__ = ("lease_id", "session_id", "held_bytes")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    session_id: str
    held_bytes: int
    def __init__(self, lease_id: _Optional[str] = ..., session_id: _Optional[str] = ..., held_bytes: _Optional[int] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("request",)
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    request: _types_pb2.GenerateRequest
    def __init__(self, request: _Optional[_Union[_types_pb2.GenerateRequest, _Mapping]] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("token_ids", "context_length", "reasoning_format", "prompt_opens_reasoning", "tool_call_format", "template_kwargs_unread")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    REASONING_FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_OPENS_REASONING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_KWARGS_UNREAD_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    context_length: int
    reasoning_format: str
    prompt_opens_reasoning: bool
    tool_call_format: str
    template_kwargs_unread: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., context_length: _Optional[int] = ..., reasoning_format: _Optional[str] = ..., prompt_opens_reasoning: _Optional[bool] = ..., tool_call_format: _Optional[str] = ..., template_kwargs_unread: _Optional[_Iterable[str]] = ...) -> None: ...
