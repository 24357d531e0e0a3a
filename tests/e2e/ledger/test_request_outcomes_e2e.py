"""Every request counted once by how it ended, through real processes.

One scheduler, one worker with a small KV budget, the gateway: a finished
request, a cancelled stream, a deadline, a rejection and a worker kill each move
exactly their own ortserve_scheduler_requests_total series by one; prompt tokens
add up to the usage the clients were told; the KV ratio equals GetBudget's bytes;
the gateway's /metrics parses.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.error
import urllib.request
from collections import Counter

import grpc
import pytest
from ortserve_client import Client
from prometheus_client.parser import text_string_to_metric_families

from devtools.cluster import Service, stop_service
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import scheduler_stub, start_cluster
from tests.e2e.gateway.test_gateway_e2e import MODEL, openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BPT = 46_080  # SmolLM2-135M fp32 KV bytes per token
BUDGET_TOKENS = 512
LONG = 300  # new tokens: seconds of decode on a CPU, long enough to cut a stream short


def metrics_port(service: Service, timeout_s: float = 30.0) -> int:
    """The port a service's "metrics serving" log line names (it bound --metrics-port 0)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in service.log_path.read_text(errors="replace").splitlines():
            if "metrics serving" in line:
                # JSON ("address": "HOST:PORT") or plain (address=HOST:PORT) logs
                return int(re.search(r'address"?[:=] ?"?[^\s",]+:(\d+)', line).group(1))
        time.sleep(0.1)
    pytest.fail(f"{service.name} never logged 'metrics serving':\n{service.log_tail()}")


def samples(url: str) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def outcomes(port: int) -> Counter:
    """(rpc, outcome, cause) -> count, from ortserve_scheduler_requests_total."""
    return Counter({(dict(labels)["rpc"], dict(labels)["outcome"], dict(labels)["cause"]): value
                    for (name, labels), value in samples(f"http://127.0.0.1:{port}/metrics").items()
                    if name == "ortserve_scheduler_requests_total"})


def moved(port: int, before: Counter, timeout_s: float = 60.0) -> dict:
    """The series that moved since `before` (waiting for the first move, then a moment
    longer, so a second count would show)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        after = outcomes(port)
        if after != before:
            time.sleep(0.5)
            after = outcomes(port)
            return {key: after[key] - before[key] for key in after if after[key] != before[key]}
        time.sleep(0.1)
    pytest.fail(f"no outcome counted within {timeout_s:g} s")


def long_request(**kw) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=[28, 57, 81, 33] * 4),
                                     max_new_tokens=LONG, min_new_tokens=LONG, **kw)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "outcomes", kv_capacities=[str(BUDGET_TOKENS * BPT)],
                            scheduler_args=["--metrics-port", "0"],
                            worker_args=["--metrics-port", "0"])
    # Relayed: the scheduler counts the outcome of each Generate it relays.
    gateway = start_gateway(tmp_path_factory, cluster.address, ("--no-direct-to-workers",))
    ports = (metrics_port(cluster.services[0]), metrics_port(cluster.worker_services[0]))
    yield cluster, gateway, ports
    stop_service(gateway)
    cluster.stop()


def test_finished_requests_count_their_prompt_tokens_as_the_clients_saw_them(cluster):
    cluster, gateway, (port, worker_port) = cluster
    before = outcomes(port)
    tokens_before = samples(f"http://127.0.0.1:{port}/metrics").get(
        ("ortserve_scheduler_prompt_tokens_total", ()), 0.0)
    with Client(cluster.address, timeout_s=120, direct=False) as client:
        direct = client.generate(chat=[("user", "Name three colours.")], max_new_tokens=8)
    via_gateway = openai_client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=8)
    deadline = time.monotonic() + 30
    while sum(outcomes(port).values()) - sum(before.values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    after = outcomes(port)
    finished = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert {k[:2] for k in finished} == {("generate", "finished")}
    assert sum(finished.values()) == 2
    scheduler = samples(f"http://127.0.0.1:{port}/metrics")
    told = direct.usage.prompt_tokens + via_gateway.usage.prompt_tokens
    assert scheduler[("ortserve_scheduler_prompt_tokens_total", ())] - tokens_before == told
    # Nothing runs now: no bytes reserved, ratio 0, per worker (with its model) and in total.
    assert scheduler[("ortserve_scheduler_kv_reserved_ratio",
                      (("model", MODEL), ("worker_id", "worker-0")))] == 0.0
    assert scheduler[("ortserve_scheduler_total_kv_reserved_ratio", ())] == 0.0
    worker = samples(f"http://127.0.0.1:{worker_port}/metrics")
    assert worker[("ortserve_worker_kv_usage_ratio", (("model", MODEL),))] == 0.0


def test_a_two_step_request_counts_once_from_its_workers_release(cluster):
    """Admit, then the worker's own stream (the gateway's and the client's default path):
    no scheduler handler sees its end, its worker says how it ended as it releases."""
    cluster, _, (port, _) = cluster
    before = outcomes(port)
    tokens_before = samples(f"http://127.0.0.1:{port}/metrics").get(
        ("ortserve_scheduler_generated_tokens_total", ()), 0.0)
    with Client(cluster.address, timeout_s=120, direct=True) as client:
        result = client.generate(chat=[("user", "Name three colours.")], max_new_tokens=6,
                                 min_new_tokens=6)
    assert moved(port, before) == {("direct", "finished", "length"): 1}
    assert result.usage.generated_tokens == 6
    assert samples(f"http://127.0.0.1:{port}/metrics")[
        ("ortserve_scheduler_generated_tokens_total", ())] - tokens_before == 6
    # A two-step stream its caller cancels counts once as cancelled.
    before = outcomes(port)
    with Client(cluster.address, timeout_s=120, direct=True) as client:
        stream = client.stream(list(long_request().token_ids.ids), max_new_tokens=LONG,
                               min_new_tokens=LONG, stream_interval_ms=0)
        next(iter(stream))
        stream.cancel()
    assert moved(port, before) == {("direct", "cancelled", "running"): 1}


def test_a_session_turn_counts_once_with_its_prompt_tokens(cluster):
    cluster, _, (port, _) = cluster
    stub = scheduler_stub(cluster.address)
    session = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30)
    try:
        before = outcomes(port)
        tokens_before = samples(f"http://127.0.0.1:{port}/metrics")[
            ("ortserve_scheduler_prompt_tokens_total", ())]
        events = list(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
            session_id=session.session_id, request=types_pb2.GenerateRequest(
                token_ids=types_pb2.TokenIds(ids=[28, 57, 81]), max_new_tokens=4,
                min_new_tokens=4)), timeout=120))
        finished = events[-1].finished
        assert moved(port, before) == {("session_turn", "finished", "length"): 1}
        assert samples(f"http://127.0.0.1:{port}/metrics")[
            ("ortserve_scheduler_prompt_tokens_total", ())] - tokens_before == (
            finished.usage.prompt_tokens)
    finally:
        stub.CloseSession(scheduler_pb2.SessionRequest(session_id=session.session_id), timeout=30)


def test_a_cancelled_stream_counts_once_as_cancelled(cluster):
    cluster, _, (port, _) = cluster
    before = outcomes(port)
    call = scheduler_stub(cluster.address).Generate(long_request(), timeout=120)
    events = iter(call)
    assert next(events).WhichOneof("event") == "admission"
    assert next(events).WhichOneof("event") == "chunk"
    # While it runs: the ratio is GetBudget's reserved / capacity, to the byte.
    budget = scheduler_stub(cluster.address).GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    scheduler = samples(f"http://127.0.0.1:{port}/metrics")
    [worker] = budget.workers
    assert scheduler[("ortserve_scheduler_kv_reserved_ratio",
                      (("model", MODEL), ("worker_id", "worker-0")))] == pytest.approx(
        worker.reserved_bytes / worker.capacity_bytes)
    assert 0 < scheduler[("ortserve_scheduler_total_kv_reserved_ratio", ())] <= 1
    call.cancel()
    assert moved(port, before) == {("generate", "cancelled", "running"): 1}


def test_a_deadline_counts_once_as_deadline(cluster):
    cluster, _, (port, _) = cluster
    before = outcomes(port)
    with pytest.raises(grpc.RpcError) as failed:
        for _ in scheduler_stub(cluster.address).Generate(long_request(), timeout=2.0):
            pass
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    [(key, n)] = moved(port, before).items()
    # Running on an idle machine; on a loaded one the deadline may pass while it is admitted.
    assert key[:2] == ("generate", "deadline") and n == 1


def test_a_rejection_counts_once_with_its_cause(cluster):
    cluster, _, (port, _) = cluster
    before = outcomes(port)
    beyond = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=[28] * 8),
                                       max_new_tokens=BUDGET_TOKENS * 2,
                                       min_new_tokens=BUDGET_TOKENS * 2)
    with pytest.raises(grpc.RpcError) as refused:
        next(iter(scheduler_stub(cluster.address).Generate(beyond, timeout=30)))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert moved(port, before) == {("generate", "rejected", "exceeds_capacity"): 1}


def test_the_gateways_metrics_parse_and_count_routes_and_statuses(cluster):
    _, gateway, _ = cluster
    base = f"http://{gateway.address}"
    before = samples(f"{base}/metrics")
    openai_client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{base}/no/such/path", timeout=5)
    after = samples(f"{base}/metrics")

    def delta(name: str, *labels: tuple[str, str]) -> float:
        key = (name, tuple(sorted(labels)))
        return after.get(key, 0.0) - before.get(key, 0.0)

    chat = (("method", "POST"), ("route", "/v1/chat/completions"))
    assert delta("ortserve_gateway_requests_total", *chat, ("status", "200")) == 1
    assert delta("ortserve_gateway_request_duration_seconds_count", *chat) == 1
    assert delta("ortserve_gateway_requests_total", ("method", "GET"), ("route", "unmatched"),
                 ("status", "404")) == 1
    assert after[("ortserve_gateway_requests_in_flight", (("route", "/v1/chat/completions"),))] == 0
    assert after[("ortserve_gateway_requests_in_flight", (("route", "/metrics"),))] == 1


def test_a_killed_worker_counts_once_as_worker_failed(cluster):
    # Last: the worker does not come back.
    cluster, _, (port, _) = cluster
    before = outcomes(port)
    events = iter(scheduler_stub(cluster.address).Generate(long_request(), timeout=120))
    assert next(events).WhichOneof("event") == "admission"
    assert next(events).WhichOneof("event") == "chunk"
    os.kill(cluster.worker_services[0].process.pid, signal.SIGKILL)
    with pytest.raises(grpc.RpcError) as failed:
        for _ in events:
            pass
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert moved(port, before) == {("generate", "worker_failed", "unavailable"): 1}
