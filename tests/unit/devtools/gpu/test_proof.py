"""devtools/gpu/proof.py's device path on a machine without a GPU: a fake bundle installs,
the CUDA steps fail, and the run still ends with every outcome in proof.json. (The dry run,
every step through its real code, is tests/e2e/operations/test_gpu_proof_e2e.py.)"""

from __future__ import annotations

import json
import shutil

import pytest

from devtools.gpu import proof

from .fake_ort import fake_bundle

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None, reason="needs zstd")


def run_proof(tmp_path, stage):
    out = tmp_path / "out"
    _, bundle = fake_bundle(tmp_path) if stage is None else (None, stage)
    code = proof.main(["--out", str(out), "--bundle", str(bundle), "--stage",
                       str(tmp_path / ".gpu-a"), "--site", str(tmp_path / "site"), "--work",
                       str(tmp_path / "work"), "--deadline-s", "200"])
    return code, json.loads((out / "proof.json").read_text()), out


def test_a_missing_stage_ends_the_run_at_once_with_exit_3_and_the_reason(tmp_path):
    stage, bundle = fake_bundle(tmp_path)
    shutil.rmtree(stage)
    code, record, out = run_proof(tmp_path, bundle)
    assert code == 3
    assert record["summary"] == {"install": "failed"}
    assert "ort.part_00 (stage) is in none of" in record["install"]["stage_missing"][0]
    assert (out / "logs.txt").exists()


def test_failed_cuda_steps_are_recorded_and_the_run_still_completes(tmp_path):
    code, record, out = run_proof(tmp_path, None)
    assert code == 0
    summary = record["summary"]
    assert summary["install"] == "ok"
    assert summary["env"] == "failed"  # no GPU here: the smoke test fails, with its reason
    assert record["env"]["cuda_smoke"]["ok"] is False
    # the fake onnxruntime, unpacked into the site, shadowed the venv's
    assert record["install"]["project"] == {"commit": "abc"}
    assert (tmp_path / "site" / "onnxruntime" / "__init__.py").exists()
    assert record["bundle"]["runtime"]["requirement"] == "onnxruntime-gpu==1.31.1"
    # no torch or genai builder here: both builds fail, so no step runs on a missing model
    assert summary["build-smol"] == summary["build-b1"] == "failed"
    assert not any(name.startswith(("cuda_check", "served", "peers")) for name in summary)
    assert sorted(p.name for p in out.iterdir()) == ["logs.txt", "proof.json"]


def test_cuda_check_stops_its_checks_before_its_step_s_timeout():
    """cuda_check prints its JSON by its own --deadline-s; the step's timeout must not cut
    it off: the deadline leaves the margin for its watchdog's grace and closing engines."""
    from worker_service.cuda_check.harness import WATCHDOG_GRACE_S

    assert proof.cuda_check_deadline_s(150) == 120
    assert proof.cuda_check_deadline_s(None) == proof.PLANNED_S["cuda_check"] - 30
    assert proof.cuda_check_deadline_s(20) == 10  # a short step still gets a few checks
    assert proof.CUDA_CHECK_MARGIN_S > WATCHDOG_GRACE_S
