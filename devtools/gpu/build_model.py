"""On the GPU machine: a random-weight fp16 `-e cuda` model folder at a real model's shape.

  python3 -m devtools.gpu.build_model --shape devtools/gpu/shapes/smollm2-135m.json \\
      --tokenizer-dir .gpu-b/tok --out DIR [--work TMP]

No weights travel (a device call carries 64 MiB): a LlamaForCausalLM of the shape's
config.json with seeded random fp16 weights is saved as a Hugging Face folder, and the
onnxruntime-genai model builder turns it into the folder the worker serves (genai_config.json,
model.onnx + data, the tokenizer). Speed and the equality checks need no trained weights;
the text it writes is noise. Needs torch, transformers and onnxruntime_genai (the device
image has the first two; the bundle carries the third).
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

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")
# Keys of a saved config.json that LlamaConfig(**raw) does not take as arguments.
_NOT_ARGUMENTS = ("_model_name_or_path", "transformers_version", "architectures", "dtype")
SEED = 0


def random_hf_folder(shape: Path, tokenizer_dir: Path, out: Path) -> int:
    """Save a seeded random fp16 LlamaForCausalLM of `shape` into out; its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    raw = json.loads(shape.read_text())
    for key in _NOT_ARGUMENTS:
        raw.pop(key, None)
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(LlamaConfig(**raw)).to(torch.float16)
    model.save_pretrained(str(out))
    copy_tokenizer(tokenizer_dir, out)
    return sum(p.numel() for p in model.parameters())


def copy_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file() and not (out / name).exists():
            shutil.copy2(tokenizer_dir / name, out / name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gpu.build_model",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=Path, required=True, help="a llama config.json")
    parser.add_argument("--tokenizer-dir", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=None, help="scratch (default: OUT.work)")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--execution-provider", default="cuda")
    args = parser.parse_args(argv)
    work = (args.work or args.out.with_name(args.out.name + ".work")).resolve()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(args.out, ignore_errors=True)
    t0 = time.monotonic()
    n_params = random_hf_folder(args.shape, args.tokenizer_dir, work / "hf")
    print(f"build_model: random {args.shape.name}: {n_params:,} parameters in "
          f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    # GIT_DIR=/dev/null and the scratch folder as cwd: the builder asks git for a commit id
    # (a copy of a tree has no repository) and leaves its own files where it runs.
    builder = subprocess.run(
        [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(work / "hf"),
         "-o", str(args.out.resolve()), "-p", args.precision, "-e", args.execution_provider,
         "-c", str(work / "cache")], env={**os.environ, "GIT_DIR": "/dev/null"}, cwd=work)
    if builder.returncode != 0:
        print(f"build_model: the genai builder failed (exit {builder.returncode})",
              file=sys.stderr)
        return builder.returncode
    copy_tokenizer(args.tokenizer_dir, args.out)
    shutil.rmtree(work, ignore_errors=True)
    print(f"build_model: {args.out} ({args.precision}, -e {args.execution_provider}) in "
          f"{time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
