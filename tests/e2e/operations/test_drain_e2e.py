"""Graceful drain through real processes: SIGTERM to a worker mid-stream."""

from __future__ import annotations

import signal
import threading
import time

from ortserve_client import Client

from ortserve.rpc.probe import check
from ortserve.v1 import scheduler_pb2
from tests.e2e.conftest import reserved_bytes, scheduler_stub, start_cluster

FRANCE = "What is the capital of France? Answer in one sentence."


def test_sigterm_lets_the_live_stream_finish_and_the_next_request_goes_elsewhere(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "drain", workers=2, kv_capacities=["256MiB", "256MiB"])
    try:
        with Client(cluster.address, timeout_s=120) as client:
            stream = client.stream(chat=[("user", "Tell me a long story about a dragon.")],
                                   max_new_tokens=120, min_new_tokens=120)
            chunks = iter(stream)
            next(chunks)  # running
            victim = next(w for w in cluster.worker_services
                          if w.name == stream.admission.worker_id)
            statuses: list[str] = []

            def watch_health():
                while victim.process.poll() is None:
                    statuses.append(check(victim.address, "ortserve.v1.Worker", timeout_s=1.0))
                    time.sleep(0.02)

            watcher = threading.Thread(target=watch_health)
            victim.process.send_signal(signal.SIGTERM)
            watcher.start()
            rest = list(chunks)
            result = stream.result
            assert result.usage.generated_tokens == 120  # the live stream ran to completion
            assert rest
            # The next request is placed on the other worker, without an error.
            budget = scheduler_stub(cluster.address).GetBudget(scheduler_pb2.GetBudgetRequest(),
                                                               timeout=5)
            draining = {w.worker_id for w in budget.workers if w.draining}
            assert draining in (set(), {stream.admission.worker_id})
            after = client.generate(chat=[("user", FRANCE)], max_new_tokens=8)
            assert after.worker_id != stream.admission.worker_id
        victim.process.wait(60)
        watcher.join(10)
        assert victim.process.returncode == 0
        # Health said NOT_SERVING while the port was still open, before it closed.
        assert "NOT_SERVING" in statuses
        closed = [i for i, s in enumerate(statuses) if s not in ("SERVING", "NOT_SERVING")]
        assert not closed or statuses.index("NOT_SERVING") < closed[0]
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and reserved_bytes(cluster.address):
            time.sleep(0.1)
        assert reserved_bytes(cluster.address) == 0
    finally:
        cluster.stop()
