"""A worker failing mid-stream (stopped, killed) carries its ErrorInfo on every path:
gRPC relayed and two-step direct, the gateway relayed and direct (docs/errors.md: reason
WORKER_FAILED with the worker, its address and the tokens already sent; docs/gateway.md:
503 `worker_failed`). Real processes on the default model (slow enough on a CPU that a
1,000-token answer is still running when its worker is stopped or killed).
"""

from __future__ import annotations

import signal
import threading
import time

import openai
import pytest
from ortserve_client import Client, GenerationFailed
from ortserve_client.errors import NoWorker

from devtools.cluster import stop_service, wait_serving
from tests.e2e.conftest import reserved_bytes, start_cluster, worker_held_bytes
from tests.e2e.gateway.test_gateway_e2e import MODEL, openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

ESSAY = "Write a long, detailed essay about the history of the Roman Empire."
LONG = {"max_new_tokens": 1000, "min_new_tokens": 1000}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Pings every second: a stopped worker fails its streams in seconds, not at a deadline.
    cluster = start_cluster(tmp_path_factory, "worker-failed", kv_capacities=["512MiB"],
                            scheduler_args=["--worker-keepalive-s", "1", "--lease-ttl-s", "3"])
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateways(cluster, tmp_path_factory):
    relayed = start_gateway(tmp_path_factory, cluster.address)
    direct = start_gateway(tmp_path_factory, cluster.address, ("--direct-to-workers",))
    yield {"relayed": relayed, "direct": direct}
    stop_service(relayed)
    stop_service(direct)


def worker(cluster):
    return cluster.worker_services[0]


def fail_worker(cluster, how: str) -> None:
    """SIGSTOP (resumed by recover) or SIGKILL (restarted by recover) the one worker."""
    worker(cluster).process.send_signal(signal.SIGSTOP if how == "stopped" else signal.SIGKILL)


def recover(cluster, how: str) -> None:
    service = worker(cluster)
    if how == "stopped":
        service.process.send_signal(signal.SIGCONT)
    else:
        service.process.wait(10)
        port = service.address.rsplit(":", 1)[1]
        cluster.services.remove(service)
        wait_serving(cluster.start_worker(0, ["--port", port]), "ortserve.v1.Worker")
    # A resumed worker still runs the sequence whose caller is gone, until its pings find
    # that caller gone (~20 s, keepalive.py); the ledger dropped the lease when the worker
    # went silent and takes it back when the worker re-registers. So: wait for the worker
    # to hold nothing (it frees before it releases), then for the ledger to charge nothing.
    # The ledger alone can read 0 in the moment before the re-registration restores it.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if worker_held_bytes(worker(cluster).address) == 0 and reserved_bytes(cluster.address) == 0:
            break
        time.sleep(0.1)
    assert worker_held_bytes(worker(cluster).address) == 0
    assert reserved_bytes(cluster.address) == 0
    # Back means serving: the scheduler replaces a channel backing off from the dead worker
    # when the restarted one registers, but a caller's own channel (the direct path's) may
    # still be in its reconnect backoff.
    deadline = time.monotonic() + 60
    with Client(cluster.address, timeout_s=10) as client:
        while True:
            try:
                client.generate("hi", max_new_tokens=1)
                return
            except (GenerationFailed, NoWorker):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)


def assert_worker_failed(info: dict, cluster, tokens_at_least: int) -> None:
    """`to_dict()` of the client's error, or the gateway's `ortserve` object."""
    assert info["reason"] == "WORKER_FAILED", info
    metadata = info["metadata"]
    assert metadata["worker_id"] == "worker-0"
    assert metadata["worker_address"] == worker(cluster).address
    assert int(metadata["tokens_sent"]) >= tokens_at_least


@pytest.mark.parametrize("how", ["stopped", "killed"])
@pytest.mark.parametrize("direct", [False, True], ids=["relayed", "direct"])
def test_a_grpc_stream_whose_worker_fails_carries_worker_failed(cluster, how, direct):
    with Client(cluster.address, timeout_s=120, direct=direct) as client:
        stream = iter(client.stream(ESSAY, stream_interval_ms=0, **LONG))
        received = sum(len(next(stream).token_ids) for _ in range(2))  # it is generating
        fail_worker(cluster, how)
        try:
            with pytest.raises(GenerationFailed) as failure:
                for _ in stream:
                    pass
        finally:
            recover(cluster, how)
    error = failure.value
    assert error.code.name == "UNAVAILABLE", error
    assert_worker_failed(error.to_dict(), cluster, received)
    assert "worker worker-0 at" in error.message and "failed after" in error.message


@pytest.mark.parametrize("how", ["stopped", "killed"])
@pytest.mark.parametrize("path", ["relayed", "direct"])
def test_the_gateway_answers_worker_failed(cluster, gateways, how, path):
    client = openai_client(gateways[path], max_retries=0)
    result: dict = {}

    def chat() -> None:
        try:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ESSAY}],
                                           max_tokens=1000, extra_body={"min_tokens": 1000})
        except openai.APIStatusError as error:
            result["error"] = error

    thread = threading.Thread(target=chat)
    thread.start()
    deadline = time.monotonic() + 60
    while not worker_held_bytes(worker(cluster).address) and time.monotonic() < deadline:
        time.sleep(0.02)  # until its KV is held: the worker is generating
    fail_worker(cluster, how)
    try:
        thread.join(60)
    finally:
        recover(cluster, how)
    error = result["error"]
    assert error.status_code == 503, error.body
    assert error.body["code"] == "worker_failed", error.body
    assert_worker_failed(error.body["ortserve"], cluster, 0)
