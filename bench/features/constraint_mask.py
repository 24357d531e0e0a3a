"""llguidance's mask time per token on the default model's vocabulary (docs/features/structured-output.md).

  .venv/bin/python -m bench.features.constraint_mask [--model-dir DIR] [--rows 8]

Walks the matcher of a nested JSON schema over the tokens of a valid output,
timing the next-token mask before each token (one row), then the same walk for
`--rows` matchers at once in llguidance's thread pool; prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from devtools.cluster import model_cache

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
    "role": {"enum": ["admin", "user", "guest"]},
    "address": {"type": "object", "properties": {
        "street": {"type": "string"}, "city": {"type": "string"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city"]},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    "scores": {"type": "array", "items": {"type": "object", "properties": {
        "k": {"type": "string"}, "v": {"type": "number"}}, "required": ["k", "v"]}}},
    "required": ["name", "age", "role", "address", "tags"], "additionalProperties": False}
OUTPUT = {"name": "Ada Lovelace", "age": 36, "role": "admin",
          "address": {"street": "12 St James Square", "city": "London", "zip": "12345"},
          "tags": ["math", "poetry"], "scores": [{"k": "a", "v": 1.5}, {"k": "bb", "v": -2}]}


def measure(model_dir: Path, rows: int = 8) -> dict:
    import llguidance as llg
    import llguidance.numpy as llg_np
    import tokenizers

    from ortserve.output.constraint_grammar import ConstraintSpec, check

    text = (model_dir / "tokenizer.json").read_text()
    vocab = tokenizers.Tokenizer.from_str(text).get_vocab_size(with_added_tokens=True)
    t0 = time.perf_counter()
    tokenizer = llg.LLTokenizer(text, n_vocab=vocab)
    tokenizer_s = time.perf_counter() - t0
    grammar = check(ConstraintSpec("json_schema", json.dumps(SCHEMA)))
    t0 = time.perf_counter()
    matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
    compile_ms = (time.perf_counter() - t0) * 1e3
    ids = tokenizers.Tokenizer.from_str(text).encode(json.dumps(OUTPUT, separators=(",", ":")),
                                                     add_special_tokens=False).ids
    words = llg_np.allocate_token_bitmask(rows, vocab)
    one = []
    for token in ids:
        t0 = time.perf_counter()
        llg_np.fill_next_token_bitmask(matcher, words, 0)
        one.append((time.perf_counter() - t0) * 1e6)
        assert (words[0, token >> 5] >> (token & 31)) & 1, "the valid output was masked"
        matcher.consume_token(token)
    executor = llg.LLExecutor(2)
    matchers = [llg.LLMatcher(tokenizer, grammar, log_level=0) for _ in range(rows)]
    batched = []
    for token in ids:
        t0 = time.perf_counter()
        llg_np.fill_next_token_bitmask_par(executor, [(m, i) for i, m in enumerate(matchers)], words)
        batched.append((time.perf_counter() - t0) * 1e6)
        for m in matchers:
            m.consume_token(token)
    return {"library": f"llguidance {llg.__version__}", "vocab_size": vocab, "tokens": len(ids),
            "tokenizer_build_s": tokenizer_s, "schema_compile_ms": compile_ms,
            "mask_us_one_row": {"mean": statistics.fmean(one), "p50": float(np.median(one)),
                                "p99": float(np.percentile(one, 99)), "max": max(one)},
            f"mask_us_{rows}_rows_per_step": {"mean": statistics.fmean(batched),
                                              "p50": float(np.median(batched))}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.features.constraint_mask", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path,
                   default=model_cache() / "models" / "smollm2-135m-instruct-fp32")
    p.add_argument("--rows", type=int, default=8)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.model_dir, a.rows), indent=2))


if __name__ == "__main__":
    main()
