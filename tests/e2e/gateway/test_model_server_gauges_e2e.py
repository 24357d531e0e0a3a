"""The gauges an inference gateway's endpoint picker reads, scraped from real processes as
load moves them: the gateway in front of the worker (--model-server-worker-id, what the
picker scrapes) and the scheduler's /metrics, each equal to GetBudget at each look."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.cluster import stop_service
from ortserve.process import model_server_gauges as g
from ortserve.rules import kv_math
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import require_model, scheduler_stub, start_cluster
from tests.e2e.gateway.test_gateway_e2e import start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BPT, BLOCK = 46_080, 16  # SmolLM2-135M fp32; 4 KiB pages / (64 x 4 bytes)
NEW = 8


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt_ids() -> list[int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(require_model() / "tokenizer.json")).encode(
        "Count from one to ten:").ids


def request(name: str) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(request_id=name, token_ids=types_pb2.TokenIds(ids=prompt_ids()),
                                     max_new_tokens=NEW, min_new_tokens=NEW)


def gauges(address: str) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)
            if f.name.startswith("ortserve_model_server_")}


def wait_until(check, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while not (value := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert value
    return value


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    per_request = kv_math.bytes_for(len(prompt_ids()) + NEW, BPT, BLOCK)
    metrics_port = free_port()
    cluster = start_cluster(tmp_path_factory, "gauges",
                            kv_capacities=[str(2 * per_request + per_request // 2)],
                            scheduler_args=["--metrics-port", str(metrics_port),
                                            "--claim-ttl-s", "600"])
    stub = scheduler_stub(cluster.address)
    worker_id = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).workers[0].worker_id
    gateway = start_gateway(tmp_path_factory, cluster.address,
                            ("--model-server-worker-id", worker_id))
    yield cluster, stub, gateway, f"127.0.0.1:{metrics_port}", per_request
    stop_service(gateway)
    cluster.stop()


def look(stub, gateway, scheduler_metrics) -> tuple[scheduler_pb2.WorkerBudget, dict]:
    """GetBudget, then both scrapes, then GetBudget again: the scrapes must equal the ledger
    whenever it did not move in between (the test moves it only between looks)."""
    before = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    picker, scheduler = gauges(gateway.address), gauges(scheduler_metrics)
    after = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    (w,) = before.workers
    assert (w.reserved_bytes, w.lease_count, before.models[0].queue_length) == (
        after.workers[0].reserved_bytes, after.workers[0].lease_count, after.models[0].queue_length)
    for seen in (picker, scheduler):
        (waiting,), (running,), (utilization,) = (seen[g.WAITING], seen[g.RUNNING],
                                                  seen[g.KV_UTILIZATION])
        assert waiting.labels == {"worker_id": w.worker_id, "model": w.model}
        assert waiting.value == before.models[0].queue_length
        assert running.value == w.lease_count
        assert utilization.value == w.reserved_bytes / w.capacity_bytes
        (cache,) = seen[g.CACHE_INFO]
        assert (cache.labels["block_size"], cache.labels["num_gpu_blocks"]) == (
            str(BLOCK), str(w.capacity_bytes // (BPT * BLOCK)))
    return w, picker


def test_gauges_follow_admissions_the_queue_and_releases(served):
    cluster, stub, gateway, scheduler_metrics, per_request = served
    w, seen = look(stub, gateway, scheduler_metrics)
    assert (w.lease_count, w.reserved_bytes, seen[g.WAITING][0].value) == (0, 0, 0)

    # Two admissions the test holds (Admit: the two-step path's lease, not yet claimed).
    held = [stub.Admit(scheduler_pb2.AdmitRequest(request=request(f"held{i}")), timeout=30)
            for i in range(2)]
    assert all(a.decision == types_pb2.ADMITTED for a in held)
    w, seen = look(stub, gateway, scheduler_metrics)
    assert w.lease_count == 2 and w.reserved_bytes == 2 * per_request
    assert seen[g.KV_UTILIZATION][0].value == 2 * per_request / w.capacity_bytes

    # A third request cannot start: it waits in the admission queue (for this model).
    done: list = []
    waiter = threading.Thread(target=lambda: done.extend(stub.Generate(request("queued"),
                                                                         timeout=300)))
    waiter.start()
    wait_until(lambda: stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).queue_length == 1)
    w, seen = look(stub, gateway, scheduler_metrics)
    assert seen[g.WAITING][0].value == 1 and w.lease_count == 2

    # One release: the queued request is admitted, runs and ends; then the other release.
    stub.Release(scheduler_pb2.ReleaseRequest(lease_id=held[0].lease_id,
                                              lease_secret=held[0].lease_secret), timeout=10)
    waiter.join(300)
    assert done[-1].finished.usage.generated_tokens == NEW
    # Its lease is released once the worker freed its KV, just after the last event.
    wait_until(lambda: stub.GetBudget(scheduler_pb2.GetBudgetRequest(),
                                      timeout=5).workers[0].lease_count == 1)
    w, seen = look(stub, gateway, scheduler_metrics)
    assert seen[g.WAITING][0].value == 0 and w.lease_count == 1
    assert w.reserved_bytes == per_request
    stub.Release(scheduler_pb2.ReleaseRequest(lease_id=held[1].lease_id,
                                              lease_secret=held[1].lease_secret), timeout=10)
    w, seen = look(stub, gateway, scheduler_metrics)
    assert (w.lease_count, w.reserved_bytes, seen[g.KV_UTILIZATION][0].value) == (0, 0, 0.0)


def both_placeable(cluster) -> None:
    """Wait until the ledger may place on both workers: on a loaded machine a worker slow to
    answer a call and its health check is passed over until its next heartbeat
    (worker_patience), and "the most free bytes" is then the other's."""
    stub = scheduler_stub(cluster.address)

    def placeable() -> int:
        workers = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).workers
        return len([w for w in workers if not (w.unreachable or w.draining)])

    wait_until(lambda: placeable() == 2)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    """Two workers, the first with more free bytes (the ledger's own pick), and a gateway
    in front of each (what an inference gateway's pod runs)."""
    # No prefix cache: a cached prefix outranks free bytes in the ledger's own pick (the
    # chat template's first block is every chat prompt's), and which worker's cache report
    # the scheduler has heard depends on heartbeat timing: the ledger's pick would not be
    # "the most free bytes" alone.
    cluster = start_cluster(tmp_path_factory, "preferred", workers=2,
                            kv_capacities=["256MiB", "128MiB"],
                            worker_args=["--prefix-cache-bytes", "0"])
    ids = sorted((w.capacity_bytes, w.worker_id) for w in scheduler_stub(cluster.address).GetBudget(
        scheduler_pb2.GetBudgetRequest(), timeout=5).workers)
    small, big = ids[0][1], ids[1][1]
    gateways = {wid: start_gateway(tmp_path_factory, cluster.address,
                                   ("--model-server-worker-id", wid)) for wid in (small, big)}
    plain = start_gateway(tmp_path_factory, cluster.address)
    yield cluster, small, big, gateways, plain
    for service in (*gateways.values(), plain):
        stop_service(service)
    cluster.stop()


def test_a_pods_gateway_asks_for_its_own_worker_and_gets_it_while_it_fits(two_workers):
    import openai

    cluster, small, big, gateways, plain = two_workers

    def served_by(gateway) -> str:
        client = openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused",
                               timeout=120, max_retries=0)
        answer = client.completions.create(model="smollm2-135m-instruct-fp32", prompt="Hello",
                                           max_tokens=2)
        return answer.model_extra["ortserve"]["worker_id"]

    both_placeable(cluster)
    assert served_by(plain) == big  # the ledger alone: the most free bytes
    assert served_by(gateways[small]) == small  # the picker chose small's pod: small serves
    assert served_by(gateways[big]) == big
    (picker_view,) = gauges(gateways[small].address)[g.RUNNING]
    assert picker_view.labels["worker_id"] == small


ASK = [{"role": "user", "content": "Hello"}]
# Every API that generates, and a body asking for two tokens: each carries the pod's hint
# (a stored response's session too: it opens on the pod's worker).
API_BODIES = {
    "chat": ("/v1/chat/completions", {"messages": ASK, "max_tokens": 2}),
    "responses": ("/v1/responses", {"input": "Hello", "max_output_tokens": 2, "store": False}),
    "stored response": ("/v1/responses", {"input": "Hello", "max_output_tokens": 2}),
    "messages": ("/v1/messages", {"messages": ASK, "max_tokens": 2}),
}


@pytest.mark.parametrize("api", sorted(API_BODIES))
def test_every_api_carries_the_pods_placement_hint(two_workers, api):
    import json

    cluster, small, big, gateways, plain = two_workers

    def served_by(gateway) -> str:
        path, asked = API_BODIES[api]
        body = {"model": "smollm2-135m-instruct-fp32", **asked}
        request = urllib.request.Request(f"http://{gateway.address}{path}", method="POST",
                                         data=json.dumps(body).encode(),
                                         headers={"content-type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as reply:
            return json.loads(reply.read())["ortserve"]["worker_id"]

    both_placeable(cluster)
    assert served_by(plain) == big  # the ledger alone: the most free bytes
    assert served_by(gateways[small]) == small  # small's pod: small serves, whichever API

