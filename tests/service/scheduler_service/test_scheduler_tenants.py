"""Tenants through a real channel: keys and metadata to tenants, the tenant's cap and
rejection with their numbers and status details, and GetBudget's per-tenant rows."""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2

from ortserve.rpc.auth import parse_keys
from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, types_pb2
from scheduler_service.ledger import tenants
from tests.service.fake_cluster import BPT
from tests.service.scheduler_service.test_scheduler_queue import make_cluster, reason, request  # noqa: F401 - fixture

KEY_SMALL = "s" * 24
KEY_LARGE = "l" * 24
KEY_ADMIN = "a" * 24
TABLE = f"""
trust_tenant_metadata = false
[tenants.small]
quota = "30%"
key_sha256 = ["{tenants.key_digest(KEY_SMALL).hex()}"]
[tenants.large]
quota = "70%"
key_sha256 = ["{tenants.key_digest(KEY_LARGE).hex()}"]
"""


def _as(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


@pytest.fixture()
def cluster(make_cluster):  # noqa: F811 - the fixture imported above
    keys = parse_keys(f"generate:{KEY_SMALL}\ngenerate:{KEY_LARGE}\nadmin:{KEY_ADMIN}\n", "keys")
    return make_cluster(api_keys=keys, tenants=tenants.parse(TABLE, "t.toml"))


def test_a_key_is_charged_to_its_tenant_and_capped_to_its_room_with_both_numbers(cluster):
    # 100 blocks of BPT: small's quota is 30 blocks.
    adm = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request(50), dry_run=False),
                             metadata=_as(KEY_SMALL), timeout=5)
    cap = adm.budget_cap
    assert adm.decision == types_pb2.CAPPED and adm.reserved_bytes == 30 * BPT
    assert cap.limit == types_pb2.CAP_LIMIT_TENANT_QUOTA and cap.tenant == "small"
    assert (cap.tenant_quota_bytes, cap.tenant_reserved_bytes) == (30 * BPT, 0)
    other = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request(50), dry_run=False),
                               metadata=_as(KEY_LARGE), timeout=5)
    assert other.decision == types_pb2.ADMITTED  # large's room is its own
    rows = {(t.tenant, t.model): t for t in cluster.budget_as(KEY_ADMIN).tenants}
    assert rows[("small", "m")].reserved_bytes == 30 * BPT
    assert rows[("small", "m")].quota_bytes == 30 * BPT
    assert rows[("large", "m")].reserved_bytes == 60 * BPT
    # A generate key sees its own tenant's standing only.
    assert [t.tenant for t in cluster.budget_as(KEY_LARGE).tenants] == ["large"]


def test_a_tenant_at_its_quota_is_rejected_tenant_quota_with_its_numbers_and_retry_info(cluster):
    cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request(20), dry_run=False),
                       metadata=_as(KEY_SMALL), timeout=5)  # 30 of its 30 blocks
    stream = cluster.stub.Generate(request(5, min_new=5, max_queue_wait_ms=0),
                                   metadata=_as(KEY_SMALL), timeout=5)
    with pytest.raises(grpc.RpcError) as refused:
        list(stream)
    error = refused.value
    details = rich_status.details_of(error)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(error) == "TENANT_QUOTA"
    rejection = rich_status.unpack(details, types_pb2.Rejection)
    assert rejection.cause == types_pb2.TENANT_QUOTA and rejection.tenant == "small"
    assert (rejection.tenant_quota_bytes, rejection.tenant_reserved_bytes) == (30 * BPT, 30 * BPT)
    assert rich_status.unpack(details, error_details_pb2.RetryInfo).retry_delay.seconds == 2
    quota = rich_status.unpack(details, error_details_pb2.QuotaFailure)
    assert quota.violations[0].subject == "tenant/small/kv_cache_bytes"
    assert "tenant 'small' holds 30.0 KiB of its quota of 30 % of 100.0 KiB" in error.details()
    info = rich_status.unpack(details, error_details_pb2.ErrorInfo)
    assert info.metadata["tenant_quota_bytes"] == str(30 * BPT)


def test_tenant_metadata_this_scheduler_does_not_trust_is_refused_not_ignored(cluster):
    with pytest.raises(grpc.RpcError) as refused:
        cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request(5)),
                           metadata=_as(KEY_SMALL) + (("ortserve-tenant", "large"),), timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "names tenant 'large' but its API key is tenant 'small'" in refused.value.details()


def test_a_tenant_past_its_request_rate_is_resource_exhausted_tenant_rate_with_retry_info(
        make_cluster):  # noqa: F811 - the fixture imported above
    keys = parse_keys(f"generate:{KEY_SMALL}\n", "keys")
    table = tenants.parse(TABLE.replace('quota = "30%"', 'quota = "30%"\nrequests_per_s = 0.01'),
                          "t.toml")
    cluster = make_cluster(api_keys=keys, tenants=table)
    first = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=request(5), dry_run=False),
                               metadata=_as(KEY_SMALL), timeout=5)
    assert first.decision == types_pb2.ADMITTED
    with pytest.raises(grpc.RpcError) as refused:
        list(cluster.stub.Generate(request(5), metadata=_as(KEY_SMALL), timeout=5))
    error = refused.value
    details = rich_status.details_of(error)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and reason(error) == "TENANT_RATE"
    rejection = rich_status.unpack(details, types_pb2.Rejection)
    assert (rejection.cause, rejection.tenant, rejection.tenant_burst) == (
        types_pb2.TENANT_RATE, "small", 1)
    assert rejection.tenant_requests_per_s == pytest.approx(0.01)
    assert 90 <= rich_status.unpack(details, error_details_pb2.RetryInfo).retry_delay.seconds <= 100
    quota = rich_status.unpack(details, error_details_pb2.QuotaFailure)
    assert quota.violations[0].subject == "tenant/small/requests_per_s"
    assert cluster.budget_as(KEY_SMALL).total_leases == 1  # the refused one holds nothing


def test_a_stored_response_is_absent_to_another_tenants_key(cluster):
    # The gateway's store: true records (GET /v1/responses/{id}, previous_response_id) are
    # kept here; another tenant's key finds none, as if never stored (the gateway's 404).
    stored = scheduler_pb2.StoredResponse(id="resp_1", session_id="s1", record=b"{}",
                                          ttl_s=60)
    cluster.stub.PutStoredResponse(stored, metadata=_as(KEY_SMALL), timeout=5)
    ask = scheduler_pb2.StoredResponseRequest(id="resp_1")
    assert not cluster.stub.GetStoredResponse(ask, metadata=_as(KEY_LARGE), timeout=5).found
    assert cluster.stub.ClaimStoredResponse(ask, metadata=_as(KEY_LARGE), timeout=5).session_id == ""
    assert not cluster.stub.DeleteStoredResponse(ask, metadata=_as(KEY_LARGE), timeout=5).found
    with pytest.raises(grpc.RpcError) as taken:  # nor can it write over it
        cluster.stub.PutStoredResponse(stored, metadata=_as(KEY_LARGE), timeout=5)
    assert taken.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    mine = cluster.stub.GetStoredResponse(ask, metadata=_as(KEY_SMALL), timeout=5)
    assert mine.found and mine.response.session_id == "s1"
    assert cluster.stub.DeleteStoredResponse(ask, metadata=_as(KEY_SMALL), timeout=5).found
