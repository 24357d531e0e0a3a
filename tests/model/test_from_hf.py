"""`model_tools.prepare --from-hf`: any llama-family Hugging Face folder, made servable.

Conversion runs in .venv-tools (a subprocess); the result is served here, in the
serving environment, by the worker's own Engine.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from devtools.cluster import model_cache
from tests.model.test_parity import MANIFEST, TINY_TIMEOUT_S, prepare, sha256_of
from tests.models import prepared_model_dir
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import FinishReason, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine


@pytest.fixture(scope="module")
def tiny_hf_dir() -> Path:
    """The tiny llama's Hugging Face folder that `make tiny-model` keeps (weights, tokenizer)."""
    prepared_model_dir("tiny-llama")  # skips, saying how to prepare it, when absent
    path = model_cache().expanduser() / "hf" / "tiny-llama"
    if not (path / "config.json").is_file():
        pytest.skip(f"{path} is missing: run `make tiny-model`")
    return path


@pytest.fixture(scope="module")
def converted(tiny_hf_dir, tmp_path_factory) -> tuple[Path, Path, str]:
    """(the cache, the converted folder, prepare's stderr) for --from-hf on the tiny folder."""
    cache = tmp_path_factory.mktemp("cache")
    result = prepare("--cache-dir", str(cache), "--from-hf", str(tiny_hf_dir),
                     "--name", "my-llama", "--precision", "fp32", timeout_s=TINY_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-4000:]
    folder = cache / "models" / "my-llama"
    assert result.stdout.splitlines() == [str(folder)]
    return cache, folder, result.stderr


def test_from_hf_builds_a_folder_the_worker_engine_serves(converted):
    _, folder, _ = converted
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["name"] == "my-llama" and manifest["precision"] == "fp32"
    assert "LlamaForCausalLM" in manifest["source"]
    with Engine(EngineConfig(model_dir=folder, intra_op_threads=2)) as engine:
        prompt = engine.tokenizer.encode_chat([("user", "Hi there")])
        done = engine.generate(SequenceRequest("from-hf", tuple(prompt), 6,
                                               sampling=SamplingConfig(temperature=1.0, seed=7)))
    assert done.finish_reason is FinishReason.LENGTH and done.generated_tokens == 6
    assert len(done.token_ids) == 6


def test_from_hf_reuses_the_builder_path_of_the_tiny_model(converted):
    # Same HF folder, same builder and flags: the weights must be the tiny-llama's, byte for byte.
    _, folder, _ = converted
    tiny = prepared_model_dir("tiny-llama")
    assert sha256_of(folder / "model.onnx.data") == sha256_of(tiny / "model.onnx.data")


def test_from_hf_prints_one_line_per_step_and_logs_the_tools_output(converted):
    cache, _, stderr = converted
    lines = stderr.splitlines()
    match = re.search(r"the tools' own output goes to (\S+\.log)", stderr)
    assert match, stderr
    log = Path(match.group(1))
    assert log.parent == cache / "logs" and log.is_file()
    # The builder's own chatter is in the log, not on the terminal.
    assert "Reading layer 0" in log.read_text() and "Reading layer" not in stderr
    steps = [line for line in lines if re.match(r"prepare: \[\d+/\d+\]", line)]
    assert len(steps) == 1 and re.search(r"\(expected: .+\) \.\.\. done in [\d.]+ s$", steps[0])
    assert "my-llama" in lines[-1] and str(cache / "models") in lines[-1]
    assert not list((cache / "models").glob(".tmp-*"))


def test_from_hf_without_a_tokenizer_fails_before_building(tiny_hf_dir, tmp_path):
    broken = tmp_path / "no-tokenizer"
    broken.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(tiny_hf_dir / name, broken / name)
    cache = tmp_path / "cache"
    result = prepare("--cache-dir", str(cache), "--from-hf", str(broken), timeout_s=120)
    assert result.returncode == 1
    assert "tokenizer.json" in result.stderr and result.stdout == ""
    assert not (cache / "models" / "no-tokenizer-fp32").exists()


def test_a_builder_failure_names_the_step_and_shows_the_log_tail(tiny_hf_dir, tmp_path):
    odd = tmp_path / "odd-arch"
    shutil.copytree(tiny_hf_dir, odd)
    config = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    cache = tmp_path / "cache"
    result = prepare("--cache-dir", str(cache), "--from-hf", str(odd), timeout_s=TINY_TIMEOUT_S)
    assert result.returncode == 1 and result.stdout == ""
    logs = list((cache / "logs").glob("prepare-*.log"))
    assert len(logs) == 1
    assert f"the last lines of {logs[0]}" in result.stderr
    assert "is not currently supported" in result.stderr  # the builder's own words, from the log
    last = result.stderr.splitlines()[-1]
    assert "builder exited 1" in last and "architectures onnxruntime-genai supports" in last
    assert not (cache / "models" / "odd-arch-fp32").exists()
    assert not list((cache / "models").glob(".tmp-*"))
