"""A caller that stops answering (its host lost, its process stopped) is found by the
server's keepalive pings: its call is cancelled and the KV it held is freed in about
twice the ping interval, not when its generation would have ended.

(The callers' side, a worker or a scheduler that stops answering, is in
test_token_path_e2e.py.)
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from devtools.cluster import LocalCluster, model_cache
from ortserve.rpc import keepalive
from tests.e2e.conftest import reserved_bytes, worker_held_bytes

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

# A client that pings nothing itself, so only the server's pings can find it gone.
CLIENT = """
import sys
from ortserve_client import Client
with Client(sys.argv[1], timeout_s=600, keepalive_s=0) as client:
    for i, _ in enumerate(client.stream([1, 2, 3, 4], max_new_tokens=4000, min_new_tokens=4000)):
        if i == 2:
            print("running", flush=True)
"""


@pytest.mark.parametrize("interval_s", [keepalive.DEFAULT_INTERVAL_S, 2.0])
def test_a_stopped_client_has_its_stream_cancelled_and_the_kv_freed(tmp_path_factory, interval_s):
    # SmolLM2 at ~25 tokens/s: 4,000 tokens would hold the KV for minutes. At 2 s the
    # worker's --caller-keepalive-s must reach its server: the default's ~20 s would pass
    # the limit below.
    model_dir = model_cache() / "models" / "smollm2-135m-instruct-fp32"
    flag = [] if interval_s == keepalive.DEFAULT_INTERVAL_S else [
        "--caller-keepalive-s", f"{interval_s:g}"]
    cluster = LocalCluster(model_dir=model_dir, workers=1, kv_capacities=["1GiB"],
                           worker_args=flag,
                           log_dir=tmp_path_factory.mktemp("logs-client-stopped")).start()
    client = subprocess.Popen([sys.executable, "-c", CLIENT, cluster.address],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "running"
        worker = cluster.worker_services[0].address
        assert worker_held_bytes(worker) > 0 and reserved_bytes(cluster.address) > 0
        client.send_signal(signal.SIGSTOP)
        stopped = time.perf_counter()
        limit_s = 4 * interval_s + 10
        while ((worker_held_bytes(worker) or reserved_bytes(cluster.address))
               and time.perf_counter() - stopped < limit_s):
            time.sleep(0.1)
        freed_s = time.perf_counter() - stopped
        print(f"client stopped -> its KV freed and its lease released: {freed_s:.1f} s")
        assert worker_held_bytes(worker) == 0
        assert reserved_bytes(cluster.address) == 0
    finally:
        client.kill()  # SIGKILL ends a stopped process too
        client.wait(10)
        cluster.stop()
