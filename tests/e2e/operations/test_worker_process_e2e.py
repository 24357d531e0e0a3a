"""The worker as a process: settings that cannot work are refused at start, naming the flag."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.models import prepared_model_dir


@pytest.mark.parametrize(("flag", "budget"), [("--kv-capacity", "0"), ("--kv-capacity", "100"),
                                             ("--kv-budget", "100")])
def test_a_kv_capacity_that_cannot_hold_one_request_is_refused_at_start(flag, budget):
    tiny = prepared_model_dir("tiny-llama")
    # No scheduler listens on port 9: the worker must refuse before it would register.
    out = subprocess.run(
        [sys.executable, "-m", "worker_service", "--model-dir", str(tiny), "--port", "0",
         "--scheduler", "127.0.0.1:9", "--device", "cpu", flag, budget, "--threads", "1"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "--kv-capacity" in out.stderr and "raise --kv-capacity to at least" in out.stderr
    # stderr is not a terminal here, so logs are JSON: every line, the fatal one too.
    lines = [json.loads(line) for line in out.stderr.splitlines() if line.strip()]
    # The deprecated alias (one word, "capacity", is the name now) works and says so, once.
    deprecated = [line for line in lines if "deprecated" in line["event"]]
    assert [line["event"] for line in deprecated] == (
        ["--kv-budget is deprecated: use --kv-capacity (same meaning)"] if flag == "--kv-budget"
        else [])


@pytest.mark.parametrize("fake_smi", [None, "#!/bin/sh\necho 'No devices were found' >&2\nexit 6\n"],
                         ids=["no-nvidia-smi", "nvidia-smi-fails"])
def test_cuda_without_a_driver_is_a_device_error_naming_the_way_out(tmp_path, fake_smi):
    """--device cuda with no --kv-capacity reads the GPU's free memory: with no driver in sight
    (a container started without its GPU) that is a named device error, not a traceback."""
    if shutil.which("nvidia-smi") and fake_smi is None:
        pytest.skip("nvidia-smi is installed here")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if fake_smi is not None:
        (bin_dir / "nvidia-smi").write_text(fake_smi)
        (bin_dir / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "worker_service", "--model-dir", str(prepared_model_dir("tiny-llama")),
         "--port", "0", "--scheduler", "127.0.0.1:9", "--device", "cuda", "--threads", "1"],
        capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    fatal = [json.loads(line) for line in out.stderr.splitlines() if line.strip()][-1]
    assert fatal["kind"] == "DeviceUnavailable", fatal
    if fake_smi is None:
        assert "nvidia-smi, which is not on PATH" in fatal["error"] and "--gpus all" in fatal["error"]
    else:
        assert "exit 6: No devices were found" in fatal["error"] and "nvidia-smi -L" in fatal["error"]
    assert "--kv-capacity" in fatal["error"]


def test_device_auto_resolves_to_what_really_runs_and_info_says_so(tmp_path):
    from devtools.cluster import LocalCluster
    from ortserve.v1 import worker_pb2
    from tests.e2e.conftest import worker_stub

    with LocalCluster(model_dir=prepared_model_dir("tiny-llama"), log_dir=tmp_path,
                      device="auto", kv_capacities=["64MiB"]) as cluster:
        info = worker_stub(cluster.worker_services[0].address).Info(worker_pb2.InfoRequest(),
                                                                    timeout=5)
        log = cluster.worker_services[0].log_path.read_text()
    assert info.requested_device == "auto"
    assert info.device in ("cpu", "cuda:0")
    assert (info.execution_provider == "CUDAExecutionProvider") == info.device.startswith("cuda")
    assert "device resolved" in log
