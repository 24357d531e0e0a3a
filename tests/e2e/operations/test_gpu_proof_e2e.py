"""The GPU proof's device script as a dry run (devtools/gpu/proof.py): CPU ORT, the tiny
model, this Python. Install and the model builds need the bundle and a GPU image and are
skipped; every other step runs its real code (cuda_check --dry-run, a served request through
scheduler + --device cpu worker + gateway, the genai peers, the timeouts, the JSON), so the
script the GPU machine runs cannot rot between the rare runs there."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from devtools.cluster import model_cache
from devtools.gpu import steps

ROOT = Path(__file__).resolve().parents[3]
# The model-tools venv sits beside the serving one (make tools-setup): it has onnxruntime-genai.
TOOLS_PYTHON = Path(sys.executable).parents[2] / ".venv-tools" / "bin" / "python"

pytestmark = pytest.mark.e2e


def tiny_model() -> Path:
    folder = model_cache() / "models" / "tiny-llama"
    if not (folder / "genai_config.json").exists():
        pytest.fail(f"no tiny model at {folder}: run `make tiny-model` (make test does)")
    return folder


def dry_run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "devtools.gpu.proof", "--dry-run", "--out", str(out),
            "--model-dir", str(tiny_model()), *extra]
    if TOOLS_PYTHON.exists():
        argv += ["--genai-python", str(TOOLS_PYTHON)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=500, cwd=ROOT)


def test_the_gpu_proof_runs_every_step_it_can_as_a_dry_run(tmp_path):
    out = tmp_path / "out"
    done = dry_run(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == ""  # notices on stderr; the results are files
    files = sorted(p.name for p in out.iterdir())
    assert files == ["logs.txt", "proof.json", "served.json", "tiny.json"]
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files)  # what a device call returns

    proof = json.loads((out / "proof.json").read_text())
    assert proof["dry_run"] is True
    assert proof["summary"] == {"install": "skipped", "env": "ok", "build-smol": "skipped",
                                "build-b1": "skipped", "cuda_check-tiny": "ok",
                                "served-tiny": "ok", "peers-tiny": "ok"}
    assert proof["env"]["cuda_smoke"]["skipped"].startswith("dry run")
    assert proof["env"]["versions"]["onnxruntime-gpu"]

    tiny = json.loads((out / "tiny.json").read_text())
    check = tiny["cuda_check"]
    assert check["exit"] == 0 and check["json"]["dry_run"] is True
    assert check["json"]["checks"]["batched_equals_solo"]["ok"] is True
    if TOOLS_PYTHON.exists():
        peers = tiny["peers"]["json"]
        assert peers["provider"] == "cpu"
        assert set(peers["generator"]) == {"1", "2"}
        assert peers["generator"]["2"]["decode_tokens_per_s"] > 0
        assert peers["engine"]["2"]["finished"] == 2

    served = json.loads((out / "served.json").read_text())["tiny"]["result"]
    assert served["ok"] is True and served["device"] == "cpu"
    assert served["chat_plain"]["usage"]["completion_tokens"] == 32
    assert served["chat_plain"]["decision"] == "ADMITTED"
    assert served["chat_stream"]["content_chunks"] > 0
    assert served["cli_generate"]["exit"] == 0
    assert served["cli_info"]["json"]["workers"][0]["device"] == "cpu"

    logs = (out / "logs.txt").read_text()
    assert "===== served-tiny/worker-0.log" in logs and "===== cuda_check-tiny.log" in logs


def test_steps_the_deadline_leaves_no_time_for_are_skipped_and_the_json_still_assembles(
        tmp_path):
    out = tmp_path / "out"
    # One second over the least the proof accepts: the first steps start, and once they have
    # taken that second (cuda_check alone takes longer to import ORT) no later step can: this
    # holds on a quiet machine too (35 s did not: there env and cuda_check ended in 4 s and the
    # peers still fitted)
    done = dry_run(out, "--deadline-s", f"{steps.RESERVE_S + steps.MIN_STEP_S + 1:g}")
    assert done.returncode == 0, done.stderr[-3000:]
    proof = json.loads((out / "proof.json").read_text())
    statuses = proof["summary"]
    assert set(statuses.values()) <= {"ok", "failed", "timeout", "skipped"}
    late = [s for s in proof["steps"] if s["status"] == "skipped"
            and "before the deadline" in s.get("note", "")]
    assert {"peers-tiny", "served-tiny"} <= {s["name"] for s in late}
    assert (out / "logs.txt").exists()


def test_a_served_step_stopped_at_its_timeout_takes_its_services_with_it(tmp_path):
    result = tmp_path / "served.json"

    class Clock:
        now = 0.0

        def __call__(self) -> float:
            return self.now

    clock = Clock()
    step = steps.Running("served", [sys.executable, "-m", "devtools.gpu.served", "--model-dir",
                                    str(tiny_model()), "--device", "cpu", "--result",
                                    str(result), "--log-dir", str(tmp_path / "logs")],
                         100, tmp_path / "served.log", cwd=ROOT, clock=clock)
    deadline = time.monotonic() + 120
    pids: dict = {}
    while not pids:
        assert step.running(), (tmp_path / "served.log").read_text()[-2000:]
        assert time.monotonic() < deadline, "the services never came up"
        if result.exists():
            pids = json.loads(result.read_text() or "{}").get("pids", {})
        time.sleep(0.2)
    assert set(pids) == {"scheduler", "worker-0", "gateway"}
    clock.now += 101  # its timeout has passed
    outcome = step.wait()
    assert outcome.status == "timeout"
    for name, pid in pids.items():
        end = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and \
                Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0] != "Z":
            assert time.monotonic() < end, f"{name} (pid {pid}) outlived the stopped step"
            time.sleep(0.1)
