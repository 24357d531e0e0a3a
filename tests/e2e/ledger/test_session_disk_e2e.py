"""Sessions that outlive their worker (issue 55): the disk tier through real processes.

A scheduler and one CPU worker with --session-dir. A session idle past
--session-disk-after-s is written to disk (GetBudget shows its disk bytes apart
from the KV capacity); the worker is killed (SIGKILL: nothing flushed at exit)
or stopped cleanly, started again on the same folder, and the next turn
continues from the file: it reuses the history's K/V and its tokens are
bit-identical to a fresh run of the whole conversation (which equals an
uninterrupted session's turn: test_sessions_e2e). A corrupted file is refused
by name on the worker's stderr and in a metric, set aside, and the turn
re-prefills the history: same tokens, nothing reused.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from devtools.cluster import LocalCluster, wait_serving
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import BIN, scheduler_stub
from tests.e2e.ledger.test_sessions_e2e import chat, generate, get, open_session, session_turn
from tests.models import prepared_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

Q1 = "What is the capital of France? Answer in one sentence."
Q2 = "And what is the capital of Italy?"
SAMPLED = types_pb2.SamplingParams(temperature=1.0, seed=11)  # any logit change shows


def _models() -> list[str]:
    names = ["tiny-llama"]
    if os.environ.get("ORTSERVE_E2E_INT4", "1") != "0":
        names.append("smollm2-135m-instruct-int4")
    return names


@pytest.fixture(scope="module", params=_models())
def disk_cluster(request, tmp_path_factory):
    model = prepared_model_dir(request.param)
    folder = tmp_path_factory.mktemp(f"sessions-{request.param}")
    log_dir = tmp_path_factory.mktemp(f"logs-disk-{request.param}")
    worker_args = ["--session-dir", str(folder), "--session-disk-after-s", "0.3",
                   "--metrics-port", "0"]
    cluster = LocalCluster(model_dir=model, log_dir=log_dir, kv_capacities=["64MiB"],
                           worker_args=worker_args,
                           scheduler_args=["--heartbeat-interval-s", "0.5"]).start()
    cluster.session_dir = folder
    yield cluster
    cluster.stop()


def wait_state(stub, session_id: str, state, timeout_s: float = 60.0) -> types_pb2.SessionInfo:
    """Until the session is in `state` and, on disk, the ledger shrank its lease (the worker
    writes the file and frees first, then shrinks: never the other way round)."""
    def done(info) -> bool:
        return info.state == state and (state != types_pb2.SESSION_ON_DISK
                                        or info.reserved_bytes == 0)

    deadline = time.monotonic() + timeout_s
    info = get(stub, session_id)
    while not done(info) and time.monotonic() < deadline:
        time.sleep(0.05)
        info = get(stub, session_id)
    assert done(info), info
    return info


def restart_worker(cluster: LocalCluster, how: str) -> None:
    """Stop the worker (SIGKILL or SIGTERM) and start it again on the same port, id and
    --session-dir; return once it serves (registered, its sessions with it)."""
    old = cluster.worker_services[0]
    port = old.address.rsplit(":", 1)[1]
    if how == "kill":
        old.process.kill()
    else:
        old.process.terminate()
    old.process.wait(60)
    cluster.services.remove(old)
    wait_serving(cluster.start_worker(0, ["--port", port]), "ortserve.v1.Worker")


def worker_log(cluster: LocalCluster) -> str:
    return cluster.worker_services[0].log_path.read_text(errors="replace")


def rejected_metric(cluster: LocalCluster, reason: str) -> float:
    lines = [json.loads(line) for line in worker_log(cluster).splitlines() if line.startswith("{")]
    found = [line["address"] for line in lines if line.get("event") == "metrics serving"]
    assert found, "the worker did not say where its metrics serve"
    text = urllib.request.urlopen(f"http://{found[-1]}/metrics", timeout=10).read().decode()
    line = re.search(rf'ortserve_worker_session_files_rejected_total{{reason="{reason}"}} (\S+)',
                     text)
    return float(line.group(1)) if line else 0.0


def test_a_session_on_disk_survives_a_killed_worker_with_identical_tokens(disk_cluster):
    stub = scheduler_stub(disk_cluster.address)
    fields = dict(max_new_tokens=24, sampling=SAMPLED)
    # The reference: the same conversation's turn 2 with no restart.
    ref = open_session(stub).session_id
    _, _, ref_ids1, _ = session_turn(stub, ref, Q1, **fields)
    _, _, ref_ids2, _ = session_turn(stub, ref, Q2, **fields)
    stub.CloseSession(scheduler_pb2.SessionRequest(session_id=ref), timeout=30)

    sid = open_session(stub).session_id
    _, f1, ids1, text1 = session_turn(stub, sid, Q1, **fields)
    assert ids1 == ref_ids1
    parked = wait_state(stub, sid, types_pb2.SESSION_ON_DISK)
    assert parked.held_tokens == f1.session.held_tokens and parked.disk_bytes > 0
    assert parked.reserved_bytes == 0 and parked.held_bytes == 0
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert budget.workers[0].disk_bytes == budget.total_disk_bytes == parked.disk_bytes
    assert budget.total_reserved_bytes == 0  # disk bytes never count against capacity
    assert len(list(Path(disk_cluster.session_dir).glob("*.session"))) == 1
    cli = [str(BIN / "ortserve"), "--address", disk_cluster.address, "budget"]
    as_json = json.loads(subprocess.run([*cli, "--json"], capture_output=True, text=True,
                                        timeout=60, check=True).stdout)
    assert int(as_json["workers"][0]["disk_bytes"]) == parked.disk_bytes
    assert int(as_json["total_disk_bytes"]) == parked.disk_bytes
    header, row = subprocess.run(cli, capture_output=True, text=True, timeout=60,
                                 check=True).stdout.splitlines()[:2]
    assert header.split()[5:7] == ["host", "disk"] and row.split()[0] == "worker-0"

    restart_worker(disk_cluster, "kill")
    restored = get(stub, sid)
    assert restored.state == types_pb2.SESSION_ON_DISK
    assert restored.held_tokens == f1.session.held_tokens and restored.turns == 1
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(include_leases=True), timeout=5)
    assert budget.total_disk_bytes == parked.disk_bytes and budget.total_reserved_bytes == 0
    assert "session restored from the disk tier" in worker_log(disk_cluster)

    _, f2, ids2, _ = session_turn(stub, sid, Q2, **fields)
    assert f2.usage.reused_prompt_tokens >= f1.usage.prompt_tokens  # the file's K/V, reused
    assert ids2 == ref_ids2  # exactly as it would have been without the restart
    if disk_cluster.model_dir.name == "tiny-llama":
        # fp32 on the CPU: reuse equals prefilling everything again, bit for bit (int4's
        # MatMulNBits is not: its reference is the uninterrupted session alone).
        _, fresh, fresh_ids = generate(stub, chat(("user", Q1), ("assistant", text1),
                                                  ("user", Q2)), **fields)
        assert fresh.usage.prompt_tokens == f2.usage.prompt_tokens and ids2 == fresh_ids
    # After the turn: resident again, its file read and deleted (it goes back to disk once
    # idle again, with both turns: the next wait_state).
    assert f2.session.state == types_pb2.SESSION_RESIDENT and f2.session.disk_bytes == 0

    # A clean stop keeps it too: parked again, SIGTERM, started again, turn 3 reuses it.
    again = wait_state(stub, sid, types_pb2.SESSION_ON_DISK)
    assert again.held_tokens == f2.session.held_tokens and again.disk_bytes > parked.disk_bytes
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert budget.total_disk_bytes == again.disk_bytes  # the old file's bytes gone exactly
    restart_worker(disk_cluster, "term")
    _, f3, _, _ = session_turn(stub, sid, "And of Spain?", **fields)
    assert f3.usage.reused_prompt_tokens >= f2.usage.prompt_tokens
    closed = stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    assert closed.closed
    budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert budget.total_reserved_bytes == 0 and budget.total_disk_bytes == 0


def test_a_corrupt_file_is_refused_by_name_set_aside_and_the_turn_re_prefilled(disk_cluster):
    stub = scheduler_stub(disk_cluster.address)
    fields = dict(max_new_tokens=24, sampling=SAMPLED)
    sid = open_session(stub).session_id
    _, f1, _, text1 = session_turn(stub, sid, Q1, **fields)
    wait_state(stub, sid, types_pb2.SESSION_ON_DISK)
    (path,) = Path(disk_cluster.session_dir).glob("*.session")
    before = rejected_metric(disk_cluster, "corrupt")
    disk_cluster.worker_services[0].process.kill()
    data = bytearray(path.read_bytes())
    data[-11] ^= 0x10  # one bit of the K/V payload
    path.write_bytes(bytes(data))
    restart_worker(disk_cluster, "kill")

    log = worker_log(disk_cluster)
    assert "session file refused at start-up" in log and path.name in log and "corrupt" in log
    assert path.with_name(path.name + ".rejected").exists() and not path.exists()
    assert rejected_metric(disk_cluster, "corrupt") == 1.0 and before == 0.0
    info = get(stub, sid)
    assert info.state == types_pb2.SESSION_EMPTY and info.turns == 1  # never silently lost

    _, f2, ids2, _ = session_turn(stub, sid, Q2, **fields)
    assert f2.usage.reused_prompt_tokens == 0  # re-prefilled from its history
    _, _, fresh_ids = generate(stub, chat(("user", Q1), ("assistant", text1), ("user", Q2)),
                               **fields)
    assert ids2 == fresh_ids
    stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)


def test_a_clean_stop_writes_sessions_still_in_memory(tmp_path_factory):
    """SIGTERM with the idle bound far away: the drain writes the resident session to disk,
    and the worker started again on the folder continues it on its K/V."""
    folder = tmp_path_factory.mktemp("sessions-stop")
    cluster = LocalCluster(model_dir=prepared_model_dir("tiny-llama"),
                           log_dir=tmp_path_factory.mktemp("logs-disk-stop"),
                           kv_capacities=["64MiB"],
                           worker_args=["--session-dir", str(folder),
                                        "--session-disk-after-s", "3600"]).start()
    try:
        stub = scheduler_stub(cluster.address)
        fields = dict(max_new_tokens=16, sampling=SAMPLED)
        sid = open_session(stub).session_id
        _, f1, _, _ = session_turn(stub, sid, Q1, **fields)
        assert get(stub, sid).state == types_pb2.SESSION_RESIDENT
        assert not list(folder.glob("*.session"))
        restart_worker(cluster, "term")
        assert len(list(folder.glob("*.session"))) == 1
        assert get(stub, sid).state == types_pb2.SESSION_ON_DISK
        _, f2, _, _ = session_turn(stub, sid, Q2, **fields)
        assert f2.usage.reused_prompt_tokens >= f1.usage.prompt_tokens
    finally:
        cluster.stop()
