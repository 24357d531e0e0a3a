"""The prepared model folders: parity with transformers, idempotence, determinism."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"
CACHE = Path(os.environ.get("ORTSERVE_MODEL_CACHE", Path.home() / ".cache" / "ortserve"))
REQUIRED = ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja", "ortserve-model.json")


def tools(*args: str, timeout_s: float = 900, **kw) -> subprocess.CompletedProcess:
    if not TOOLS_PYTHON.exists():
        pytest.fail("the model tools environment is missing: run `make tools-setup`")
    return subprocess.run([str(TOOLS_PYTHON), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, **kw)


@pytest.mark.slow
def test_fp32_logits_match_transformers_and_the_answer_is_paris():
    model_dir = CACHE / "models" / "smollm2-135m-instruct-fp32"
    result = tools("-m", "model_tools.parity", "--model-dir", str(model_dir),
                   "--hf-dir", str(CACHE / "hf" / "smollm2-135m-instruct"))
    assert result.returncode == 0, result.stderr[-3000:]
    doc = json.loads(result.stdout)
    assert doc["max_abs_logit_diff"] < 1e-3
    assert "Paris" in doc["greedy_text"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m-instruct-fp32", "smollm2-135m-instruct-int4", "tiny-llama"])
def test_prepared_folders_are_complete_with_a_manifest(name):
    folder = CACHE / "models" / name
    assert [f for f in REQUIRED if not (folder / f).exists()] == []
    manifest = json.loads((folder / "ortserve-model.json").read_text())
    assert manifest["name"] == name and manifest["tools"]["onnxruntime-genai"]


@pytest.mark.slow
def test_a_second_prepare_does_nothing_and_says_so():
    result = tools("-m", "model_tools.prepare", timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("already prepared") == 2
    assert result.stdout.split() == [str(CACHE / "models" / f"smollm2-135m-instruct-{p}")
                                     for p in ("fp32", "int4")]


@pytest.mark.slow
def test_the_tiny_model_is_deterministic_across_builds(tmp_path):
    digests = []
    for name in ("a", "b"):
        cache = tmp_path / name
        # Reuse the de-quantized HF folder (the slow part) through a link.
        (cache / "hf").mkdir(parents=True)
        (cache / "hf" / "smollm2-135m-instruct").symlink_to(CACHE / "hf" / "smollm2-135m-instruct")
        result = tools("-m", "model_tools.prepare", "--only", "tiny", "--cache-dir", str(cache))
        assert result.returncode == 0, result.stderr[-2000:]
        data = (cache / "models" / "tiny-llama" / "model.onnx.data").read_bytes()
        digests.append(hashlib.sha256(data).hexdigest())
        assert not list((cache / "models").glob(".tmp-*"))  # nothing half-written left
    assert digests[0] == digests[1]
