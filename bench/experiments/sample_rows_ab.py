"""Sampled rows per CPU second: one `Sampler.choose` per row against `sample_rows` for the
batch (below), interleaved round by round. An experiment the A/B rejected (issue 50 item 4).

`sample_rows` chooses a step's sampled rows in one pass over the [rows, vocab] block: the
float64 copy, the division by each row's temperature and, for rows with no top_k / top_p /
min_p, the shift and the float32 exp once for the batch; per-row parameters (suppressed
tokens, penalties, logit_bias) row by row in place; each row's uniform from its own
generator. Every batched operation is elementwise (or a max) over the float64 values the
per-row code computes, in the same precision, so the draws are the per-row sampler's
exactly (asserted every round; checked too on random parameters: top_k/top_p/min_p,
penalties, logit_bias, suppression, fp16 logits, 6 steps, vocab 1,000-49,152).

Measured on a loaded 2-core machine (load average ~15): the batch is SLOWER, 0.55-0.6x at
8 and 32 temperature-only rows, 0.77-0.8x mixed. A row's float64 scores (384 KiB at
49,152) stay in L2 through the per-row pipeline; the batch's (12 MiB at 32 rows) stream
from memory at each of its passes. So the serving path keeps one `Sampler.choose` per row.

  .venv/bin/python -m bench.experiments.sample_rows_ab [--rows 8 32] [--rounds 40]
      [--vocab 49152] [--params temperature|mixed]

Each round draws every row once both ways over the same float32 logits ([rows, vocab],
one buffer as the decode step's), the order alternating; this thread's CPU seconds are
counted (what a crowded machine's waits for a core do not inflate). `temperature`:
every row samples at a temperature alone (the batched shift and exp); `mixed`: a third
of the rows also have top_p, a third top_k (their own candidates, drawn row by row).
Prints one JSON line per row count: tokens per CPU second each way (median over rounds)
and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence

import numpy as np

from worker_service.core.sampling import Sampler, SamplingConfig, _pick


def batchable(sampler: Sampler) -> bool:
    """Whether `sampler` samples (not greedy): `sample_rows` may choose for it."""
    return sampler._rng is not None


def _truncates(sampler: Sampler) -> bool:
    """top_k, min_p or top_p set: the row's candidates are its own (`Sampler._draw`)."""
    config = sampler.config
    return (bool(config.top_k) and config.top_k < sampler.vocab_size) or bool(config.min_p) or (
        config.top_p is not None and config.top_p < 1)


def sample_rows(samplers: Sequence[Sampler], logits: np.ndarray | Sequence[np.ndarray],
                histories: Sequence[Sequence[int]]) -> list[int]:
    """The next token of each row b of `logits` ([rows, >= vocab] or a list of rows, any
    float dtype) as `samplers[b].choose(logits[b], histories[b])` would choose it (and
    counted where the sampler counts its output), with the batch's arithmetic done once."""
    rows = len(samplers)
    if rows == 0:
        return []
    vocab = samplers[0].vocab_size
    if any(s.vocab_size != vocab or not batchable(s) for s in samplers):
        raise ValueError("sample_rows takes sampling (not greedy) rows of one vocabulary")
    # float64, as Sampler.choose: one copy for the batch (row by row from separate rows).
    if isinstance(logits, np.ndarray) and logits.ndim == 2:
        scores = np.array(logits[:rows, :vocab], dtype=np.float64)
    else:
        scores = np.empty((rows, vocab), dtype=np.float64)
        for b in range(rows):
            scores[b] = logits[b][:vocab]
    temperatures = np.empty((rows, 1), dtype=np.float64)
    for b, sampler in enumerate(samplers):
        row = scores[b]
        if sampler._suppressed.size:
            row[sampler._suppressed] = -np.inf
        sampler._adjust(row, histories[b])
        temperatures[b, 0] = sampler.config.temperature
    scores /= temperatures
    plain = [b for b, s in enumerate(samplers) if not _truncates(s)]
    tokens: list[int] = [0] * rows
    if plain:
        block = scores if len(plain) == rows else scores[plain]
        # sampling._weights for every plain row at once: exp(score - row max) in float32.
        weights = np.empty(block.shape, dtype=np.float32)
        np.subtract(block, block.max(axis=1, keepdims=True), out=weights, casting="same_kind")
        np.exp(weights, out=weights)
        for i, b in enumerate(plain):
            sampler = samplers[b]
            assert sampler._rng is not None
            tokens[b] = _pick(weights[i], sampler._rng.random())
    for b, sampler in enumerate(samplers):
        if _truncates(sampler):
            tokens[b] = sampler._draw(scores[b])
        if sampler.config.counts_output:
            counts = sampler._output_counts
            counts[tokens[b]] = counts.get(tokens[b], 0) + 1
    return tokens


def _config(b: int, params: str) -> SamplingConfig:
    if params == "mixed" and b % 3 == 1:
        return SamplingConfig(temperature=0.8, top_p=0.9, seed=b)
    if params == "mixed" and b % 3 == 2:
        return SamplingConfig(temperature=0.8, top_k=50, seed=b)
    return SamplingConfig(temperature=0.8, seed=b)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[8, 32])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--vocab", type=int, default=49_152)
    p.add_argument("--params", choices=("temperature", "mixed"), default="temperature")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    for rows in a.rows:
        alone = [Sampler(_config(b, a.params), a.vocab) for b in range(rows)]
        batched = [Sampler(_config(b, a.params), a.vocab) for b in range(rows)]
        histories: list[list[int]] = [[1, 2, 3] for _ in range(rows)]
        rates: dict[str, list[float]] = {"per_row": [], "batched": []}
        for round_ in range(a.rounds):
            logits = (rng.standard_normal((rows, a.vocab)) * 3).astype(np.float32)
            arms = ["per_row", "batched"] if round_ % 2 == 0 else ["batched", "per_row"]
            for arm in arms:
                started = time.thread_time()
                if arm == "per_row":
                    got = [s.choose(logits[b], histories[b])[0] for b, s in enumerate(alone)]
                else:
                    got = sample_rows(batched, logits, histories)
                rates[arm].append(rows / max(time.thread_time() - started, 1e-9))
                rates.setdefault(f"tokens_{arm}", []).append(got)  # type: ignore[arg-type]
            assert rates["tokens_per_row"][-1] == rates["tokens_batched"][-1]
        median = {arm: statistics.median(rates[arm]) for arm in ("per_row", "batched")}
        print(json.dumps({"rows": rows, "vocab": a.vocab, "params": a.params,
                          "rounds": a.rounds,
                          "tokens_per_cpu_s": {k: round(v) for k, v in median.items()},
                          "batched_over_per_row": round(median["batched"] / median["per_row"],
                                                        3),
                          "same_tokens": True}), flush=True)


if __name__ == "__main__":
    main()
