"""One ledger per port: a second process on a port ortserve already listens on is refused
at start-up (exit 2, one line naming the port and its holder), and the first keeps serving."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devtools.cluster import start_service, stop_service, wait_serving
from ortserve.v1 import scheduler_pb2
from tests.e2e.conftest import BIN, scheduler_stub
from tests.models import prepared_model_dir


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    service = start_service("scheduler", [str(BIN / "ortserve-scheduler"), "--host", "127.0.0.1",
                                          "--port", "0", "--internal-port", "0"],
                            tmp_path_factory.mktemp("logs-ports"))
    wait_serving(service)
    words = service.banner.split()
    yield service, int(service.address.rsplit(":", 1)[1]), int(words[words.index("internal") + 1]
                                                               .rsplit(":", 1)[1])
    assert stop_service(service) == 0


def refused(argv: list[str]) -> str:
    """Run a process that must refuse its port; return its one stderr line."""
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                         stdin=subprocess.DEVNULL)
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr[-3000:])
    assert "Traceback" not in out.stderr and "listening" not in out.stdout  # no banner, either form
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    return lines[0]


def assert_still_serving(service, port: int, registered_workers: int = 0) -> None:
    assert service.process.poll() is None
    for _ in range(8):  # fresh channels: were the port shared, some would reach the other
        budget = scheduler_stub(f"127.0.0.1:{port}").GetBudget(scheduler_pb2.GetBudgetRequest(),
                                                               timeout=5)
        assert len(budget.workers) == registered_workers


@pytest.mark.parametrize("flag", ["--port", "--internal-port"])
def test_a_second_scheduler_on_a_used_port_exits_2_naming_the_port_and_its_holder(scheduler, flag):
    service, port, internal_port = scheduler
    taken = port if flag == "--port" else internal_port
    other = ["--internal-port", "0"] if flag == "--port" else ["--port", "0"]
    line = refused([str(BIN / "ortserve-scheduler"), "--host", "127.0.0.1", flag, str(taken),
                    *other])
    assert f"{flag} {taken}" in line and "already in use" in line
    assert f"pid {service.process.pid} (ortserve-scheduler" in line
    assert_still_serving(service, port)


def test_a_worker_on_the_schedulers_port_exits_2_and_never_registers(scheduler):
    service, port, internal_port = scheduler
    line = refused([sys.executable, "-m", "worker_service",
                    "--model-dir", str(prepared_model_dir("tiny-llama")), "--host", "127.0.0.1",
                    "--port", str(port), "--scheduler", f"127.0.0.1:{internal_port}",
                    "--device", "cpu", "--threads", "1"])
    assert f"--port {port}" in line and "already in use" in line
    assert_still_serving(service, port, registered_workers=0)


def test_a_gateway_on_a_used_port_exits_2_naming_the_port(scheduler):
    service, port, _ = scheduler
    line = refused([str(BIN / "ortserve-gateway"), "--host", "127.0.0.1", "--port", str(port),
                    "--scheduler", f"127.0.0.1:{port}", "--no-log-json"])
    assert line.startswith(f"ortserve-gateway: --port {port} (127.0.0.1:{port}) is already in use")
    assert_still_serving(service, port)
