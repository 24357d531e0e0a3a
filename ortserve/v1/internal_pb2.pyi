from ortserve.v1 import scheduler_pb2 as _scheduler_pb2
from ortserve.v1 import types_pb2 as _types_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResizeForAdapterRequest(_message.Message):
    __slots__ = ("worker_id", "adapter", "loaded")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    adapter: _types_pb2.LoraAdapter
    loaded: bool
    def __init__(self, worker_id: _Optional[str] = ..., adapter: _Optional[_Union[_types_pb2.LoraAdapter, _Mapping]] = ..., loaded: _Optional[bool] = ...) -> None: ...
