"""Decode tokens/s of 8 streams under a JSON schema vs 8 free streams (the target: >= 0.9x).

  .venv/bin/python -m bench.features.structured [--model-dir DIR] [--streams 8] [--tokens 64]
      [--repeats 4] [--threads 2]

One in-process engine, the batched decode path. Each repeat runs three rounds
back to back, in rotating order so machine load hits all alike: free streams
(min_new_tokens = max_new_tokens, so none stops early), constrained streams
with the masks computed beside the ORT run (the default), and constrained with
the masks computed after it. The schema is an array of at least 40 small
objects, so no constrained stream completes before the ceiling either: every
round decodes streams x tokens. The figure is streams x (tokens - 1) over the
round's decode wall time (first token to last), the same for all three.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from pathlib import Path

from devtools.cluster import model_cache
from ortserve.output.constraint_grammar import ConstraintSpec
from worker_service.core.sequence import TERMINAL, SequenceRequest, TokenDelta
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine

SCHEMA = {"type": "array", "minItems": 40, "items": {
    "type": "object", "properties": {
        "city": {"type": "string", "maxLength": 16},
        "population": {"type": "integer"},
        "kind": {"enum": ["capital", "port", "village"]}},
    "required": ["city", "population", "kind"], "additionalProperties": False}}
PROMPTS = ["List cities of Europe as JSON.", "List ports of Asia as JSON.",
           "List villages of France as JSON.", "List capitals of Africa as JSON."]
MODES = ("free", "constrained_overlap", "constrained_after_run")


def one_round(engine: Engine, mode: str, streams: int, tokens: int, round_id: str) -> float:
    """Decode tokens/s of `streams` sequences started together."""
    engine._masks.overlap = mode != "constrained_after_run"  # NOTE: the bench's one knob
    spec = None if mode == "free" else ConstraintSpec("json_schema", json.dumps(SCHEMA))
    lock, done = threading.Lock(), threading.Event()
    first: dict[str, float] = {}  # each stream's first token
    last: list[float] = []

    def on_event(event) -> None:
        with lock:
            if isinstance(event, TokenDelta):
                first.setdefault(event.sequence_id, time.perf_counter())
            if isinstance(event, TERMINAL):
                last.append(time.perf_counter())
                if len(last) == streams:
                    done.set()

    for i in range(streams):
        ids = engine.tokenizer.encode_chat([("user", PROMPTS[i % len(PROMPTS)] + f" ({i})")])
        engine.submit(SequenceRequest(f"{round_id}-{i}", tuple(ids), tokens,
                                      min_new_tokens=tokens if spec is None else 0,
                                      constraint=spec), on_event)
    if not done.wait(600):
        raise SystemExit(f"bench.features.structured: round {round_id} did not finish in 600 s")
    # From the last stream's first token (all are decoding) to the last end.
    return streams * (tokens - 1) / (max(last) - max(first.values()))


def measure(model_dir: Path, streams: int = 8, tokens: int = 64, repeats: int = 4,
            threads: int = 2) -> dict:
    config = EngineConfig(model_dir=model_dir, intra_op_threads=threads,
                          kv_capacity_bytes=512 * 2**20)
    rates: dict[str, list[float]] = {m: [] for m in MODES}
    with Engine(config) as engine:
        one_round(engine, "constrained_overlap", 2, 8, "warm")  # llguidance's tokenizer, ORT
        for r in range(repeats):
            order = MODES[r % 3:] + MODES[: r % 3]
            for mode in order:
                rates[mode].append(one_round(engine, mode, streams, tokens, f"r{r}-{mode}"))
    pairs = [c / f for c, f in zip(rates["constrained_overlap"], rates["free"], strict=True)]
    after = [c / f for c, f in zip(rates["constrained_after_run"], rates["free"], strict=True)]
    return {
        "streams": streams, "tokens": tokens, "repeats": repeats, "threads": threads,
        "decode_tokens_per_s": {m: {"median": statistics.median(v), "values": v}
                                for m, v in rates.items()},
        "constrained_vs_free": {"median": statistics.median(pairs), "values": pairs},
        "constrained_after_run_vs_free": {"median": statistics.median(after), "values": after},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.features.structured", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-dir", type=Path,
                   default=model_cache() / "models" / "smollm2-135m-instruct-fp32")
    p.add_argument("--streams", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    print(json.dumps(measure(a.model_dir, a.streams, a.tokens, a.repeats, a.threads), indent=2))


if __name__ == "__main__":
    main()
