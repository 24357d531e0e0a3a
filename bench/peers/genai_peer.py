"""The peer: onnxruntime-genai decoding the same model folder (runs in .venv-tools).

  .venv-tools/bin/python bench/peers/genai_peer.py --model-dir DIR --threads 2 --batch 4 --new-tokens 64 --repeats 3
  .venv-tools/bin/python bench/peers/genai_peer.py --model-dir DIR --threads 2 --serve

The first form prints one JSON object: decode tokens/s (all streams together)
per repeat. `--serve` keeps the model loaded and answers one JSON line per
request line read on stdin ({"batch": B, "new_tokens": N, "prompt_ids": [...]})
with {"decode_tokens_per_s": x, "steps": s}, so the bench can interleave the
peer's runs with the engine's on a loaded machine. The decode rate counts the
steps after the prompt (and the first token) and divides by their wall time,
the same window the bench measures on the engine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
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


def decode_once(model, ids: np.ndarray, batch: int, new_tokens: int) -> tuple[float, int]:
    """Decode tokens/s of `batch` copies of `ids`, exactly `new_tokens` new tokens each."""
    params = og.GeneratorParams(model)
    # min_length pins the count: an early EOS would inflate tokens/s.
    params.set_search_options(max_length=len(ids) + new_tokens, min_length=len(ids) + new_tokens,
                              batch_size=batch, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.tile(ids, (batch, 1)))  # prefill: the first token's logits
    # NOTE: the first generate_next_token only samples from the prefill's logits (no model
    # run: 0.05 ms measured, against 8 ms for the next ones at batch 1). Timing it with the
    # rest counted new_tokens tokens over new_tokens - 1 runs (+3 % at 32 tokens). The
    # window opens at the first token, as the engine's (bench.common.measure.window_rate): every
    # timed step is one run and one token per row.
    generator.generate_next_token()
    start = time.perf_counter()
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    elapsed = time.perf_counter() - start
    if steps < new_tokens - 2:
        raise SystemExit(f"genai peer: only {steps} decode steps of {new_tokens}: not comparable")
    return batch * steps / elapsed, steps


def serve(model, tokenizer) -> None:
    print(json.dumps({"ready": True, "genai_version": og.__version__}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        ids = np.array(req.get("prompt_ids") or tokenizer.encode(req["prompt"]), dtype=np.int32)
        rate, steps = decode_once(model, ids, int(req["batch"]), int(req["new_tokens"]))
        print(json.dumps({"decode_tokens_per_s": rate, "steps": steps, "prompt_tokens": len(ids)}),
              flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt", default="Write a long story about a dragon who learns to paint.")
    p.add_argument("--serve", action="store_true", help="answer JSON request lines on stdin")
    a = p.parse_args()
    model = og.Model(og.Config(str(model_with_threads(a.model_dir, a.threads))))
    tokenizer = og.Tokenizer(model)
    if a.serve:
        serve(model, tokenizer)
        return
    ids = np.array(tokenizer.encode(a.prompt), dtype=np.int32)
    runs = [decode_once(model, ids, a.batch, a.new_tokens)[0] for _ in range(a.repeats + 1)]
    print(json.dumps({"decode_tokens_per_s": runs[1:], "batch": a.batch, "threads": a.threads,
                      "new_tokens": a.new_tokens, "genai_version": og.__version__}))


if __name__ == "__main__":
    main()
