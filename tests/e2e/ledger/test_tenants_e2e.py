"""Tenants through real processes: a scheduler with a tenants file and API keys, one CPU
worker with the tiny model, the CLI and the gateway.

Every request reserves exactly two KV blocks (prompt + max_new = 2 blocks, min_new =
max_new so nothing ends early) and the worker's capacity is 20 blocks: tenant `small`
(30 %) holds at most 3 such requests, `large` (70 %) at most 7.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request

import grpc
import pytest
from google.rpc import error_details_pb2
from ortserve_client import Client

from devtools.cluster import LocalCluster, model_cache, stop_service
from ortserve.status import rich_status
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2
from scheduler_service.ledger.tenants import key_digest
from tests.e2e.conftest import BIN, wait_drained
from tests.e2e.gateway.test_gateway_e2e import start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

KEYS = {"small": "small-key-" + "s" * 20, "large": "large-key-" + "l" * 20,
        "admin": "admin-key-" + "a" * 20,
        # The session RPCs need the admin role (ortserve.rpc.auth.METHOD_ROLES lists them not).
        "small-admin": "small-admin-" + "x" * 20}
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8]  # token ids inside any vocabulary
CLIENTS = 6  # per tenant (the 24 is too many for a 2-core shared machine)
STOP_AFTER = 30  # completed requests, both tenants together, before the clients stop
BLOCKS = 20


def tenants_toml(small: str = "30%") -> str:
    return (f'[tenants.small]\nquota = "{small}"\nkey_sha256 = ["{key_digest(KEYS["small"]).hex()}", '
            f'"{key_digest(KEYS["small-admin"]).hex()}"]\n'
            f'\n[tenants.large]\nquota = "70%"\nweight = 1\n'
            f'key_sha256 = ["{key_digest(KEYS["large"]).hex()}"]\n')


def start(tmp_path_factory, name: str, aging_s: float):
    model_dir = model_cache() / "models" / "tiny-llama"
    if not (model_dir / "ortserve-model.json").is_file():
        pytest.fail(f"the tiny model is not prepared at {model_dir}: run `make tiny-model`")
    folder = tmp_path_factory.mktemp(f"tenants-{name}")
    keys = folder / "keys.txt"
    keys.write_text(f"generate:{KEYS['small']}\ngenerate:{KEYS['large']}\nadmin:{KEYS['admin']}\n"
                    f"admin:{KEYS['small-admin']}\n")
    table = folder / "tenants.toml"
    table.write_text(tenants_toml())
    # The tiny model: 2 layers x 2 kv heads x 16 x 4 bytes x 2 = 512 B/token, 64-token blocks.
    block_bytes = 64 * 512
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, log_dir=folder / "logs",
                           kv_capacities=[str(BLOCKS * block_bytes)], api_key=KEYS["admin"],
                           scheduler_args=["--api-keys-file", str(keys), "--tenants-file", str(table),
                                           "--queue-aging-s", str(aging_s),
                                           "--max-queue-wait-s", "300",
                                           # held leases (never claimed) outlive a slow setup
                                           "--claim-ttl-s", "600"]).start()
    worker = budget(cluster).workers[0]
    assert worker.block_tokens * worker.bytes_per_token == block_bytes, "the tiny model's geometry changed"
    cluster.table_path = table
    cluster.block_tokens = worker.block_tokens
    return cluster


@pytest.fixture(scope="module")
def tenants(tmp_path_factory):
    cluster = start(tmp_path_factory, "main", aging_s=600)
    yield cluster
    cluster.stop()


def stub(cluster) -> scheduler_pb2_grpc.SchedulerStub:
    return scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(cluster.address))


def as_(who: str):
    return (("authorization", f"Bearer {KEYS[who]}"),)


def budget(cluster) -> scheduler_pb2.Budget:
    return stub(cluster).GetBudget(scheduler_pb2.GetBudgetRequest(), metadata=as_("admin"), timeout=5)


def rows(cluster) -> dict[str, scheduler_pb2.TenantBudget]:
    return {t.tenant: t for t in budget(cluster).tenants}


def two_blocks(cluster, **kw) -> types_pb2.GenerateRequest:
    new = 2 * cluster.block_tokens - len(PROMPT)
    return types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=PROMPT), max_new_tokens=new,
                                     min_new_tokens=new, **kw)


def wait_until(check, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert check()


def test_two_tenants_flooding_stay_within_their_quotas_and_both_progress(tenants):
    quota = {name: row.quota_bytes for name, row in rows(tenants).items() if row.HasField("quota_bytes")}
    assert quota == {"small": 6 * 64 * 512, "large": 14 * 64 * 512}
    polls: list[dict[str, int]] = []
    stop, finished = threading.Event(), threading.Event()
    tokens = {"small": 0, "large": 0}
    completed = {"small": 0, "large": 0}
    errors: list[BaseException] = []
    lock = threading.Lock()

    def poll() -> None:
        while not finished.is_set():
            polls.append({name: row.reserved_bytes for name, row in rows(tenants).items()})
            time.sleep(0.02)

    def flood(who: str) -> None:
        try:
            with Client(tenants.address, api_key=KEYS[who], timeout_s=120, direct=False) as client:
                while not stop.is_set():
                    request = two_blocks(tenants)
                    result = client.generate(list(PROMPT), max_new_tokens=request.max_new_tokens,
                                             min_new_tokens=request.min_new_tokens)
                    with lock:
                        tokens[who] += result.usage.generated_tokens
                        completed[who] += 1
                        if sum(completed.values()) >= STOP_AFTER:
                            stop.set()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
            stop.set()

    poller = threading.Thread(target=poll)
    poller.start()
    floods = [threading.Thread(target=flood, args=(who,)) for who in ("small", "large")
              for _ in range(CLIENTS)]
    for t in floods:
        t.start()
    for t in floods:
        t.join()
    finished.set()
    poller.join()
    assert not errors, errors
    assert completed["small"] > 0 and completed["large"] > 0  # both made progress
    assert len(polls) > 10
    for seen in polls:
        assert seen["small"] <= quota["small"] and seen["large"] <= quota["large"], seen
    assert max(p["small"] for p in polls) == quota["small"]  # it did use its whole quota
    share = tokens["small"] / (tokens["small"] + tokens["large"])
    print(f"delivered tokens: small {tokens['small']:,}, large {tokens['large']:,} "
          f"(small's share {share:.2f}); completed {completed}")
    assert share >= 0.30
    wait_until(lambda: budget(tenants).total_reserved_bytes == 0)


def hold(cluster, who: str, blocks: int) -> types_pb2.Admission:
    """A lease of `blocks` KV blocks, held (unclaimed) until released."""
    new = blocks * cluster.block_tokens - len(PROMPT)
    adm = stub(cluster).Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        token_ids=types_pb2.TokenIds(ids=PROMPT), max_new_tokens=new, min_new_tokens=new,
        cap_policy=types_pb2.CAP_POLICY_STRICT), dry_run=False), metadata=as_(who), timeout=5)
    assert adm.decision == types_pb2.ADMITTED, adm
    return adm


def release(cluster, adm: types_pb2.Admission, who: str) -> None:
    stub(cluster).Release(scheduler_pb2.ReleaseRequest(lease_id=adm.lease_id, lease_secret=adm.lease_secret),
                          metadata=as_(who), timeout=5)


class Stream:
    """A Generate stream read on its own thread: its first non-Queued event is recorded."""

    def __init__(self, cluster, who: str, **kw) -> None:
        self.admitted = threading.Event()
        self.admission: types_pb2.Admission | None = None
        self.error: grpc.RpcError | None = None
        self.call = stub(cluster).Generate(two_blocks(cluster, **kw), metadata=as_(who), timeout=300)
        self.thread = threading.Thread(target=self._read)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.call:
                if event.HasField("admission"):
                    self.admission = event.admission
                    self.admitted.set()
        except grpc.RpcError as error:
            self.error = error

    def close(self) -> None:
        self.call.cancel()
        self.thread.join()


class Waiting:
    """An Admit that waits in the queue on its own thread; once admitted its lease is held
    (unclaimed) until released, so the room it took cannot pass to the next in line while
    the test reads the queue (a Generate stream on the tiny model can finish first)."""

    def __init__(self, cluster, who: str, **kw) -> None:
        self.cluster, self.who = cluster, who
        self.admitted = threading.Event()
        self.admission: types_pb2.Admission | None = None
        self.error: grpc.RpcError | None = None
        self.thread = threading.Thread(target=self._admit, args=(two_blocks(cluster, **kw),))
        self.thread.start()

    def _admit(self, request: types_pb2.GenerateRequest) -> None:
        try:
            self.admission = stub(self.cluster).Admit(
                scheduler_pb2.AdmitRequest(request=request, max_queue_wait_ms=240_000),
                metadata=as_(self.who), timeout=300)
            self.admitted.set()
        except grpc.RpcError as error:
            self.error = error

    def close(self) -> None:
        self.thread.join()
        if self.admission is not None and self.admission.lease_id:
            release(self.cluster, self.admission, self.who)


def test_a_high_priority_request_behind_20_queued_low_ones_is_admitted_first(tenants):
    most = hold(tenants, "admin", BLOCKS - 2)
    last = hold(tenants, "admin", 2)  # the pool is full
    lows = []
    for i in range(20):
        lows.append(Stream(tenants, "admin", priority=10))
        wait_until(lambda n=i + 1: budget(tenants).queue_length == n or lows[-1].error)
        assert lows[-1].error is None, lows[-1].error
    high = Waiting(tenants, "admin", priority=-1)  # holds its room once admitted
    wait_until(lambda: budget(tenants).queue_length == 21)
    release(tenants, last, "admin")  # room for exactly one request
    assert high.admitted.wait(60), high.error
    assert high.admission.decision == types_pb2.ADMITTED
    assert budget(tenants).queue_length == 20 and not any(s.admitted.is_set() for s in lows)
    release(tenants, most, "admin")
    high.close()
    for s in lows:
        assert s.admitted.wait(120)
    for s in lows:
        s.close()
    wait_until(lambda: budget(tenants).total_reserved_bytes == 0)


def test_a_low_priority_request_that_waited_the_aging_bound_goes_before_a_higher_one(tmp_path_factory):
    cluster = start(tmp_path_factory, "aging", aging_s=1.0)
    try:
        most = hold(cluster, "admin", BLOCKS - 2)
        last = hold(cluster, "admin", 2)
        low = Waiting(cluster, "admin", priority=100)  # holds its room once admitted
        wait_until(lambda: budget(cluster).queue_oldest_wait_s >= budget(cluster).queue_aging_s)
        high = Stream(cluster, "admin", priority=-100)
        wait_until(lambda: budget(cluster).queue_length == 2)
        release(cluster, last, "admin")
        assert low.admitted.wait(60), low.error
        assert low.admission.queue_wait_ms >= 1_000
        assert not high.admitted.is_set() and budget(cluster).queue_length == 1
        release(cluster, most, "admin")
        assert high.admitted.wait(60)
        low.close()
        high.close()
    finally:
        cluster.stop()


def test_a_tenant_cap_and_rejection_carry_the_tenants_numbers_through_grpc(tenants):
    big = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=PROMPT), max_new_tokens=1_000)
    events = stub(tenants).Generate(big, metadata=as_("small"), timeout=120)
    first = next(iter(events))
    cap = first.admission.budget_cap
    assert first.admission.decision == types_pb2.CAPPED
    assert cap.limit == types_pb2.CAP_LIMIT_TENANT_QUOTA and cap.tenant == "small"
    assert (cap.tenant_quota_bytes, cap.tenant_reserved_bytes) == (6 * 64 * 512, 0)
    assert cap.admitted_bytes == cap.tenant_quota_bytes
    last = list(events)[-1]
    assert last.finished.budget_cap.tenant == "small"  # repeated in Finished
    wait_drained(tenants)  # the worker releases the capped lease after its Finished
    held = hold(tenants, "small", 6)
    try:
        with pytest.raises(grpc.RpcError) as refused:
            list(stub(tenants).Generate(two_blocks(tenants, max_queue_wait_ms=0),
                                        metadata=as_("small"), timeout=30))
        details = rich_status.details_of(refused.value)
        rejection = rich_status.unpack(details, types_pb2.Rejection)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert rejection.cause == types_pb2.TENANT_QUOTA and rejection.tenant == "small"
        assert rejection.tenant_reserved_bytes == rejection.tenant_quota_bytes == 6 * 64 * 512
        assert rich_status.unpack(details, error_details_pb2.RetryInfo) is not None
        # The other tenant is not held back by small's quota.
        # A dry run: an Admit that reserved would hold its lease past the test (unclaimed,
        # until --claim-ttl-s), in the next tests' numbers.
        assert stub(tenants).Admit(scheduler_pb2.AdmitRequest(request=two_blocks(tenants),
                                                              dry_run=True),
                                   metadata=as_("large"), timeout=5).decision == types_pb2.ADMITTED
    finally:
        release(tenants, held, "small")


def cli(cluster, who: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "ortserve"), "--address", cluster.address, *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ORTSERVE_API_KEY": KEYS[who], "ORTSERVE_DIRECT": ""})


def test_the_cli_shows_the_tenants_cap_rejection_and_budget(tenants):
    capped = cli(tenants, "small", "generate", "--stats", "--max-new-tokens", "1000", "hello")
    assert capped.returncode == 0, capped.stderr
    assert "CAPPED by tenant small's KV quota" in capped.stderr
    assert f"tenant_quota_bytes={6 * 64 * 512:,}" in capped.stderr
    assert "CAPPED" not in capped.stdout
    refused = cli(tenants, "small", "generate", "--strict", "--max-new-tokens", "1000", "hello")
    assert refused.returncode == 3, refused.stderr
    assert "tenant_quota" in refused.stderr and "tenant 'small'" in refused.stderr
    assert "more than its whole quota" in refused.stderr
    table = cli(tenants, "admin", "budget")
    assert table.returncode == 0, table.stderr
    small = next(line for line in table.stdout.splitlines() if line.startswith("small "))
    assert "192.0 KiB" in small  # its quota, 6 blocks
    assert str(tenants.table_path) in table.stdout


def test_the_gateway_answers_the_tenants_cap_in_headers_and_body_and_429_at_its_quota(
        tenants, tmp_path_factory):
    gateway = start_gateway(tmp_path_factory, tenants.address)
    try:
        def post(body: dict, who: str):
            request = urllib.request.Request(
                f"http://{gateway.address}/v1/completions", data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEYS[who]}"})
            try:
                with urllib.request.urlopen(request, timeout=120) as answer:
                    return answer.status, answer.headers, json.loads(answer.read())
            except urllib.error.HTTPError as error:
                return error.code, error.headers, json.loads(error.read())

        status, headers, body = post({"model": "tiny-llama", "prompt": "hi", "max_tokens": 1_000,
                                      "priority": 0}, "small")
        assert status == 200 and headers["X-Ortserve-Decision"] == "CAPPED"
        assert 'limit="tenant_quota", tenant="small"' in headers["X-Ortserve-Budget-Cap"]
        assert f"tenant_quota_bytes={6 * 64 * 512}" in headers["X-Ortserve-Budget-Cap"]
        cap = body["ortserve"]["budget_cap"]
        assert (cap["limit"], cap["tenant"], cap["tenant_quota_bytes"]) == ("tenant_quota", "small", 6 * 64 * 512)
        wait_drained(tenants)  # the capped completion's lease goes back after its answer
        held = hold(tenants, "small", 6)
        try:
            status, headers, body = post({"model": "tiny-llama", "prompt": "hi", "max_tokens": 8,
                                          "max_queue_wait_ms": 0}, "small")
        finally:
            release(tenants, held, "small")
        assert status == 429 and int(headers["Retry-After"]) >= 1
        error = body["error"]
        assert error["code"] == "tenant_quota" and error["type"] == "rate_limit_error"
        assert error["ortserve"]["rejection"]["tenant"] == "small"
        assert int(error["ortserve"]["rejection"]["tenant_quota_bytes"]) == 6 * 64 * 512
    finally:
        stop_service(gateway)


def test_sighup_reloads_the_tenants_file_and_a_bad_one_keeps_the_tenants_in_force(tenants):
    process = tenants.services[0].process
    bad = tenants_toml() + "\n[tenants.small]\nweight = 2\n"  # small declared twice
    tenants.table_path.write_text(bad)
    process.send_signal(signal.SIGHUP)
    wait_until(lambda: "tenants file refused" in tenants.services[0].log_path.read_text())
    line = bad.splitlines().index("[tenants.small]", 1) + 1
    assert f"at line {line}" in tenants.services[0].log_path.read_text()
    assert rows(tenants)["small"].quota_bytes == 6 * 64 * 512  # the old table stands
    tenants.table_path.write_text(tenants_toml(small="50%"))
    process.send_signal(signal.SIGHUP)
    wait_until(lambda: rows(tenants)["small"].quota_bytes == 10 * 64 * 512)
    tenants.table_path.write_text(tenants_toml())
    process.send_signal(signal.SIGHUP)
    wait_until(lambda: rows(tenants)["small"].quota_bytes == 6 * 64 * 512)


def test_a_sessions_turns_count_against_the_tenant_that_opened_it(tenants):
    info = stub(tenants).OpenSession(scheduler_pb2.OpenSessionRequest(), metadata=as_("small-admin"),
                                     timeout=30)
    try:
        turn = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=PROMPT), max_new_tokens=1_000)
        events = list(stub(tenants).SessionTurn(scheduler_pb2.SessionTurnRequest(
            session_id=info.session_id, request=turn), metadata=as_("small-admin"), timeout=120))
        cap = events[0].admission.budget_cap
        assert cap.limit == types_pb2.CAP_LIMIT_TENANT_QUOTA and cap.tenant == "small"
        assert cap.admitted_bytes == 6 * 64 * 512
        held = stub(tenants).GetSession(scheduler_pb2.SessionRequest(session_id=info.session_id),
                                        metadata=as_("small-admin"), timeout=30).reserved_bytes
        assert held > 0 and rows(tenants)["small"].reserved_bytes == held  # charged to small
        # Another tenant's key (admin: charged to no tenant) cannot see, use or close it.
        request = scheduler_pb2.SessionRequest(session_id=info.session_id)
        for call in (lambda: stub(tenants).GetSession(request, metadata=as_("admin"), timeout=30),
                     lambda: stub(tenants).CloseSession(request, metadata=as_("admin"), timeout=30),
                     lambda: list(stub(tenants).SessionTurn(scheduler_pb2.SessionTurnRequest(
                         session_id=info.session_id, request=turn), metadata=as_("admin"),
                         timeout=30))):
            with pytest.raises(grpc.RpcError) as refused:
                call()
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND, refused.value.details()
            assert "opened by another tenant" in refused.value.details()
        assert stub(tenants).GetSession(request, metadata=as_("small-admin"),
                                        timeout=30).reserved_bytes == held  # still small's
    finally:
        stub(tenants).CloseSession(scheduler_pb2.SessionRequest(session_id=info.session_id),
                                   metadata=as_("small-admin"), timeout=30)
    wait_until(lambda: rows(tenants)["small"].reserved_bytes == 0)
