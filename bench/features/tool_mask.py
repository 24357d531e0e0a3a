"""llguidance's mask time per token for the tool-call grammars (docs/features/tools.md).

  .venv/bin/python -m bench.features.tool_mask [--model-dir DIR]

Builds the grammars ortserve sends for two tools (ortserve/output/tool_calls.py) and
walks each over the tokens of an output it allows, timing the next-token mask
before each token (one row): `required` over a call, `auto` over a call and
over a plain-text answer (the free-text branch is the costly one); prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from devtools.cluster import model_cache

WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
FLIGHTS = {"type": "object", "properties": {"origin": {"type": "string"},
                                            "destination": {"type": "string"},
                                            "passengers": {"type": "integer", "minimum": 1}},
           "required": ["origin", "destination", "passengers"], "additionalProperties": False}
TEXT = ("The weather in Paris is usually mild in spring, with temperatures between ten and "
        "twenty degrees. Bring a light jacket and an umbrella, just in case it rains.")


def measure(model_dir: Path) -> dict:
    import llguidance as llg
    import llguidance.numpy as llg_np
    import tokenizers

    from ortserve.output import tool_calls
    from ortserve.output.constraint_grammar import ConstraintSpec, check
    from ortserve.v1 import types_pb2

    text = (model_dir / "tokenizer.json").read_text()
    hf = tokenizers.Tokenizer.from_str(text)
    vocab = hf.get_vocab_size(with_added_tokens=True)
    tokenizer = llg.LLTokenizer(text, n_vocab=vocab)
    tools = [types_pb2.Tool(name="get_weather", parameters_json=json.dumps(WEATHER)),
             types_pb2.Tool(name="find_flights", parameters_json=json.dumps(FLIGHTS))]
    call = tool_calls.call_text("get_weather", '{"city":"Paris","unit":"celsius"}')
    walks = {"required, a call": (False, call), "auto, a call": (True, call),
             "auto, text": (True, TEXT)}
    out = {"library": f"llguidance {llg.__version__}", "vocab_size": vocab}
    for label, (allow_text, output) in walks.items():
        grammar = check(ConstraintSpec("tool_call", tool_calls.grammar(tools, allow_text=allow_text)))
        matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
        words = llg_np.allocate_token_bitmask(1, vocab)
        times = []
        ids = hf.encode(output, add_special_tokens=False).ids
        for token in ids:
            t0 = time.perf_counter()
            llg_np.fill_next_token_bitmask(matcher, words, 0)
            times.append((time.perf_counter() - t0) * 1e6)
            assert (words[0, token >> 5] >> (token & 31)) & 1, f"{label}: the output was masked"
            matcher.consume_token(token)
        out[label] = {"tokens": len(ids), "mask_us_mean": statistics.fmean(times),
                      "mask_us_p50": float(np.median(times)),
                      "mask_us_p99": float(np.percentile(times, 99))}
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.features.tool_mask", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path,
                   default=model_cache() / "models" / "smollm2-135m-instruct-fp32")
    a = p.parse_args(argv)
    print(json.dumps(measure(a.model_dir), indent=2))


if __name__ == "__main__":
    main()
