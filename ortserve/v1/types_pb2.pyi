import datetime

from google.protobuf import duration_pb2 as _duration_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CapPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAP_POLICY_UNSPECIFIED: _ClassVar[CapPolicy]
    CAP_POLICY_ALLOW: _ClassVar[CapPolicy]
    CAP_POLICY_STRICT: _ClassVar[CapPolicy]
    CAP_POLICY_WAIT_FULL: _ClassVar[CapPolicy]

class Decision(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DECISION_UNSPECIFIED: _ClassVar[Decision]
    ADMITTED: _ClassVar[Decision]
    CAPPED: _ClassVar[Decision]
    REJECTED: _ClassVar[Decision]

class CapLimit(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAP_LIMIT_UNSPECIFIED: _ClassVar[CapLimit]
    CAP_LIMIT_WORKER: _ClassVar[CapLimit]
    CAP_LIMIT_TENANT_QUOTA: _ClassVar[CapLimit]
    CAP_LIMIT_DEADLINE: _ClassVar[CapLimit]

class MaxNewTokensSource(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MAX_NEW_TOKENS_SOURCE_UNSPECIFIED: _ClassVar[MaxNewTokensSource]
    MAX_NEW_TOKENS_FROM_REQUEST: _ClassVar[MaxNewTokensSource]
    MAX_NEW_TOKENS_FROM_SERVER_DEFAULT: _ClassVar[MaxNewTokensSource]
    MAX_NEW_TOKENS_FROM_CONTEXT_WINDOW: _ClassVar[MaxNewTokensSource]

class RejectionCause(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REJECTION_CAUSE_UNSPECIFIED: _ClassVar[RejectionCause]
    CONTEXT_LENGTH_EXCEEDED: _ClassVar[RejectionCause]
    EXCEEDS_CAPACITY: _ClassVar[RejectionCause]
    BUDGET_BUSY: _ClassVar[RejectionCause]
    NO_WORKER: _ClassVar[RejectionCause]
    QUEUE_FULL: _ClassVar[RejectionCause]
    QUEUE_TIMEOUT: _ClassVar[RejectionCause]
    TENANT_QUOTA: _ClassVar[RejectionCause]
    TENANT_RATE: _ClassVar[RejectionCause]
    TIME_BUSY: _ClassVar[RejectionCause]
    TIME_GOAL_UNREACHABLE: _ClassVar[RejectionCause]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    LENGTH: _ClassVar[FinishReason]
    EOS: _ClassVar[FinishReason]
    STOP_SEQUENCE: _ClassVar[FinishReason]
    CONSTRAINT_COMPLETE: _ClassVar[FinishReason]
    STOP_TOKEN: _ClassVar[FinishReason]

class SessionKVState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SESSION_KV_STATE_UNSPECIFIED: _ClassVar[SessionKVState]
    SESSION_EMPTY: _ClassVar[SessionKVState]
    SESSION_BUSY: _ClassVar[SessionKVState]
    SESSION_RESIDENT: _ClassVar[SessionKVState]
    SESSION_SWAPPED: _ClassVar[SessionKVState]
    SESSION_ON_DISK: _ClassVar[SessionKVState]
CAP_POLICY_UNSPECIFIED: CapPolicy
CAP_POLICY_ALLOW: CapPolicy
CAP_POLICY_STRICT: CapPolicy
CAP_POLICY_WAIT_FULL: CapPolicy
DECISION_UNSPECIFIED: Decision
ADMITTED: Decision
CAPPED: Decision
REJECTED: Decision
CAP_LIMIT_UNSPECIFIED: CapLimit
CAP_LIMIT_WORKER: CapLimit
CAP_LIMIT_TENANT_QUOTA: CapLimit
CAP_LIMIT_DEADLINE: CapLimit
MAX_NEW_TOKENS_SOURCE_UNSPECIFIED: MaxNewTokensSource
MAX_NEW_TOKENS_FROM_REQUEST: MaxNewTokensSource
MAX_NEW_TOKENS_FROM_SERVER_DEFAULT: MaxNewTokensSource
MAX_NEW_TOKENS_FROM_CONTEXT_WINDOW: MaxNewTokensSource
REJECTION_CAUSE_UNSPECIFIED: RejectionCause
CONTEXT_LENGTH_EXCEEDED: RejectionCause
EXCEEDS_CAPACITY: RejectionCause
BUDGET_BUSY: RejectionCause
NO_WORKER: RejectionCause
QUEUE_FULL: RejectionCause
QUEUE_TIMEOUT: RejectionCause
TENANT_QUOTA: RejectionCause
TENANT_RATE: RejectionCause
TIME_BUSY: RejectionCause
TIME_GOAL_UNREACHABLE: RejectionCause
FINISH_REASON_UNSPECIFIED: FinishReason
LENGTH: FinishReason
EOS: FinishReason
STOP_SEQUENCE: FinishReason
CONSTRAINT_COMPLETE: FinishReason
STOP_TOKEN: FinishReason
SESSION_KV_STATE_UNSPECIFIED: SessionKVState
SESSION_EMPTY: SessionKVState
SESSION_BUSY: SessionKVState
SESSION_RESIDENT: SessionKVState
SESSION_SWAPPED: SessionKVState
SESSION_ON_DISK: SessionKVState

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "tool_call_id")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    tool_call_id: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages", "tools", "template_kwargs_json", "template_kwargs_required")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_KWARGS_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    template_kwargs_json: str
    template_kwargs_required: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ..., template_kwargs_json: _Optional[str] = ..., template_kwargs_required: _Optional[_Iterable[str]] = ...) -> None: ...

class Tool(_message.Message):
    __slots__ = ("name", "description", "parameters_json")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_JSON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters_json: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters_json: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments_json: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "repetition_penalty", "presence_penalty", "frequency_penalty", "logit_bias", "min_p")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    logit_bias: _containers.ScalarMap[int, float]
    min_p: float
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., min_p: _Optional[float] = ...) -> None: ...

class LogprobsOptions(_message.Message):
    __slots__ = ("top_logprobs",)
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    top_logprobs: int
    def __init__(self, top_logprobs: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "chat", "max_new_tokens", "min_new_tokens", "sampling", "stop", "cap_policy", "max_queue_wait_ms", "model", "constraint", "logprobs", "stream_interval_ms", "priority", "ignore_eos", "stop_token_ids", "adapter", "disable_speculation", "preferred_worker_id", "keep_prefix_s", "continues_kept_answer", "max_itl_ms", "max_ttft_ms")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    CAP_POLICY_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    DISABLE_SPECULATION_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    KEEP_PREFIX_S_FIELD_NUMBER: _ClassVar[int]
    CONTINUES_KEPT_ANSWER_FIELD_NUMBER: _ClassVar[int]
    MAX_ITL_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: TokenIds
    chat: ChatMessages
    max_new_tokens: int
    min_new_tokens: int
    sampling: SamplingParams
    stop: _containers.RepeatedScalarFieldContainer[str]
    cap_policy: CapPolicy
    max_queue_wait_ms: int
    model: str
    constraint: Constraint
    logprobs: LogprobsOptions
    stream_interval_ms: int
    priority: int
    ignore_eos: bool
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    adapter: str
    disable_speculation: bool
    preferred_worker_id: str
    keep_prefix_s: float
    continues_kept_answer: bool
    max_itl_ms: int
    max_ttft_ms: int
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., max_new_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., stop: _Optional[_Iterable[str]] = ..., cap_policy: _Optional[_Union[CapPolicy, str]] = ..., max_queue_wait_ms: _Optional[int] = ..., model: _Optional[str] = ..., constraint: _Optional[_Union[Constraint, _Mapping]] = ..., logprobs: _Optional[_Union[LogprobsOptions, _Mapping]] = ..., stream_interval_ms: _Optional[int] = ..., priority: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., adapter: _Optional[str] = ..., disable_speculation: _Optional[bool] = ..., preferred_worker_id: _Optional[str] = ..., keep_prefix_s: _Optional[float] = ..., continues_kept_answer: _Optional[bool] = ..., max_itl_ms: _Optional[int] = ..., max_ttft_ms: _Optional[int] = ...) -> None: ...

class Constraint(_message.Message):
    __slots__ = ("json_schema", "json_object", "regex", "grammar", "tool_call")
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FIELD_NUMBER: _ClassVar[int]
    json_schema: str
    json_object: bool
    regex: str
    grammar: str
    tool_call: ToolCallConstraint
    def __init__(self, json_schema: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., grammar: _Optional[str] = ..., tool_call: _Optional[_Union[ToolCallConstraint, _Mapping]] = ...) -> None: ...

class ToolCallConstraint(_message.Message):
    __slots__ = ("function_name", "parallel", "allow_text", "answer_json_schema")
    FUNCTION_NAME_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    ALLOW_TEXT_FIELD_NUMBER: _ClassVar[int]
    ANSWER_JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    function_name: str
    parallel: bool
    allow_text: bool
    answer_json_schema: str
    def __init__(self, function_name: _Optional[str] = ..., parallel: _Optional[bool] = ..., allow_text: _Optional[bool] = ..., answer_json_schema: _Optional[str] = ...) -> None: ...

class ConstraintResult(_message.Message):
    __slots__ = ("satisfied", "reason")
    SATISFIED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    satisfied: bool
    reason: str
    def __init__(self, satisfied: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class BudgetCap(_message.Message):
    __slots__ = ("requested_max_new_tokens", "admitted_max_new_tokens", "requested_was_unset", "requested_bytes", "admitted_bytes", "available_bytes", "capacity_bytes", "bytes_per_token", "prompt_tokens", "worker_id", "reason", "limit", "tenant", "tenant_quota_bytes", "tenant_reserved_bytes", "requested_source", "predicted_step_ms", "deadline_ms")
    REQUESTED_MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_WAS_UNSET_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADMITTED_BYTES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TENANT_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENANT_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_SOURCE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
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
    reason: str
    limit: CapLimit
    tenant: str
    tenant_quota_bytes: int
    tenant_reserved_bytes: int
    requested_source: MaxNewTokensSource
    predicted_step_ms: float
    deadline_ms: float
    def __init__(self, requested_max_new_tokens: _Optional[int] = ..., admitted_max_new_tokens: _Optional[int] = ..., requested_was_unset: _Optional[bool] = ..., requested_bytes: _Optional[int] = ..., admitted_bytes: _Optional[int] = ..., available_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., bytes_per_token: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., worker_id: _Optional[str] = ..., reason: _Optional[str] = ..., limit: _Optional[_Union[CapLimit, str]] = ..., tenant: _Optional[str] = ..., tenant_quota_bytes: _Optional[int] = ..., tenant_reserved_bytes: _Optional[int] = ..., requested_source: _Optional[_Union[MaxNewTokensSource, str]] = ..., predicted_step_ms: _Optional[float] = ..., deadline_ms: _Optional[float] = ...) -> None: ...

class Rejection(_message.Message):
    __slots__ = ("cause", "message", "remedy", "cap_refused", "prompt_tokens", "min_new_tokens", "requested_max_new_tokens", "admissible_max_new_tokens", "context_length", "needed_bytes", "available_bytes", "capacity_bytes", "bytes_per_token", "retry_after", "prompt_tokens_unknown", "queue_length", "max_queue_length", "requests_ahead", "bytes_ahead", "waited_ms", "max_queue_wait_ms", "tenant", "tenant_quota_bytes", "tenant_reserved_bytes", "tenant_requests_per_s", "tenant_burst", "worker_id", "predicted_step_ms", "itl_goal_ms", "ttft_goal_ms", "fastest_step_ms", "streams", "estimated_wait_ms", "deadline_ms", "prefill_ms", "prefill_budget_tokens", "first_token_ms")
    CAUSE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REMEDY_FIELD_NUMBER: _ClassVar[int]
    CAP_REFUSED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ADMISSIBLE_MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    NEEDED_BYTES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    BYTES_AHEAD_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TENANT_QUOTA_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENANT_RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TENANT_REQUESTS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TENANT_BURST_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    ITL_GOAL_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_GOAL_MS_FIELD_NUMBER: _ClassVar[int]
    FASTEST_STEP_MS_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATED_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_BUDGET_TOKENS_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_MS_FIELD_NUMBER: _ClassVar[int]
    cause: RejectionCause
    message: str
    remedy: str
    cap_refused: bool
    prompt_tokens: int
    min_new_tokens: int
    requested_max_new_tokens: int
    admissible_max_new_tokens: int
    context_length: int
    needed_bytes: int
    available_bytes: int
    capacity_bytes: int
    bytes_per_token: int
    retry_after: _duration_pb2.Duration
    prompt_tokens_unknown: bool
    queue_length: int
    max_queue_length: int
    requests_ahead: int
    bytes_ahead: int
    waited_ms: float
    max_queue_wait_ms: float
    tenant: str
    tenant_quota_bytes: int
    tenant_reserved_bytes: int
    tenant_requests_per_s: float
    tenant_burst: int
    worker_id: str
    predicted_step_ms: float
    itl_goal_ms: int
    ttft_goal_ms: int
    fastest_step_ms: float
    streams: int
    estimated_wait_ms: float
    deadline_ms: float
    prefill_ms: float
    prefill_budget_tokens: int
    first_token_ms: float
    def __init__(self, cause: _Optional[_Union[RejectionCause, str]] = ..., message: _Optional[str] = ..., remedy: _Optional[str] = ..., cap_refused: _Optional[bool] = ..., prompt_tokens: _Optional[int] = ..., min_new_tokens: _Optional[int] = ..., requested_max_new_tokens: _Optional[int] = ..., admissible_max_new_tokens: _Optional[int] = ..., context_length: _Optional[int] = ..., needed_bytes: _Optional[int] = ..., available_bytes: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., bytes_per_token: _Optional[int] = ..., retry_after: _Optional[_Union[datetime.timedelta, _duration_pb2.Duration, _Mapping]] = ..., prompt_tokens_unknown: _Optional[bool] = ..., queue_length: _Optional[int] = ..., max_queue_length: _Optional[int] = ..., requests_ahead: _Optional[int] = ..., bytes_ahead: _Optional[int] = ..., waited_ms: _Optional[float] = ..., max_queue_wait_ms: _Optional[float] = ..., tenant: _Optional[str] = ..., tenant_quota_bytes: _Optional[int] = ..., tenant_reserved_bytes: _Optional[int] = ..., tenant_requests_per_s: _Optional[float] = ..., tenant_burst: _Optional[int] = ..., worker_id: _Optional[str] = ..., predicted_step_ms: _Optional[float] = ..., itl_goal_ms: _Optional[int] = ..., ttft_goal_ms: _Optional[int] = ..., fastest_step_ms: _Optional[float] = ..., streams: _Optional[int] = ..., estimated_wait_ms: _Optional[float] = ..., deadline_ms: _Optional[float] = ..., prefill_ms: _Optional[float] = ..., prefill_budget_tokens: _Optional[int] = ..., first_token_ms: _Optional[float] = ...) -> None: ...

class Admission(_message.Message):
    __slots__ = ("decision", "request_id", "lease_id", "worker_id", "worker_address", "prompt_tokens", "max_new_tokens", "reserved_bytes", "budget_cap", "rejection", "dry_run", "queue_wait_ms", "lease_secret", "model", "reasoning_format", "prompt_opens_reasoning", "tool_call_format", "max_new_tokens_source", "template_kwargs_unread")
    DECISION_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CAP_FIELD_NUMBER: _ClassVar[int]
    REJECTION_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    QUEUE_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECRET_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REASONING_FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_OPENS_REASONING_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_SOURCE_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_KWARGS_UNREAD_FIELD_NUMBER: _ClassVar[int]
    decision: Decision
    request_id: str
    lease_id: str
    worker_id: str
    worker_address: str
    prompt_tokens: int
    max_new_tokens: int
    reserved_bytes: int
    budget_cap: BudgetCap
    rejection: Rejection
    dry_run: bool
    queue_wait_ms: float
    lease_secret: str
    model: str
    reasoning_format: str
    prompt_opens_reasoning: bool
    tool_call_format: str
    max_new_tokens_source: MaxNewTokensSource
    template_kwargs_unread: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, decision: _Optional[_Union[Decision, str]] = ..., request_id: _Optional[str] = ..., lease_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., worker_address: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., budget_cap: _Optional[_Union[BudgetCap, _Mapping]] = ..., rejection: _Optional[_Union[Rejection, _Mapping]] = ..., dry_run: _Optional[bool] = ..., queue_wait_ms: _Optional[float] = ..., lease_secret: _Optional[str] = ..., model: _Optional[str] = ..., reasoning_format: _Optional[str] = ..., prompt_opens_reasoning: _Optional[bool] = ..., tool_call_format: _Optional[str] = ..., max_new_tokens_source: _Optional[_Union[MaxNewTokensSource, str]] = ..., template_kwargs_unread: _Optional[_Iterable[str]] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "worker_id", "request_id", "prompt_tokens", "max_new_tokens", "reserved_bytes", "budget_cap", "claimed", "age_s", "tenant", "two_step", "host_bytes", "disk_bytes", "max_itl_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CAP_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TWO_STEP_FIELD_NUMBER: _ClassVar[int]
    HOST_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_ITL_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    worker_id: str
    request_id: str
    prompt_tokens: int
    max_new_tokens: int
    reserved_bytes: int
    budget_cap: BudgetCap
    claimed: bool
    age_s: float
    tenant: str
    two_step: bool
    host_bytes: int
    disk_bytes: int
    max_itl_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., request_id: _Optional[str] = ..., prompt_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., reserved_bytes: _Optional[int] = ..., budget_cap: _Optional[_Union[BudgetCap, _Mapping]] = ..., claimed: _Optional[bool] = ..., age_s: _Optional[float] = ..., tenant: _Optional[str] = ..., two_step: _Optional[bool] = ..., host_bytes: _Optional[int] = ..., disk_bytes: _Optional[int] = ..., max_itl_ms: _Optional[int] = ...) -> None: ...

class TokenChunk(_message.Message):
    __slots__ = ("token_ids", "text", "logprobs")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "token_bytes", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., token_bytes: _Optional[bytes] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "token_bytes", "logprob", "top_logprobs")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    top_logprobs: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., token_bytes: _Optional[bytes] = ..., logprob: _Optional[float] = ..., top_logprobs: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "generated_tokens", "max_new_tokens", "reused_prompt_tokens", "cached_tokens", "reasoning_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    GENERATED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REUSED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    generated_tokens: int
    max_new_tokens: int
    reused_prompt_tokens: int
    cached_tokens: int
    reasoning_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., generated_tokens: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., reused_prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class Timings(_message.Message):
    __slots__ = ("queue_ms", "prefill_ms", "ttft_ms", "decode_ms", "decode_tokens_per_s", "total_ms")
    QUEUE_MS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_MS_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_MS_FIELD_NUMBER: _ClassVar[int]
    DECODE_TOKENS_PER_S_FIELD_NUMBER: _ClassVar[int]
    TOTAL_MS_FIELD_NUMBER: _ClassVar[int]
    queue_ms: float
    prefill_ms: float
    ttft_ms: float
    decode_ms: float
    decode_tokens_per_s: float
    total_ms: float
    def __init__(self, queue_ms: _Optional[float] = ..., prefill_ms: _Optional[float] = ..., ttft_ms: _Optional[float] = ..., decode_ms: _Optional[float] = ..., decode_tokens_per_s: _Optional[float] = ..., total_ms: _Optional[float] = ...) -> None: ...

class Finished(_message.Message):
    __slots__ = ("finish_reason", "stop_sequence", "usage", "timings", "budget_cap", "sampling", "worker_id", "execution_provider", "session", "constraint", "stop_token_id", "speculation")
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    TIMINGS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CAP_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    EXECUTION_PROVIDER_FIELD_NUMBER: _ClassVar[int]
    SESSION_FIELD_NUMBER: _ClassVar[int]
    CONSTRAINT_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    SPECULATION_FIELD_NUMBER: _ClassVar[int]
    finish_reason: FinishReason
    stop_sequence: str
    usage: Usage
    timings: Timings
    budget_cap: BudgetCap
    sampling: SamplingParams
    worker_id: str
    execution_provider: str
    session: SessionInfo
    constraint: ConstraintResult
    stop_token_id: int
    speculation: Speculation
    def __init__(self, finish_reason: _Optional[_Union[FinishReason, str]] = ..., stop_sequence: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., timings: _Optional[_Union[Timings, _Mapping]] = ..., budget_cap: _Optional[_Union[BudgetCap, _Mapping]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., worker_id: _Optional[str] = ..., execution_provider: _Optional[str] = ..., session: _Optional[_Union[SessionInfo, _Mapping]] = ..., constraint: _Optional[_Union[ConstraintResult, _Mapping]] = ..., stop_token_id: _Optional[int] = ..., speculation: _Optional[_Union[Speculation, _Mapping]] = ...) -> None: ...

class Speculation(_message.Message):
    __slots__ = ("mode", "proposed_tokens", "accepted_tokens")
    MODE_FIELD_NUMBER: _ClassVar[int]
    PROPOSED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    mode: str
    proposed_tokens: int
    accepted_tokens: int
    def __init__(self, mode: _Optional[str] = ..., proposed_tokens: _Optional[int] = ..., accepted_tokens: _Optional[int] = ...) -> None: ...

class Queued(_message.Message):
    __slots__ = ("position", "requests_ahead", "bytes_ahead", "needed_bytes", "waited_ms", "max_wait_ms", "queue_length")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_AHEAD_FIELD_NUMBER: _ClassVar[int]
    BYTES_AHEAD_FIELD_NUMBER: _ClassVar[int]
    NEEDED_BYTES_FIELD_NUMBER: _ClassVar[int]
    WAITED_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    QUEUE_LENGTH_FIELD_NUMBER: _ClassVar[int]
    position: int
    requests_ahead: int
    bytes_ahead: int
    needed_bytes: int
    waited_ms: float
    max_wait_ms: float
    queue_length: int
    def __init__(self, position: _Optional[int] = ..., requests_ahead: _Optional[int] = ..., bytes_ahead: _Optional[int] = ..., needed_bytes: _Optional[int] = ..., waited_ms: _Optional[float] = ..., max_wait_ms: _Optional[float] = ..., queue_length: _Optional[int] = ...) -> None: ...

class GenerateEvent(_message.Message):
    __slots__ = ("admission", "chunk", "finished", "queued")
    ADMISSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    admission: Admission
    chunk: TokenChunk
    finished: Finished
    queued: Queued
    def __init__(self, admission: _Optional[_Union[Admission, _Mapping]] = ..., chunk: _Optional[_Union[TokenChunk, _Mapping]] = ..., finished: _Optional[_Union[Finished, _Mapping]] = ..., queued: _Optional[_Union[Queued, _Mapping]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ("session_id", "worker_id", "worker_address", "state", "held_tokens", "held_bytes", "swapped_bytes", "turns", "last_budget_cap", "lease_id", "reserved_bytes", "turn_in_flight", "idle_s", "model", "disk_bytes")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HELD_TOKENS_FIELD_NUMBER: _ClassVar[int]
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    SWAPPED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    LAST_BUDGET_CAP_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    RESERVED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TURN_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    IDLE_S_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    worker_id: str
    worker_address: str
    state: SessionKVState
    held_tokens: int
    held_bytes: int
    swapped_bytes: int
    turns: int
    last_budget_cap: BudgetCap
    lease_id: str
    reserved_bytes: int
    turn_in_flight: bool
    idle_s: float
    model: str
    disk_bytes: int
    def __init__(self, session_id: _Optional[str] = ..., worker_id: _Optional[str] = ..., worker_address: _Optional[str] = ..., state: _Optional[_Union[SessionKVState, str]] = ..., held_tokens: _Optional[int] = ..., held_bytes: _Optional[int] = ..., swapped_bytes: _Optional[int] = ..., turns: _Optional[int] = ..., last_budget_cap: _Optional[_Union[BudgetCap, _Mapping]] = ..., lease_id: _Optional[str] = ..., reserved_bytes: _Optional[int] = ..., turn_in_flight: _Optional[bool] = ..., idle_s: _Optional[float] = ..., model: _Optional[str] = ..., disk_bytes: _Optional[int] = ...) -> None: ...

class PromptTokens(_message.Message):
    __slots__ = ("token_ids", "context_length", "model")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    context_length: int
    model: str
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., context_length: _Optional[int] = ..., model: _Optional[str] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("model", "token_ids")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    model: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("text", "model")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    text: str
    model: str
    def __init__(self, text: _Optional[str] = ..., model: _Optional[str] = ...) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("name", "held_bytes", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HELD_BYTES_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    held_bytes: int
    path: str
    def __init__(self, name: _Optional[str] = ..., held_bytes: _Optional[int] = ..., path: _Optional[str] = ...) -> None: ...

class LoadAdapterRequest(_message.Message):
    __slots__ = ("worker_id", "name", "path")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    name: str
    path: str
    def __init__(self, worker_id: _Optional[str] = ..., name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class UnloadAdapterRequest(_message.Message):
    __slots__ = ("worker_id", "name")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    name: str
    def __init__(self, worker_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class AdapterChange(_message.Message):
    __slots__ = ("worker_id", "adapter", "capacity_bytes", "adapters")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    adapter: LoraAdapter
    capacity_bytes: int
    adapters: _containers.RepeatedCompositeFieldContainer[LoraAdapter]
    def __init__(self, worker_id: _Optional[str] = ..., adapter: _Optional[_Union[LoraAdapter, _Mapping]] = ..., capacity_bytes: _Optional[int] = ..., adapters: _Optional[_Iterable[_Union[LoraAdapter, _Mapping]]] = ...) -> None: ...
