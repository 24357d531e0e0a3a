"""Wire-level fuzz: random GenerateRequests / AdmitRequests, invalid UTF-8 spliced in, as raw bytes.

Every answer is a well-formed status with a precise code (never UNKNOWN,
INTERNAL, or UNAVAILABLE from a live service), the scheduler stays up, and
the ledger ends at zero.
"""

from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.service.fake_cluster import Cluster

ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
           grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.NOT_FOUND}

texts = st.text(max_size=40) | st.text(min_size=200, max_size=600)
requests = st.builds(
    types_pb2.GenerateRequest,
    request_id=st.text(max_size=300),
    text=texts,
    max_new_tokens=st.integers(0, 2**32 - 1),
    min_new_tokens=st.integers(0, 2**32 - 1),
    stop=st.lists(st.text(max_size=300), max_size=20),
    cap_policy=st.integers(0, 5),
) | st.builds(
    lambda ids, n: types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=ids), max_new_tokens=n),
    st.lists(st.integers(0, 2**32 - 1), max_size=50), st.integers(0, 5_000),
) | st.builds(
    lambda turns: types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(messages=[
        types_pb2.ChatMessage(role=r, content=c) for r, c in turns])),
    st.lists(st.tuples(st.sampled_from(["user", "system", "assistant", "wizard", ""]), texts),
             max_size=5),
)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    c.register(capacity_tokens=3_000)
    yield c
    c.close()


def _raw(message, splice: bool, at: float) -> bytes:
    raw = message.SerializeToString()
    if splice and b"a" in raw:  # 'a' inside a string field becomes ff fe: invalid UTF-8
        index = raw.find(b"a", int(len(raw) * at))
        index = raw.find(b"a") if index < 0 else index
        raw = raw[:index] + b"\xff" + raw[index + 1:]
    return raw


def _check(error: grpc.RpcError) -> None:
    assert error.code() in ALLOWED, (error.code(), error.details())
    assert error.details()
    rich_status.details_of(error)  # the details parse and agree with the status


@settings(max_examples=150, deadline=2_000, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                    HealthCheck.too_slow])
@given(request=requests, dry_run=st.booleans(), splice=st.booleans(), at=st.floats(0, 1),
       admit=st.booleans())
def test_any_request_gets_a_precise_status_and_the_ledger_ends_at_zero(
        cluster, request, dry_run, splice, at, admit):
    channel = cluster.channel
    if admit:
        call = channel.unary_unary("/ortserve.v1.Scheduler/Admit")
        try:
            raw = call(_raw(scheduler_pb2.AdmitRequest(request=request, dry_run=dry_run), splice, at),
                       timeout=5)
            answer = types_pb2.Admission.FromString(raw)
            if answer.lease_id:
                cluster.stub.Release(scheduler_pb2.ReleaseRequest(
                    lease_id=answer.lease_id, lease_secret=answer.lease_secret), timeout=5)
        except grpc.RpcError as error:
            _check(error)
    else:
        call = channel.unary_stream("/ortserve.v1.Scheduler/Generate")
        try:
            for _ in call(_raw(request, splice, at), timeout=5):
                pass
        except grpc.RpcError as error:
            _check(error)
    assert cluster.reserved_bytes() == 0
