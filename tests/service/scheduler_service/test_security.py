"""The scheduler's control plane over TLS with API keys: who may call what, through real channels.

A scheduler with two keys (generate, admin) and TLS on both ports; workers
reach the internal port with mutual TLS. Every refusal leaves the ledger as it was.
"""

from __future__ import annotations

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ortserve.rpc.auth import parse_keys
from ortserve.rpc.tls import channel_credentials
from ortserve.status import rich_status
from ortserve.v1 import (
    internal_pb2,
    internal_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
)
from scheduler_service.config import SchedulerConfig
from scheduler_service.server import build_server
from tests.aio_thread import LoopThread
from tests.certs import make_certs

GENERATE_KEY = "gen-0123456789abcdef"
ADMIN_KEY = "adm-0123456789abcdef"
BPT = 1_024


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def reason(error: grpc.RpcError) -> str:
    return rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo).reason


def registration(worker_id: str = "w1") -> scheduler_pb2.RegisterWorkerRequest:
    # token-id prompts with a known vocabulary: no Tokenize call to a worker is needed
    return scheduler_pb2.RegisterWorkerRequest(
        worker_id=worker_id, address="127.0.0.1:1", model="m", context_length=4_096,
        bytes_per_token=BPT, capacity_bytes=1_000 * BPT, block_tokens=1, vocab_size=100)


class Secured:
    def __init__(self, tmp_path) -> None:
        self.certs = make_certs(tmp_path / "certs")
        self.loop = LoopThread()
        keys = parse_keys(f"generate:{GENERATE_KEY}\nadmin:{ADMIN_KEY}  # the operator", "test")
        self.scheduler = self.loop.run(build_server(SchedulerConfig(
            port=0, internal_port=0, api_keys=keys, tls=self.certs.scheduler)))
        self.public = f"localhost:{self.scheduler.port}"
        self.internal = f"localhost:{self.scheduler.internal_port}"
        self._channels: list[grpc.Channel] = []

    def channel(self, address: str, cert=None) -> grpc.Channel:
        creds = channel_credentials(self.certs.ca, cert.cert, cert.key) if cert else \
            channel_credentials(self.certs.ca)
        channel = grpc.secure_channel(address, creds)
        self._channels.append(channel)
        return channel

    def stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(self.channel(self.public))

    def worker_stub(self, cert=None) -> internal_pb2_grpc.SchedulerInternalStub:
        return internal_pb2_grpc.SchedulerInternalStub(
            self.channel(self.internal, cert or self.certs.worker))

    def ledger(self) -> scheduler_pb2.Budget:
        return self.stub().GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=True),
                                     timeout=5, metadata=bearer(ADMIN_KEY))

    def ledger_view(self) -> tuple:
        """What a refusal must leave alone (ages and timings move on their own)."""
        budget = self.ledger()
        return budget.total_reserved_bytes, [
            (w.worker_id, w.capacity_bytes, [(lease.lease_id, lease.claimed, lease.reserved_bytes)
                                             for lease in w.leases]) for w in budget.workers]

    def admit(self, key: str = GENERATE_KEY) -> types_pb2.Admission:
        return self.stub().Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=[1, 2, 3]), max_new_tokens=7)),
            timeout=5, metadata=bearer(key))

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
        self.loop.run(self.scheduler.stop(0))
        self.loop.close()


@pytest.fixture()
def secured(tmp_path):
    cluster = Secured(tmp_path)
    yield cluster
    cluster.close()


def refused(call, *args, **kw) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call(*args, timeout=5, **kw)
    return err.value


def test_a_call_without_a_key_is_unauthenticated_and_names_the_header(secured):
    error = refused(secured.stub().GetBudget, scheduler_pb2.GetBudgetRequest())
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED and reason(error) == "API_KEY_MISSING"
    assert "authorization: Bearer" in error.details() and "2 key(s)" in error.details()
    error = refused(secured.stub().GetBudget, scheduler_pb2.GetBudgetRequest(),
                    metadata=bearer("not-a-key-of-this-server"))
    assert error.code() == grpc.StatusCode.UNAUTHENTICATED and reason(error) == "API_KEY_UNKNOWN"
    # the streaming RPC is refused the same way, before anything is admitted
    stream = secured.stub().Generate(types_pb2.GenerateRequest(
        token_ids=types_pb2.TokenIds(ids=[1])), timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        list(stream)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_health_stays_open_without_a_key(secured):
    health = health_pb2_grpc.HealthStub(secured.channel(secured.public))
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=5).status == \
        health_pb2.HealthCheckResponse.SERVING


def test_a_generate_key_asking_for_every_lease_is_permission_denied(secured):
    secured.worker_stub().RegisterWorker(registration(), timeout=5)
    held = secured.admit()
    error = refused(secured.stub().GetBudget, scheduler_pb2.GetBudgetRequest(include_leases=True),
                    metadata=bearer(GENERATE_KEY))
    assert error.code() == grpc.StatusCode.PERMISSION_DENIED and reason(error) == "ROLE_REQUIRED"
    assert "role admin" in error.details() and "generate" in error.details()
    totals = secured.stub().GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5,
                                      metadata=bearer(GENERATE_KEY))
    assert totals.total_leases == 1 and not totals.workers[0].leases  # totals, no ids
    assert [lease.lease_id for lease in secured.ledger().workers[0].leases] == [held.lease_id]


def test_the_public_port_has_no_worker_rpcs_and_the_ledger_is_unchanged(secured):
    channel = secured.channel(secured.public)
    for method in ("/ortserve.v1.SchedulerInternal/RegisterWorker",
                   "/ortserve.v1.SchedulerInternal/ClaimLease",
                   "/ortserve.v1.Scheduler/RegisterWorker"):
        call = channel.unary_unary(method)
        error = refused(call, registration().SerializeToString(), metadata=bearer(ADMIN_KEY))
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED, method
    assert secured.ledger().workers == []


def test_the_public_port_cannot_deregister_a_worker(secured):
    # Deregister forgets a worker and its leases: only the worker itself, over the internal
    # port's mutual TLS, may say it is gone.
    secured.worker_stub().RegisterWorker(registration(), timeout=5)
    call = secured.channel(secured.public).unary_unary("/ortserve.v1.SchedulerInternal/Deregister")
    goodbye = internal_pb2.DeregisterRequest(worker_id=registration().worker_id,
                                             address=registration().address)
    error = refused(call, goodbye.SerializeToString(), metadata=bearer(ADMIN_KEY))
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert [w.worker_id for w in secured.ledger().workers] == [registration().worker_id]


def test_a_plain_client_cannot_release_or_claim_someone_elses_lease(secured):
    secured.worker_stub().RegisterWorker(registration(), timeout=5)
    theirs = secured.admit()
    before = secured.ledger_view()
    stub = secured.stub()
    for attempt in (scheduler_pb2.ReleaseRequest(lease_id=theirs.lease_id),
                    scheduler_pb2.ReleaseRequest(lease_id=theirs.lease_id, lease_secret="0" * 64)):
        error = refused(stub.Release, attempt, metadata=bearer(ADMIN_KEY))  # even an admin
        assert error.code() == grpc.StatusCode.PERMISSION_DENIED
        assert reason(error) == "LEASE_SECRET_MISMATCH" and "lease_secret" in error.details()
    error = refused(stub.Release, scheduler_pb2.ReleaseRequest(lease_id=theirs.lease_id,
                                                               worker_id="w1"),
                    metadata=bearer(GENERATE_KEY))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and "ReleaseClaimed" in error.details()
    # The internal port without a client certificate: the TLS handshake itself fails.
    plain = internal_pb2_grpc.SchedulerInternalStub(secured.channel(secured.internal, cert=None))
    error = refused(plain.ClaimLease, scheduler_pb2.ClaimLeaseRequest(lease_id=theirs.lease_id,
                                                                      worker_id="w1"))
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert secured.ledger_view() == before == (10 * BPT, [("w1", 1_000 * BPT,
                                                        [(theirs.lease_id, False, 10 * BPT)])])
    # The holder (with its secret) releases it.
    freed = stub.Release(scheduler_pb2.ReleaseRequest(lease_id=theirs.lease_id,
                                                      lease_secret=theirs.lease_secret),
                         timeout=5, metadata=bearer(GENERATE_KEY))
    assert freed.released and freed.freed_bytes == 10 * BPT
    assert secured.ledger().total_reserved_bytes == 0


def test_generate_stream_does_not_carry_the_lease_secret():
    # A worker that answers (the stream's Admission goes out with its first frame).
    from tests.service.fake_cluster import Cluster

    cluster = Cluster(api_keys=parse_keys(f"generate:{GENERATE_KEY}", "test"))
    try:
        cluster.register()
        stream = cluster.stub.Generate(types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=[1, 2]), max_new_tokens=3), timeout=5,
            metadata=bearer(GENERATE_KEY))
        first = next(stream)
        assert first.admission.lease_id and first.admission.lease_secret == ""
        stream.cancel()
    finally:
        cluster.close()


def test_a_worker_without_a_trusted_client_certificate_cannot_register(secured):
    without = internal_pb2_grpc.SchedulerInternalStub(secured.channel(secured.internal, cert=None))
    assert refused(without.RegisterWorker, registration("fake")).code() == grpc.StatusCode.UNAVAILABLE
    rogue = secured.worker_stub(secured.certs.rogue_worker)
    assert refused(rogue.RegisterWorker, registration("fake")).code() == grpc.StatusCode.UNAVAILABLE
    plaintext = internal_pb2_grpc.SchedulerInternalStub(grpc.insecure_channel(secured.internal))
    assert refused(plaintext.RegisterWorker, registration("fake")).code() == \
        grpc.StatusCode.UNAVAILABLE
    assert secured.ledger().workers == []
    secured.worker_stub().RegisterWorker(registration("w1"), timeout=5)  # the cluster's cert
    assert [w.worker_id for w in secured.ledger().workers] == ["w1"]


def test_an_open_plaintext_scheduler_beyond_loopback_says_so_loudly():
    from structlog.testing import capture_logs

    loop = LoopThread()
    try:
        with capture_logs() as logs:
            running = loop.run(build_server(SchedulerConfig(host="0.0.0.0", port=0, internal_port=0)))
        warnings = [(e["event"], e.get("port_role")) for e in logs if e["log_level"] == "warning"]
        assert any(event.startswith("NO API KEYS") for event, _ in warnings)
        assert {role for event, role in warnings if event.startswith("PLAINTEXT")} == \
            {"public", "internal"}
        loop.run(running.stop(0))
        with capture_logs() as logs:  # loopback: the local demo, quiet
            running = loop.run(build_server(SchedulerConfig(port=0, internal_port=0)))
        assert [e for e in logs if e["log_level"] == "warning"] == []
        loop.run(running.stop(0))
    finally:
        loop.close()


def test_a_generate_key_may_use_sessions_like_generate(secured):
    # Each session RPC with a generate key reaches its handler: an unknown session is the
    # handler's NOT_FOUND, an open with no worker its NO_WORKER, never ROLE_REQUIRED.
    stub = secured.stub()
    key = bearer(GENERATE_KEY)
    error = refused(stub.OpenSession, scheduler_pb2.OpenSessionRequest(), metadata=key)
    assert reason(error) == "NO_WORKER", error.details()
    unknown = scheduler_pb2.SessionRequest(session_id="no-such-session")
    for call in (stub.GetSession, stub.SwapOutSession, stub.CloseSession):
        error = refused(call, unknown, metadata=key)
        assert (error.code(), reason(error)) == (grpc.StatusCode.NOT_FOUND,
                                                 "SESSION_NOT_FOUND"), error.details()
    turn = stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
        session_id="no-such-session", request=types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=[1]))), timeout=5, metadata=key)
    with pytest.raises(grpc.RpcError) as err:
        list(turn)
    assert reason(err.value) == "SESSION_NOT_FOUND", err.value.details()
