"""The gateway's one gRPC -> HTTP table, fed real rich statuses, with no server."""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import duration_pb2

from gateway.reply.errors import STATUS_TABLE, from_grpc
from ortserve.status import rich_status
from ortserve.status.status_table import STATUS_OF_REASON
from ortserve.v1 import types_pb2

S = grpc.StatusCode


class FakeRpcError(grpc.RpcError):
    """What a failed call raises: the code, the message and the rich-status trailers."""

    def __init__(self, code: grpc.StatusCode, message: str, details=()) -> None:
        status = rich_status.to_grpc_status(code, message, details)
        self._code, self._message, self._trailers = code, message, status.trailing_metadata

    def code(self):
        return self._code

    def details(self):
        return self._message

    def trailing_metadata(self):
        return self._trailers


def rejection(cause, **kw):
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(kw.pop("retry_after_s", 0) * 1e9))
    return types_pb2.Rejection(cause=cause, retry_after=delay, **kw)


def test_budget_busy_is_429_with_retry_after_from_the_rejection():
    err = from_grpc(FakeRpcError(S.RESOURCE_EXHAUSTED, "the budget is held by 2 requests", [
        rich_status.error_info("BUDGET_BUSY", {"available_bytes": 10}),
        rejection(types_pb2.BUDGET_BUSY, remedy="retry in 1.5 s", retry_after_s=1.5)]), "messages")
    assert err.status == 429 and err.code == "budget_busy"
    assert err.headers() == {"Retry-After": "2", "retry-after-ms": "1500"}
    assert "retry in 1.5 s" in err.message
    assert err.ortserve["rejection"]["retry_after_s"] == 1.5


def test_a_queue_full_without_a_rejection_is_still_429_with_retry_info():
    err = from_grpc(FakeRpcError(S.RESOURCE_EXHAUSTED, "queue full", [
        rich_status.error_info("QUEUE_FULL", {}), rich_status.retry_info(0.2)]), "prompt")
    assert err.status == 429 and err.code == "queue_full"
    assert err.headers()["Retry-After"] == "1" and err.headers()["retry-after-ms"] == "200"


def test_context_length_exceeded_is_400_naming_the_prompt_with_the_numbers():
    err = from_grpc(FakeRpcError(S.INVALID_ARGUMENT, "the prompt is 9,031 tokens", [
        rich_status.error_info("CONTEXT_LENGTH_EXCEEDED",
                               {"prompt_tokens": 9031, "context_length": 8192})]), "messages")
    assert (err.status, err.code, err.param) == (400, "context_length_exceeded", "messages")
    assert err.body()["error"]["ortserve"]["metadata"]["prompt_tokens"] == "9031"
    assert err.headers() == {}


def test_exceeds_capacity_is_400_naming_the_remedy():
    err = from_grpc(FakeRpcError(S.FAILED_PRECONDITION, "needs 9 MiB of 5 MiB", [
        rich_status.error_info("EXCEEDS_CAPACITY", {}),
        rejection(types_pb2.EXCEEDS_CAPACITY, remedy="raise --kv-capacity", cap_refused=True)]),
        "prompt")
    assert (err.status, err.code) == (400, "exceeds_capacity")
    assert "--kv-capacity" in err.message and err.ortserve["rejection"]["cap_refused"] is True


def test_no_worker_is_503_and_an_invalid_field_is_400_with_its_openai_name():
    no_worker = from_grpc(FakeRpcError(S.UNAVAILABLE, "no worker", [
        rich_status.error_info("NO_WORKER", {}),
        rejection(types_pb2.NO_WORKER, retry_after_s=1.0)]), "messages")
    assert no_worker.status == 503 and no_worker.headers()["Retry-After"] == "1"
    for proto_path, param in (("sampling.top_p", "top_p"), ("max_new_tokens", "max_tokens"),
                              ("chat.messages[2].role", "messages[2].role"), ("stop[3]", "stop"),
                              ("token_ids.ids[3]", "prompt"),
                              ("chat.template_kwargs_json.reasoning_effort", "reasoning_effort"),
                              ("chat.template_kwargs_json.x", "chat_template_kwargs.x"),
                              ("chat.template_kwargs_json", "chat_template_kwargs")):
        bad = from_grpc(FakeRpcError(S.INVALID_ARGUMENT, f"{proto_path}: bad", [
            rich_status.error_info("INVALID_REQUEST", {}),
            rich_status.bad_request(proto_path, "bad")]), "messages")
        assert (bad.status, bad.param) == (400, param)
        # The message names what the caller sent, not the proto's path.
        assert bad.message == f"{param}: bad", bad.message


def test_a_refusal_renamed_for_the_responses_and_messages_apis_names_their_field():
    from gateway.apis.messages import request as anthropic_messages
    from gateway.apis.responses import request as openai_responses

    def refused(proto_path):
        return from_grpc(FakeRpcError(S.INVALID_ARGUMENT, f"{proto_path}: bad", [
            rich_status.error_info("INVALID_REQUEST", {}),
            rich_status.bad_request(proto_path, "bad")]), "messages")

    effort = openai_responses.renamed(refused("chat.template_kwargs_json.reasoning_effort"))
    assert (effort.param, effort.message) == ("reasoning.effort", "reasoning.effort: bad")
    schema = anthropic_messages.renamed(refused("chat.tools[0].parameters_json"))
    assert (schema.param, schema.message) == ("tools[0].input_schema", "tools[0].input_schema: bad")


@pytest.mark.parametrize("code,status", [
    (S.UNAUTHENTICATED, 401), (S.PERMISSION_DENIED, 403), (S.DEADLINE_EXCEEDED, 504),
    (S.INTERNAL, 500), (S.UNKNOWN, 500), (S.UNAVAILABLE, 503),
])
def test_a_status_without_details_maps_by_its_code(code, status):
    # e.g. the scheduler is not reachable at all: UNAVAILABLE with no details.
    err = from_grpc(FakeRpcError(code, "failed"), "messages")
    assert err.status == status and err.code == code.name.lower()


def test_every_table_row_is_an_http_error_status():
    assert all(400 <= status < 600 for status, _ in STATUS_TABLE.values())


@pytest.mark.parametrize("reason", sorted(STATUS_OF_REASON, key=str))
def test_every_reason_of_the_one_status_table_has_a_deliberate_http_status(reason):
    code = STATUS_OF_REASON[reason]
    error = from_grpc(FakeRpcError(code, "m", [rich_status.error_info(reason.value, {})]), "messages")
    assert (error.status == 500) == (code == S.INTERNAL), (reason, code, error.status)
    assert error.code == reason.value.lower()


def test_an_unknown_model_from_the_scheduler_is_openais_404_naming_param_model():
    info = rich_status.error_info("MODEL_NOT_FOUND", {"model": "gpt-4o",
                                                      "served_models": "a,b"})
    error = from_grpc(FakeRpcError(S.NOT_FOUND, "model 'gpt-4o' is not served here: a, b",
                                   [info]), "messages")
    assert (error.status, error.type, error.code, error.param) == (
        404, "invalid_request_error", "model_not_found", "model")
    assert error.ortserve["metadata"]["served_models"] == "a,b"
