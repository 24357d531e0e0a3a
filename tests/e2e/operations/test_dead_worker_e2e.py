"""A worker killed while still registered (its lease TTL not yet run out) gets no more
requests: the first call that cannot reach it marks it unreachable and places that request
once more on the other worker, so the requests right after the kill all succeed there
(docs/errors.md, WORKER_FAILED): through the scheduler's relay, and through the gateway's
direct path (which hands such a request to the relay once). Real processes: a scheduler
and two CPU workers, a new pair for each path.
"""

from __future__ import annotations

import signal
import time

import pytest
from ortserve_client import Client

from devtools.cluster import stop_service
from tests.e2e.conftest import reserved_bytes, start_cluster
from tests.e2e.gateway.test_gateway_e2e import MODEL, openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture()
def cluster(tmp_path_factory):
    # A long TTL: the killed worker stays registered for the whole test.
    cluster = start_cluster(tmp_path_factory, "dead-worker", workers=2,
                            kv_capacities=["256MiB", "256MiB"],
                            scheduler_args=["--lease-ttl-s", "600"])
    yield cluster
    cluster.stop()


def kill_the_first_choice(cluster) -> None:
    """SIGKILL worker-1: of equal, equally idle workers placement's last tie-break picks it."""
    dead = next(s for s in cluster.worker_services if s.name == "worker-1")
    dead.process.send_signal(signal.SIGKILL)
    dead.process.wait(10)


def assert_ledger_at_zero(cluster) -> None:
    deadline = time.monotonic() + 30
    while reserved_bytes(cluster.address) and time.monotonic() < deadline:
        time.sleep(0.1)  # the live worker releases its claimed leases as it finishes
    assert reserved_bytes(cluster.address) == 0


def test_requests_after_a_worker_is_killed_all_succeed_on_the_other(cluster, tmp_path_factory):
    gateway = start_gateway(tmp_path_factory, cluster.address)
    try:
        kill_the_first_choice(cluster)
        served = []
        with Client(cluster.address, timeout_s=120) as client:
            for i in range(4):
                result = client.generate(f"Count to {i + 3}.", max_new_tokens=4)
                served.append((result.worker_id, result.admission.worker_id))
        chat = openai_client(gateway, max_retries=0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4)
        assert chat.model_extra["ortserve"]["worker_id"] == "worker-0"
        assert served == [("worker-0", "worker-0")] * 4  # its Admission names the one serving it
        assert_ledger_at_zero(cluster)
    finally:
        stop_service(gateway)


def test_the_gateways_direct_path_hands_an_unreached_worker_to_the_relay(cluster,
                                                                        tmp_path_factory):
    gateway = start_gateway(tmp_path_factory, cluster.address, ("--direct-to-workers",))
    try:
        kill_the_first_choice(cluster)
        client = openai_client(gateway, max_retries=0)
        served = [client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Count to {i + 3}."}],
            max_tokens=4).model_extra["ortserve"]["worker_id"] for i in range(3)]
        assert served == ["worker-0"] * 3
        assert_ledger_at_zero(cluster)
    finally:
        stop_service(gateway)
