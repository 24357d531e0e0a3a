"""Verifying a proposed token against the distribution the sampler would draw from.

The speculative rejection rule (Leviathan et al., "Fast Inference from
Transformers via Speculative Decoding", 2023; Chen et al., "Accelerating Large
Language Model Decoding with Speculative Sampling", 2023): with target
probabilities p and a draft drawn from q, accept the draft x with probability
min(1, p(x) / q(x)); on rejection draw from the residual max(0, p - q),
normalised. The result is distributed exactly as p. A prompt-lookup draft is
deterministic, q a point mass at x, so the rule reads: accept x with
probability p(x); else draw from p with x removed, renormalised.

`p` here is what the sampler's own draw uses: the logits after the mask, the
penalties, logit_bias and temperature, truncated by top_k, min_p and top_p
(sampling.Sampler). Greedy needs no rule: the argmax either is the draft or it
is the token that replaces it.

Pure numpy: no ORT, no grpc.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def accept_point_draft(weights: np.ndarray, draft_index: int | None,
                       uniform: Callable[[], float],
                       pick: Callable[[np.ndarray, float], int]) -> int:
    """The index drawn for a point-mass draft at `draft_index` under the target `weights`
    (unnormalised probabilities, >= 0, some positive).

    `draft_index` None: the draft is not among the candidates (p = 0), so it is
    rejected and the residual is p itself. `uniform()` gives the draws (the
    sequence's own generator); `pick(weights, u)` is the sampler's inverse-CDF
    draw. The draft was accepted exactly when the returned index is
    `draft_index`: the residual gives the draft no mass.
    """
    if draft_index is None:
        return pick(weights, uniform())
    total = float(weights.sum(dtype=np.float64))
    if uniform() * total < float(weights[draft_index]):
        return draft_index
    residual = weights.copy()
    residual[draft_index] = 0
    if not residual.any():
        # p was a point mass at the draft (up to rounding): nothing else can be drawn.
        return draft_index
    return pick(residual, uniform())
