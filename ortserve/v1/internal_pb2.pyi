from ortserve.v1 import scheduler_pb2 as _scheduler_pb2
from ortserve.v1 import types_pb2 as _types_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DeregisterRequest(_message.Message):
    __slots__ = ("worker_id", "address")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class DeregisterResponse(_message.Message):
    __slots__ = ("known", "released_leases", "freed_bytes", "sessions_on_disk")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    RELEASED_LEASES_FIELD_NUMBER: _ClassVar[int]
    FREED_BYTES_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_ON_DISK_FIELD_NUMBER: _ClassVar[int]
    known: bool
    released_leases: int
    freed_bytes: int
    sessions_on_disk: int
    def __init__(self, known: _Optional[bool] = ..., released_leases: _Optional[int] = ..., freed_bytes: _Optional[int] = ..., sessions_on_disk: _Optional[int] = ...) -> None: ...

class ResizeForAdapterRequest(_message.Message):
    __slots__ = ("worker_id", "adapter", "loaded")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    adapter: _types_pb2.LoraAdapter
    loaded: bool
    def __init__(self, worker_id: _Optional[str] = ..., adapter: _Optional[_Union[_types_pb2.LoraAdapter, _Mapping]] = ..., loaded: _Optional[bool] = ...) -> None: ...
