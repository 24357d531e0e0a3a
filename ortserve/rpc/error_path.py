"""One error path per service: register a servicer so every method fails the same way.

Built from the service descriptor instead of the generated add_*_to_server,
because requests must reach us as raw bytes: a parse failure (invalid UTF-8
in a string field) happens before any handler runs, and grpc's own
deserializer would turn it into UNKNOWN, with no field named. Every method, unary and
server-streaming, is wrapped so that:

- a request that does not parse is INVALID_ARGUMENT naming the field;
- a raised `DomainError` is mapped through the one table
  (`ortserve.status.status_table.STATUS_OF_REASON`, the same for every service) to a
  code with rich details (ErrorInfo, BadRequest, RetryInfo, extras);
- an upstream status (`Relayed`, or an uncaught grpc.aio.AioRpcError) is
  passed through with its details;
- anything else is INTERNAL with the traceback logged, never UNKNOWN.

Handlers raise; none calls context.abort by hand.
"""

from __future__ import annotations

import traceback

import grpc
import structlog
from google.protobuf import descriptor, message_factory
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2, status_pb2

from ortserve.rpc.wire import read_varint
from ortserve.status import rich_status
from ortserve.status.errors import (
    MESSAGE_LIMIT,
    METADATA_ECHO_LIMIT,
    DomainError,
    ErrorReason,
    clip,
)
from ortserve.status.status_table import STATUS_OF_REASON

log = structlog.get_logger("error_path")

STATUS_DETAILS_KEY = "grpc-status-details-bin"
_DESCRIPTION_LIMIT = 300
_CODE_OF_VALUE = {code.value[0]: code for code in grpc.StatusCode}


class Relayed(Exception):
    """An upstream call's failure passed on to our caller with our own message.

    The upstream status details are kept (re-labelled with `message`: a
    google.rpc.Status must agree with grpc-message, or clients drop it).
    """

    def __init__(self, error: grpc.aio.AioRpcError, message: str | None = None) -> None:
        super().__init__(message or error.details() or "")
        # NOTE: an upstream UNKNOWN (a bug there) is INTERNAL here: we never answer UNKNOWN.
        self.code = error.code() if error.code() != grpc.StatusCode.UNKNOWN else grpc.StatusCode.INTERNAL
        self.message = message if message is not None else (error.details() or "")
        self.status_bin = next((v for k, v in (error.trailing_metadata() or ())
                                if k == STATUS_DETAILS_KEY), None)


# -- a worker failing mid-stream ----------------------------------------------------


def is_worker_failure(error: grpc.RpcError) -> bool:
    """Whether a worker call's failure is the worker failing (its connection lost, its
    process stopped, killed or gone) rather than its answer: every answer of an ortserve
    worker carries a status with details, so a failure without any, other than the
    caller's own deadline or cancel, is the transport's."""
    if error.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return False
    return not any(k == STATUS_DETAILS_KEY for k, _ in (error.trailing_metadata() or ()))


def not_reached(error: grpc.RpcError) -> bool:
    """Whether a worker call failed for want of a connection (UNAVAILABLE from the transport:
    refused, its port closed): before its first frame, the worker never saw the request."""
    return error.code() == grpc.StatusCode.UNAVAILABLE and is_worker_failure(error)


def reason_of(error: grpc.RpcError) -> str | None:
    """The ErrorInfo reason a failed call carries (None: none)."""
    info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
    return info.reason if info is not None else None


def worker_failed_status(message: str, worker_id: str, worker_address: str, tokens_sent: int,
                         upstream: grpc.RpcError) -> bytes:
    """The serialized status of a stream whose worker failed (UNAVAILABLE; ErrorInfo
    WORKER_FAILED with the worker, its address, the tokens already sent and the transport's
    own code), for the relayed and the direct path alike."""
    info = rich_status.error_info(ErrorReason.WORKER_FAILED.value, {
        "worker_id": clip(worker_id, METADATA_ECHO_LIMIT),
        "worker_address": clip(worker_address, METADATA_ECHO_LIMIT),
        "tokens_sent": tokens_sent, "upstream_code": upstream.code().name})
    status = rich_status.to_grpc_status(grpc.StatusCode.UNAVAILABLE, clip(message, MESSAGE_LIMIT),
                                        [info])
    return dict(status.trailing_metadata)[STATUS_DETAILS_KEY]


def worker_failure(error: grpc.RpcError, message: str, worker_id: str, worker_address: str,
                   tokens_sent: int) -> Relayed:
    """A worker's failure mid-stream passed on: UNAVAILABLE with its ErrorInfo (a killed
    worker's RST_STREAM reads INTERNAL on the wire; it is the worker failing, not a bug)."""
    relayed = Relayed(error, message)
    relayed.code = grpc.StatusCode.UNAVAILABLE
    relayed.status_bin = worker_failed_status(message, worker_id, worker_address, tokens_sent,
                                              error)
    return relayed


# -- what a failure becomes ----------------------------------------------------------


def _metadata(code: grpc.StatusCode, message: str, details: list[Message],
              status_bin: bytes | None = None) -> tuple[tuple[str, bytes], ...]:
    if status_bin is None:
        return tuple(rich_status.to_grpc_status(code, message, details).trailing_metadata)
    # A relayed status keeps its details, re-labelled with our code and message
    # (a google.rpc.Status must agree with grpc-message, or clients drop it).
    status = status_pb2.Status.FromString(status_bin)
    status.code = code.value[0]
    status.message = message
    return ((STATUS_DETAILS_KEY, status.SerializeToString()),)


def domain_status(error: DomainError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, bytes], ...]]:
    """(code, message, trailing metadata) for a domain error, through the one table.

    Public so the auth interceptor ends a refused call the same way.
    """
    code = STATUS_OF_REASON.get(error.reason)
    if code is None:
        log.error("reason missing from STATUS_OF_REASON; answering INTERNAL", reason=error.reason)
        code = grpc.StatusCode.INTERNAL
    message = clip(error.message, MESSAGE_LIMIT)
    numbers = {k: clip(v, METADATA_ECHO_LIMIT) for k, v in error.metadata.items()}
    details: list[Message] = [*error.details, rich_status.error_info(error.reason.value, numbers)]
    if error.field:
        details.append(rich_status.bad_request(clip(error.field, METADATA_ECHO_LIMIT),
                                               clip(error.message, _DESCRIPTION_LIMIT)))
    if error.retry_after_s > 0:
        details.append(rich_status.retry_info(error.retry_after_s))
    return code, message, _metadata(code, message, details)


def _status_of(error: BaseException, method: str):
    if isinstance(error, DomainError):
        return domain_status(error)
    if isinstance(error, Relayed):
        message = clip(error.message, MESSAGE_LIMIT)
        return error.code, message, _metadata(error.code, message, [], error.status_bin)
    if isinstance(error, grpc.aio.AioRpcError):
        return _status_of(Relayed(error), method)
    if isinstance(error, NotImplementedError):
        # A generated servicer's default body: the method is not served here (as gRPC
        # answers for a method the server does not know).
        message = f"{method} is not implemented by this server ({clip(error, 100)})"
        return grpc.StatusCode.UNIMPLEMENTED, message, _metadata(
            grpc.StatusCode.UNIMPLEMENTED, message, [])
    log.error("unexpected error; answering INTERNAL", method=method,
              error=f"{type(error).__name__}: {clip(error, 200)}", traceback=traceback.format_exc())
    message = (f"internal error in {method}: {type(error).__name__}: {clip(error, 200)}; this is "
               "a bug: the server logged its traceback, please report it")
    return grpc.StatusCode.INTERNAL, message, _metadata(
        grpc.StatusCode.INTERNAL, message, [rich_status.error_info(ErrorReason.INTERNAL.value, {})])


def status_bytes(error: BaseException, method: str) -> bytes:
    """A failure as a serialized google.rpc.Status: the code, message and details a call
    failing with `error` would end with (Worker.Relay ends one of its requests with it)."""
    code, message, metadata = _status_of(error, method)
    packed = next((v for k, v in metadata if k == STATUS_DETAILS_KEY), None)
    status = status_pb2.Status.FromString(packed) if packed else status_pb2.Status()
    status.code, status.message = code.value[0], message
    return status.SerializeToString()


def error_of_status(status: bytes) -> grpc.aio.AioRpcError:
    """The inverse of status_bytes: the error a call ending with that status raises, with
    the Status in its trailers (as `Relayed` and rich_status read them)."""
    parsed = status_pb2.Status.FromString(status)
    code = _CODE_OF_VALUE.get(parsed.code, grpc.StatusCode.INTERNAL)
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(),
                                grpc.aio.Metadata((STATUS_DETAILS_KEY, status)), parsed.message)


# -- parsing raw requests -------------------------------------------------------------------


def _is_repeated(field: descriptor.FieldDescriptor) -> bool:
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == descriptor.FieldDescriptor.LABEL_REPEATED


def first_bad_utf8_field(message_descriptor: descriptor.Descriptor, data: bytes,
                         prefix: str = "") -> str | None:
    """The proto path of the first string field whose bytes are not UTF-8, e.g.
    "chat.messages[2].content"; None when there is none (or the bytes are not wire format)."""
    pos, seen = 0, {}
    try:
        while pos < len(data):
            key, pos = read_varint(data, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, pos = read_varint(data, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                size, pos = read_varint(data, pos)
                chunk, pos = data[pos:pos + size], pos + size
                field = message_descriptor.fields_by_number.get(number)
                if field is None:
                    continue
                path = prefix + field.name
                if _is_repeated(field) and field.type in (field.TYPE_STRING, field.TYPE_MESSAGE):
                    seen[number] = seen.get(number, -1) + 1
                    path += f"[{seen[number]}]"
                if field.type == field.TYPE_STRING:
                    try:
                        chunk.decode("utf-8")
                    except UnicodeDecodeError:
                        return path
                elif field.type == field.TYPE_MESSAGE:
                    found = first_bad_utf8_field(field.message_type, chunk, path + ".")
                    if found:
                        return found
            else:
                return None  # groups are not used by our protos
    except IndexError:
        return None
    return None


def parse_request(request_class: type[Message], raw: bytes) -> Message:
    """Parse `raw`; raises InvalidField-like DomainError naming the field when it does not parse."""
    try:
        return request_class.FromString(raw)
    except DecodeError as error:
        name = request_class.DESCRIPTOR.full_name
        path = first_bad_utf8_field(request_class.DESCRIPTOR, raw)
        if path:
            raise DomainError(
                ErrorReason.INVALID_REQUEST,
                f"{path}: not valid UTF-8 (string fields must be UTF-8 text); send text as "
                "UTF-8, or token ids in token_ids", metadata={"field": path}, field=path) from None
        raise DomainError(
            ErrorReason.INVALID_REQUEST,
            f"the request is not a valid {name} message ({clip(error, 200)}); check that the "
            "client's protos match this server's", metadata={"message_type": name}) from None


# -- registration ---------------------------------------------------------------------


def register_service(server: grpc.aio.Server, service: descriptor.ServiceDescriptor,
                     servicer: object) -> None:
    """Serve `servicer`'s methods for `service` on `server`, every one through the error path.

    No table is passed: every service maps reasons through the one STATUS_OF_REASON.
    """
    handlers = {}
    for method in service.methods:
        request_class = message_factory.GetMessageClass(method.input_type)
        response_class = message_factory.GetMessageClass(method.output_type)
        impl = getattr(servicer, method.name)
        full = f"/{service.full_name}/{method.name}"
        if method.client_streaming and method.server_streaming:
            # The handler parses each request itself (one bad message names its field).
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                _streaming(impl, None, full), request_deserializer=None,
                response_serializer=_bytes_as_they_are(response_class.SerializeToString))
        elif method.client_streaming:
            raise NotImplementedError(f"{full}: client streaming is not supported by the error path")
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _streaming(impl, request_class, full),
                request_deserializer=None,
                response_serializer=_bytes_as_they_are(response_class.SerializeToString))
        else:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary(impl, request_class, full),
                request_deserializer=None, response_serializer=response_class.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


def _bytes_as_they_are(serialize):
    """A stream's serializer that sends an already serialized message (bytes) unchanged:
    the scheduler relays a worker's token chunks without parsing them (relay.py)."""
    def serializer(message) -> bytes:
        return message if type(message) is bytes else serialize(message)
    return serializer


def _unary(impl, request_class, full):
    async def handler(raw: bytes, context: grpc.aio.ServicerContext):
        try:
            return await impl(parse_request(request_class, raw), context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:  # noqa: BLE001 - this is the one place errors are mapped
            await context.abort(*_status_of(error, full))
    return handler


def _streaming(impl, request_class, full):
    """A server-streaming handler; with request_class None a bidirectional one, whose
    implementation reads (and parses) the request stream itself."""
    async def handler(received, context: grpc.aio.ServicerContext):
        try:
            request = received if request_class is None else parse_request(request_class, received)
            async for item in impl(request, context):
                yield item
        except grpc.aio.AbortError:
            raise
        except Exception as error:  # noqa: BLE001 - this is the one place errors are mapped
            await context.abort(*_status_of(error, full))
    return handler


def bad_request_of(error: grpc.RpcError) -> error_details_pb2.BadRequest | None:
    """The BadRequest detail of a failed call, for tests and clients."""
    return rich_status.unpack(rich_status.details_of(error), error_details_pb2.BadRequest)


# A cancel this close to the caller's deadline is the deadline (grpc cancels the
# handler when it passes; time_remaining() then reads about 0).
DEADLINE_SLACK_S = 0.1


def at_deadline(time_remaining_s: float | None) -> bool:
    """Whether a call cancelled with `time_remaining_s` left ended at its deadline (a call
    without one never does): the scheduler's outcome count and the worker's release."""
    return time_remaining_s is not None and time_remaining_s <= DEADLINE_SLACK_S
