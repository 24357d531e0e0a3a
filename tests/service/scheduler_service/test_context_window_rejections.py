"""Context-window refusals are the ledger's REJECTED like any other.

Through a real scheduler channel with the stand-in worker, whose Tokenize refuses a
prompt beyond the window as the real worker's does (CONTEXT_LENGTH_EXCEEDED with
only ErrorInfo and BadRequest): the scheduler still answers with the Rejection.
"""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.service.fake_cluster import CTX, Cluster


@pytest.fixture()
def cluster():
    c = Cluster()
    c.register()
    yield c
    c.close()


def text(n_words: int, **kw) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(text=" ".join(["w"] * n_words), **kw)


def generate_error(cluster, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        list(cluster.stub.Generate(request, timeout=5))
    return err.value


@pytest.mark.parametrize("request_kw", [
    dict(n_words=10, max_new_tokens=CTX),  # the ceiling overflows
    dict(n_words=CTX),  # the prompt fills the window
])
def test_a_text_prompt_beyond_the_window_ends_generate_with_the_rejection(cluster, request_kw):
    n_words = request_kw.pop("n_words")
    error = generate_error(cluster, text(n_words, **request_kw))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = rich_status.details_of(error)
    rejection = rich_status.unpack(details, types_pb2.Rejection)
    assert rejection is not None and rejection.cause == types_pb2.CONTEXT_LENGTH_EXCEEDED
    assert (rejection.prompt_tokens, rejection.context_length) == (n_words, CTX)
    assert rejection.message in error.details() and rejection.remedy in error.details()
    info = rich_status.unpack(details, error_details_pb2.ErrorInfo)
    assert info.reason == "CONTEXT_LENGTH_EXCEEDED"
    assert cluster.reserved_bytes() == 0


def test_admit_answers_a_text_prompt_beyond_the_window_as_rejected(cluster):
    adm = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=text(10, max_new_tokens=CTX)),
                             timeout=5)
    assert adm.decision == types_pb2.REJECTED and not adm.lease_id
    assert adm.rejection.cause == types_pb2.CONTEXT_LENGTH_EXCEEDED
    assert adm.rejection.requested_max_new_tokens == CTX
    assert f"lower max_new_tokens to {CTX - 10:,}" in adm.rejection.remedy
    dry = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=text(10, max_new_tokens=CTX),
                                                        dry_run=True), timeout=5)
    assert dry.decision == types_pb2.REJECTED and dry.dry_run
    assert cluster.reserved_bytes() == 0


@pytest.mark.parametrize("prompt", [text(1), types_pb2.GenerateRequest(
    token_ids=types_pb2.TokenIds(ids=[1]))], ids=["text", "token_ids"])
def test_min_new_tokens_beyond_the_window_names_min_new_tokens(cluster, prompt):
    request = types_pb2.GenerateRequest()
    request.CopyFrom(prompt)
    request.min_new_tokens = CTX + 5  # max_new_tokens unset: never the caller's
    error = generate_error(cluster, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "max_new_tokens" not in error.details()
    assert f"min_new_tokens {CTX + 5:,} need" in error.details()
    assert f"lower min_new_tokens to at most {CTX - 1:,}" in error.details()
    bad = rich_status.unpack(rich_status.details_of(error), error_details_pb2.BadRequest)
    assert [v.field for v in bad.field_violations] == ["min_new_tokens"]
    rejection = rich_status.unpack(rich_status.details_of(error), types_pb2.Rejection)
    assert rejection.min_new_tokens == CTX + 5
