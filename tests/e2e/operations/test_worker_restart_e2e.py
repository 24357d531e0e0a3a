"""A worker stopped cleanly and started again under the same --worker-id, through real
processes: a scheduler and one CPU worker (tiny-llama) with a --session-dir.

After SIGTERM (drain, sessions written to disk, exit) the worker tells the scheduler it is
gone (SchedulerInternal.Deregister): the ledger forgets it and its leases at once. Before,
nothing was said: its leases and sessions stayed in GetBudget, and its restart on another
port was refused WORKER_ID_IN_USE until the lease TTL passed (10 s by default; 120 s here,
so the refusal cannot end by itself while the test runs). The session it saved to disk
comes back with its next registration, and its next turn reuses the file's K/V.
"""

from __future__ import annotations

import time

import grpc
import pytest

from devtools.cluster import LocalCluster, wait_serving
from ortserve.v1 import scheduler_pb2
from tests.e2e.conftest import scheduler_stub
from tests.e2e.ledger.test_sessions_e2e import get, open_session, session_turn
from tests.models import prepared_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

REFUSED = "refused this worker"  # the worker's log line when registration is refused


def budget(stub) -> scheduler_pb2.Budget:
    return stub.GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=True), timeout=10)


def wait_registered_or_refused(cluster: LocalCluster, stub, address: str,
                               timeout_s: float = 120.0) -> scheduler_pb2.Budget:
    """Until the ledger lists the worker at `address` or the worker says it was refused."""
    service = cluster.worker_services[0]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = budget(stub)
        if any(w.address == address for w in now.workers):
            return now
        if REFUSED in service.log_path.read_text(errors="replace"):
            return now
        assert service.process.poll() is None, service.log_tail()
        time.sleep(0.05)
    raise AssertionError(f"the worker neither registered nor was refused in {timeout_s:g} s:\n"
                         f"{service.log_tail()}")


def test_a_cleanly_stopped_worker_restarts_under_its_id_at_once_with_no_stale_leases(
        tmp_path_factory):
    cluster = LocalCluster(model_dir=prepared_model_dir("tiny-llama"),
                           log_dir=tmp_path_factory.mktemp("logs-worker-restart"),
                           kv_capacities=["64MiB"],
                           session_root=tmp_path_factory.mktemp("sessions-restart"),
                           worker_args=["--session-disk-after-s", "3600"],
                           scheduler_args=["--lease-ttl-s", "120",
                                           "--heartbeat-interval-s", "0.5"]).start()
    try:
        stub = scheduler_stub(cluster.address)
        sid = open_session(stub).session_id
        session_turn(stub, sid, "What is the capital of France?", max_new_tokens=12)
        before = budget(stub)
        assert [len(w.leases) for w in before.workers] == [1]  # the session's lease

        old = cluster.worker_services[0]
        old.process.terminate()  # SIGTERM: drain, the session to disk, goodbye, exit
        assert old.process.wait(60) == 0
        # The worker said it was gone before it exited: nothing of it is left to read.
        gone = budget(stub)
        assert not gone.workers, gone
        assert gone.total_leases == gone.total_reserved_bytes == gone.total_disk_bytes == 0
        with pytest.raises(grpc.RpcError) as lost:
            get(stub, sid)
        assert lost.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "--session-dir" in lost.value.details() and "retry then" in lost.value.details()
        scheduler_log = cluster.services[0].log_path.read_text(errors="replace")
        assert "worker deregistered (a clean stop)" in scheduler_log
        assert "lease expired" not in scheduler_log  # released by the goodbye, not the TTL

        cluster.services.remove(old)
        new = cluster.start_worker(0)  # the same id and --session-dir, a new port
        assert new.address != old.address
        now = wait_registered_or_refused(cluster, stub, new.address)
        assert REFUSED not in new.log_path.read_text(errors="replace"), new.log_tail()
        wait_serving(new, "ortserve.v1.Worker")
        [worker] = now.workers
        assert worker.worker_id == "worker-0" and worker.address == new.address
        # Only the session it brought back from disk: 0 KV bytes, its file's disk bytes.
        [lease] = worker.leases
        assert lease.reserved_bytes == 0 and lease.disk_bytes > 0
        assert now.total_reserved_bytes == 0
        _, f2, _, _ = session_turn(stub, sid, "And of Italy?", max_new_tokens=12)
        # The file's K/V reused (the restarted worker's prefix cache starts empty).
        assert f2.usage.reused_prompt_tokens > 0
    finally:
        cluster.stop()
