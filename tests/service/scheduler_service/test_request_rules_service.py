"""The request rules at the scheduler's edge (ortserve.rules.request_rules), through a real channel:
a request that breaks one is refused before a worker is asked or a byte is reserved."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.service.fake_cluster import Cluster


@pytest.fixture()
def cluster():
    c = Cluster()
    yield c
    c.close()


def _ledger(cluster: Cluster) -> tuple[int, int]:
    budget = cluster.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    return budget.total_reserved_bytes, budget.total_leases


@pytest.mark.parametrize(("sampling", "field"), [
    (types_pb2.SamplingParams(temperature=1.0, top_p=1.5), "sampling.top_p"),
    (types_pb2.SamplingParams(temperature=-0.5), "sampling.temperature"),
])
def test_token_id_prompt_with_a_bad_sampling_range_is_refused_before_any_reservation(
        cluster, sampling, field):
    cluster.register()
    # Another caller's lease, so "never moved" is not merely "still zero".
    held = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        token_ids=types_pb2.TokenIds(ids=[1, 2]), max_new_tokens=8)), timeout=5)
    assert held.decision == types_pb2.ADMITTED
    before = _ledger(cluster)
    request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=[1, 2, 3]),
                                        max_new_tokens=10, sampling=sampling)
    events = []
    with pytest.raises(grpc.RpcError) as err:
        for event in cluster.stub.Generate(request, timeout=5):
            events.append(event)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = rich_status.unpack(rich_status.details_of(err.value), error_details_pb2.BadRequest)
    assert bad.field_violations[0].field == field and field in err.value.details()
    assert events == []  # no Admission was sent: nothing was admitted
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request), timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"request.{field}" in err.value.details()
    assert _ledger(cluster) == before  # reserved bytes and lease count never moved
    assert cluster.worker.generate_requests == [] and cluster.worker.tokenize_calls == 0


def test_a_text_prompt_with_an_ignored_sampling_field_is_refused_before_tokenize(cluster):
    cluster.register()
    before = _ledger(cluster)
    with pytest.raises(grpc.RpcError) as err:
        cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
            text="a b", sampling=types_pb2.SamplingParams(top_k=5))), timeout=5)
    # Greedy decoding has no use for top_k: refused, never ignored (the worker's rule too).
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request.sampling.top_k" in err.value.details()
    assert _ledger(cluster) == before and cluster.worker.tokenize_calls == 0
