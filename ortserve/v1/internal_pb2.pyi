from ortserve.v1 import scheduler_pb2 as _scheduler_pb2
from ortserve.v1 import types_pb2 as _types_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
