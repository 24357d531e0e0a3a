"""Log-probabilities of a chosen token and its most likely alternatives, from one row.

Pure numpy, and only run when a request asked for them: one log-sum-exp over
the row (the normaliser) and, for k alternatives, one `argpartition` (O(V))
plus a sort of k entries, never a sort of the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TokenLogprobs:
    """The chosen token's natural-log probability and the `top` most likely tokens,
    most likely first (ties by token id), as (token id, logprob) pairs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def log_normaliser(scores: np.ndarray) -> float:
    """log(sum(exp(scores))), computed stably (scores may hold -inf, never all of them).

    The exp runs in float32 (3x faster than float64 here, measured on the 49k row):
    after the max is subtracted every term is in (0, 1], numpy's pairwise sum keeps
    the relative error near 1e-7, and the answer goes out as a proto float anyway.
    """
    peak = float(np.max(scores))
    shifted = (scores - peak).astype(np.float32)
    return peak + float(np.log(np.sum(np.exp(shifted), dtype=np.float64)))


def top_indices(scores: np.ndarray, k: int) -> np.ndarray:
    """The k highest-scoring indices, highest first, ties by index (stable, reproducible)."""
    k = min(k, scores.size)
    if k <= 0:
        return np.zeros(0, dtype=np.int64)
    # argpartition on the row itself (no negated copy): the k largest are its tail.
    picked = np.argpartition(scores, -k)[-k:] if k < scores.size else np.arange(scores.size)
    # lexsort: the last key is the primary one.
    return picked[np.lexsort((picked, -scores[picked]))]


def token_logprobs(scores: np.ndarray, token_id: int, top_k: int) -> TokenLogprobs:
    """The log-softmax of `scores` (1-D, the logits the sampler chose from) at `token_id`,
    with the `top_k` most likely tokens. Probabilities of the top entries sum to <= 1."""
    normaliser = log_normaliser(scores)
    top = tuple((int(i), float(scores[i] - normaliser)) for i in top_indices(scores, top_k))
    return TokenLogprobs(token_id, float(scores[token_id] - normaliser), top)
