"""The peer: onnxruntime-genai decoding the same model folder (runs in .venv-tools).

  .venv-tools/bin/python bench/genai_peer.py --model-dir DIR --threads 2 --batch 4 --new-tokens 64 --repeats 3

Prints one JSON object: decode tokens/s (all streams together) per repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime_genai as og


def model_with_threads(model_dir: Path, threads: int) -> Path:
    """A folder of symlinks to model_dir whose genai_config sets intra_op_num_threads."""
    out = Path(tempfile.mkdtemp(prefix="genai-peer-"))
    for item in model_dir.iterdir():
        if item.name != "genai_config.json":
            os.symlink(item, out / item.name)
    config = json.loads((model_dir / "genai_config.json").read_text())
    options = config["model"]["decoder"].setdefault("session_options", {})
    options["intra_op_num_threads"] = threads
    options["inter_op_num_threads"] = 1
    (out / "genai_config.json").write_text(json.dumps(config))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", default="Write a long story about a dragon who learns to paint.")
    a = p.parse_args()
    model = og.Model(og.Config(str(model_with_threads(a.model_dir, a.threads))))
    tokenizer = og.Tokenizer(model)
    ids = np.array(tokenizer.encode(a.prompt), dtype=np.int32)
    runs = []
    for _ in range(a.repeats + 1):  # the first is a warm-up
        params = og.GeneratorParams(model)
        # min_length pins the count: an early EOS would inflate tokens/s.
        params.set_search_options(max_length=len(ids) + a.new_tokens,
                                  min_length=len(ids) + a.new_tokens, batch_size=a.batch,
                                  do_sample=False)
        generator = og.Generator(model, params)
        generator.append_tokens(np.tile(ids, (a.batch, 1)))  # prefill, and the first token
        start = time.perf_counter()
        steps = 0
        while not generator.is_done():
            generator.generate_next_token()
            steps += 1
        elapsed = time.perf_counter() - start
        if steps < a.new_tokens - 1:
            raise SystemExit(f"genai peer: only {steps} decode steps of {a.new_tokens}: not comparable")
        runs.append(a.batch * steps / elapsed)
    print(json.dumps({"decode_tokens_per_s": runs[1:], "batch": a.batch, "threads": a.threads,
                      "new_tokens": a.new_tokens, "genai_version": og.__version__}))


if __name__ == "__main__":
    main()
