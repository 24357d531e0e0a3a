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

from collections.abc import Callable, Iterable

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


class VerifyCosts:
    """Whether verifying a row's proposal pays in this step, from measured run times.

    A step without speculation costs one shared decode run D(n) over its n rows
    and yields n tokens. Verifying a row's proposal costs one more run, batch 1
    (ORT's CPU attention takes several new tokens over a past only at batch 1),
    of V seconds, and yields the tokens it is expected to accept, a. Rows are
    taken best first while each raises the step's tokens per second:
    (tokens + a) / (cost + V) > tokens / cost. When every row verifies, the
    shared run is not needed at all and the step costs r x V. D(n) and V are
    moving averages of the engine's own runs; before one is measured, the rule
    verifies (the measurement needs a run), taking an unmeasured D(n) as V. A
    measurement taken while the machine was busy must not stop verification for
    good: every `probe_every`-th step the rule declines, it verifies anyway, so V
    stays current.
    """

    def __init__(self, weight: float = 0.2, probe_every: int = 16) -> None:
        self.weight = weight
        self.probe_every = probe_every
        self._declined = 0  # steps declined since the last verification
        self._decode_s: dict[int, float] = {}  # rows -> seconds per shared decode run
        self._verify_s: float | None = None  # seconds per verification run

    def record(self, decode_rows: int, decode_s: float, verify_s: Iterable[float]) -> None:
        """One step's measured runs: its plain decode (if any) and each verification."""
        self.record_decode(decode_rows, decode_s)
        for seconds in verify_s:
            self.record_verify(seconds)

    def record_decode(self, rows: int, seconds: float) -> None:
        if rows > 0 and seconds > 0:
            self._decode_s[rows] = _average(self._decode_s.get(rows), seconds, self.weight)

    def record_verify(self, seconds: float) -> None:
        if seconds > 0:
            self._verify_s = _average(self._verify_s, seconds, self.weight)

    def chosen(self, rows: int, gains: list[float]) -> int:
        """How many of the candidates, best first (`gains`: expected accepted tokens,
        sorted descending), to verify in a step of `rows` running rows."""
        verify = self._verify_s
        if verify is None or not gains:
            return len(gains)
        decode = self._decode_s.get(rows, verify)
        if len(gains) == rows and (rows + sum(gains)) / (rows * verify) > rows / decode:
            self._declined = 0
            return rows  # every row verifies and the shared run is skipped
        tokens, cost, taken = float(rows), decode, 0
        for gain in gains:
            if (tokens + gain) / (cost + verify) <= tokens / cost:
                break
            tokens, cost, taken = tokens + gain, cost + verify, taken + 1
        if taken:
            self._declined = 0
            return taken
        self._declined += 1
        if self._declined >= self.probe_every:
            self._declined = 0
            return 1  # a probe: the best candidate verifies, and V is measured again
        return 0


def _average(current: float | None, sample: float, weight: float) -> float:
    return sample if current is None else current + weight * (sample - current)
