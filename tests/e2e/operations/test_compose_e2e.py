"""compose.yaml: valid for docker-compose, and its services run as it says (as local processes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from ortserve_client import Client

from devtools.cluster import Service, start_service, stop_service, wait_serving
from scheduler_service.config import SchedulerConfig
from tests.e2e.conftest import BIN, ROOT, require_model, reserved_bytes
from worker_service.config import WorkerConfig

COMPOSE = ROOT / "compose.yaml"


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_compose_file_is_valid_for_docker_compose():
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose is not installed (.ci/run installs Debian's docker-compose)")
    for profile in ("gpu", "cpu"):
        result = subprocess.run([tool, "-f", str(COMPOSE), "--profile", profile, "config", "-q"],
                                capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert result.returncode == 0, result.stderr
    # The optional TLS profile merges over the base file, for every service it names.
    result = subprocess.run([tool, "-f", str(COMPOSE), "-f", str(ROOT / "compose.tls.yaml"),
                             "--profile", "cpu", "--profile", "gpu", "config"],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    merged = yaml.safe_load(result.stdout)["services"]
    assert merged["scheduler"]["environment"]["ORTSERVE_SCHEDULER_TLS_CA"] == "/secrets/ca.pem"
    assert merged["gateway"]["environment"]["ORTSERVE_GATEWAY_CACERT"] == "/secrets/ca.pem"
    assert merged["gateway"]["environment"]["ORTSERVE_GATEWAY_TLS_CERT"] == "/secrets/gateway.pem"
    assert "https://127.0.0.1:8000/health" in merged["gateway"]["healthcheck"]["test"]
    assert merged["gateway"]["environment"]["ORTSERVE_SCHEDULER_ADDRESS"] == "scheduler:50051"
    for worker in ("worker", "worker-cpu"):
        env = merged[worker]["environment"]
        assert env["ORTSERVE_WORKER_TLS_CERT"] == "/secrets/worker.pem"
        assert env["ORTSERVE_SCHEDULER_ADDRESS"] == "scheduler:50061"  # the base's, kept
    # The seed file replaces `model`'s preparation with a copy from the host cache.
    result = subprocess.run([tool, "-f", str(COMPOSE), "-f", str(ROOT / "compose.seed.yaml"),
                             "--profile", "cpu", "config"], capture_output=True, text=True, cwd=ROOT,
                            timeout=60, env={**os.environ, "ORTSERVE_MODEL_CACHE": "/host/cache"})
    assert result.returncode == 0, result.stderr
    model = yaml.safe_load(result.stdout)["services"]["model"]
    assert model["image"] == "ortserve:scheduler" and model["build"]["target"] == "scheduler"
    assert "/host/cache/models:/seed:ro" in model["volumes"]
    assert "cp -r" in model["command"][-1]
    without = subprocess.run([tool, "-f", str(COMPOSE), "-f", str(ROOT / "compose.seed.yaml"), "config"],
                             capture_output=True, text=True, cwd=ROOT, timeout=60,
                             env={k: v for k, v in os.environ.items() if k != "ORTSERVE_MODEL_CACHE"})
    assert without.returncode != 0 and "set ORTSERVE_MODEL_CACHE" in without.stderr


def test_compose_describes_the_topology():
    spec = compose()
    services = spec["services"]
    assert {"model", "scheduler", "worker", "worker-cpu"} <= set(services)
    gpu = services["worker"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and "gpu" in gpu["capabilities"]
    for name in ("worker", "worker-cpu"):
        worker = services[name]
        assert worker["depends_on"]["scheduler"]["condition"] == "service_healthy"
        assert worker["depends_on"]["model"]["condition"] == "service_completed_successfully"
        assert "ortserve-probe" in worker["healthcheck"]["test"]
        assert "models:/models:ro" in worker["volumes"]
        assert "ports" not in worker  # scaled workers must not fight over a host port
        # `stop` must outlast the drain, or the engine's SIGKILL cuts live streams
        assert int(worker["stop_grace_period"].rstrip("s")) > WorkerConfig.drain_timeout_s
    assert services["worker-cpu"]["profiles"] == ["cpu"]
    assert "ortserve-probe" in services["scheduler"]["healthcheck"]["test"]
    assert services["scheduler"]["ports"]
    assert int(services["scheduler"]["stop_grace_period"].rstrip("s")) > SchedulerConfig.drain_timeout_s


def _as_local(service: dict, overrides: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The service's command and environment, with ports and paths remapped for this machine."""
    command = list(service["command"])
    command[0] = str(BIN / command[0])
    env = {k: str(v) for k, v in service["environment"].items()}
    unknown = set(overrides) - set(env)
    assert not unknown, f"compose.yaml lost {unknown}"
    env.update(overrides)
    return command, env


@pytest.mark.slow
@pytest.mark.e2e
def test_services_started_as_compose_says_serve_a_generation_over_two_workers(tmp_path):
    spec = compose()["services"]
    model_dir = require_model()
    started: list[Service] = []
    try:
        command, env = _as_local(spec["scheduler"], {"ORTSERVE_SCHEDULER_HOST": "127.0.0.1",
                                                     "ORTSERVE_SCHEDULER_PORT": "0",
                                                     "ORTSERVE_SCHEDULER_INTERNAL_PORT": "0"})
        scheduler = start_service("scheduler", command, tmp_path, env)
        started.append(scheduler)
        wait_serving(scheduler)
        for i in range(2):
            command, env = _as_local(spec["worker-cpu"], {
                # the worker-facing port, from the banner ("listening A internal B")
                "ORTSERVE_SCHEDULER_ADDRESS": scheduler.banner.split()[-1],
                "ORTSERVE_WORKER_MODEL_DIR": str(model_dir),
                "ORTSERVE_WORKER_HOST": "127.0.0.1", "ORTSERVE_WORKER_PORT": "0",
                "ORTSERVE_WORKER_KV_CAPACITY": "256MiB"})
            env["ORTSERVE_WORKER_THREADS"] = "1"  # two workers share this machine's two cores
            worker = start_service(f"worker-{i}", command, tmp_path, env)
            started.append(worker)
        for worker in started[1:]:
            wait_serving(worker, "ortserve.v1.Worker")
        with Client(scheduler.address, timeout_s=120) as client:
            for _ in range(50):
                if len(client.budget().workers) == 2:
                    break
                time.sleep(0.1)
            budget = client.budget()
            assert len(budget.workers) == 2 and budget.total_capacity_bytes == 2 * 256 * 2**20
            # Two at once: the second is placed on the worker with more free bytes.
            streams = [client.stream(chat=[("user", "What is the capital of France?")],
                                     max_new_tokens=16) for _ in range(2)]
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(lambda s: list(s), streams))
            results = [s.result for s in streams]
        assert all(r.usage.generated_tokens > 0 for r in results)
        assert {r.worker_id for r in results} == {w.worker_id for w in budget.workers}
        assert reserved_bytes(scheduler.address) == 0
    finally:
        for service in reversed(started):
            stop_service(service)
    assert os.path.exists(tmp_path / "scheduler.log")
    assert Path(tmp_path / "worker-1.log").read_text()
