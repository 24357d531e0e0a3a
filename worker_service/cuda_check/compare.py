"""How cuda_check judges two runs of the same tokens: pure functions over numpy arrays.

Why not tokens (DESIGN.md, "On the GPU"): CUDA picks kernels and splits by batch
size and length (cuBLAS split-K, GroupQueryAttention's flash `num_splits`), fp16
never equals the CPU, and on random weights a last-bit difference moves a
sampled token. A check that compares sampled tokens fails when the code is right
and cannot tell a defect from rounding. So on CUDA both runs are TEACHER-FORCED:
the same prompt and the same continuation, whatever the model would have
picked, and the logits at every position are compared:

- max |d| over every position and vocabulary entry, within
  `atol + rtol x max |reference logit|` (the tolerance, stated in the JSON);
- the argmax agrees at every position, except where the reference's best two
  logits are closer than `near_tie` (a near tie: rounding may pick either).

A wrong row (another sequence's logits), a stale past (logits of another
prefix) or broken padding moves logits by the scale of the logits themselves,
far past fp16 rounding; the failure names the numbers. Bit-exact comparison
(`exact_tokens`) stays the rule where bytes only move or the device is the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """How far two teacher-forced runs' logits may differ and still be the same computation."""

    atol: float  # absolute floor
    rtol: float  # share of the reference's largest |logit|
    near_tie: float  # a reference top-2 gap below this forgives an argmax disagreement

    def bound(self, ref_abs_max: float) -> float:
        """The largest |d| allowed against a reference whose largest |logit| is this."""
        return self.atol + self.rtol * ref_abs_max

    def as_dict(self) -> dict:
        return asdict(self)


# One device, two schedules of the same math (batch sizes, lengths, a cache hit's
# chunks): fp16 rounding of kernels chosen per shape. ~10 fp16 ulps at |logit| 16.
SAME_DEVICE = Tolerance(atol=0.05, rtol=0.01, near_tie=0.05)
# The same tokens with the history computed another way: a token at a time (a session's
# earlier turns, decoded) against one prefill (a fresh run). On a graph that quantizes its
# activations (int4 MatMulNBits, accuracy level 4) the two paths differ by whole
# quantization steps: max |d| 0.83 at max |logit| 26 on SmolLM2 int4 on the CPU (fp32:
# 4e-5). A stale past or a wrong row moves logits by their own scale and the argmax.
RECOMPUTED = Tolerance(atol=0.1, rtol=0.05, near_tie=0.1)
# CUDA fp16 against the CPU provider on the same folder: other kernels, other
# accumulation orders and types.
ACROSS_DEVICES = Tolerance(atol=0.1, rtol=0.02, near_tie=0.1)


def compare_logits(reference: np.ndarray, got: np.ndarray, tolerance: Tolerance) -> dict:
    """Judge `got` against `reference`, both [positions, vocab] logits of the same tokens.

    Returns the numbers and the verdict as a JSON-ready dict: ok, max_abs_diff,
    ref_abs_max, tolerance (the bound), atol, rtol, near_tie, positions,
    worst_position, argmax_agree, argmax_disagree_at (positions not near ties),
    near_ties, and `why` (empty when ok) naming what failed and its numbers.
    """
    ref = np.asarray(reference, dtype=np.float32)
    out = np.asarray(got, dtype=np.float32)
    if ref.ndim == 1:
        ref, out = ref[None], out[None] if out.ndim == 1 else out
    result: dict = {"ok": False, **tolerance.as_dict(), "positions": int(ref.shape[0])}
    if ref.shape != out.shape or ref.ndim != 2 or ref.shape[0] == 0:
        result["why"] = (f"shapes differ or are empty: reference {list(ref.shape)}, "
                         f"got {list(out.shape)} (positions x vocab expected)")
        return result
    finite = bool(np.isfinite(ref).all() and np.isfinite(out).all())
    diff = np.abs(out - ref)
    per_position = diff.max(axis=1)
    ref_abs_max = float(np.abs(ref).max())
    bound = tolerance.bound(ref_abs_max)
    top2 = np.sort(ref, axis=1)[:, -2:] if ref.shape[1] > 1 else np.concatenate(
        [ref, ref], axis=1)
    gap = top2[:, 1] - top2[:, 0]
    near = gap < tolerance.near_tie
    agree = ref.argmax(axis=1) == out.argmax(axis=1)
    disagree_at = [int(p) for p in np.flatnonzero(~agree & ~near)]
    max_abs = float(per_position.max())
    result.update({
        "max_abs_diff": round(max_abs, 6), "ref_abs_max": round(ref_abs_max, 6),
        "tolerance": round(bound, 6), "worst_position": int(per_position.argmax()),
        "mean_abs_diff": round(float(diff.mean()), 8),
        "argmax_agree": int(agree.sum()), "argmax_disagree_at": disagree_at[:20],
        "near_ties": int(near.sum()), "finite": finite})
    problems = []
    if not finite:
        problems.append("a logit is NaN or infinite")
    if max_abs > bound:
        problems.append(f"max |d| {max_abs:.4g} at position {result['worst_position']} is past "
                        f"the tolerance {bound:.4g} (atol {tolerance.atol:g} + rtol "
                        f"{tolerance.rtol:g} x max |logit| {ref_abs_max:.4g})")
    if disagree_at:
        problems.append(f"the argmax differs at {len(disagree_at)} of {ref.shape[0]} positions "
                        f"that are not near ties (top-2 gap >= {tolerance.near_tie:g}), first "
                        f"at position {disagree_at[0]}")
    result["ok"] = not problems
    result["why"] = "; ".join(problems)
    return result


def compare_runs(reference: Sequence[np.ndarray], got: Sequence[np.ndarray],
                 tolerance: Tolerance) -> dict:
    """`compare_logits` over several sequences (their runs in the same order): the
    worst figures over all of them, and each sequence's own verdict where one fails."""
    if len(reference) != len(got):
        return {"ok": False, **tolerance.as_dict(),
                "why": f"{len(reference)} reference runs, {len(got)} compared"}
    each = [compare_logits(r, g, tolerance) for r, g in zip(reference, got, strict=True)]
    failed = [i for i, c in enumerate(each) if not c["ok"]]
    worst = max(each, key=lambda c: c.get("max_abs_diff", float("inf")), default={})
    summary = {"ok": not failed and bool(each), **tolerance.as_dict(),
               "sequences": len(each),
               "positions": sum(c["positions"] for c in each),
               "max_abs_diff": worst.get("max_abs_diff"),
               "ref_abs_max": max((c.get("ref_abs_max", 0.0) for c in each), default=0.0),
               "tolerance": worst.get("tolerance"),
               "argmax_agree": sum(c.get("argmax_agree", 0) for c in each),
               "near_ties": sum(c.get("near_ties", 0) for c in each),
               "failed_sequences": failed}
    summary["why"] = "; ".join(f"sequence {i}: {each[i]['why']}" for i in failed[:3])
    return summary


def exact_tokens(reference: Sequence[int], got: Sequence[int]) -> dict:
    """Bit-exact comparison of two token runs (the dry run's rule): ok, the first position
    where they differ (None when equal) and both lengths."""
    ref, out = list(reference), list(got)
    first = next((i for i, (a, b) in enumerate(zip(ref, out, strict=False)) if a != b),
                 None if len(ref) == len(out) else min(len(ref), len(out)))
    return {"ok": first is None, "first_difference_at": first, "tokens": [len(ref), len(out)]}


def exact_arrays(reference: Sequence[np.ndarray], got: Sequence[np.ndarray]) -> dict:
    """Bit-exact comparison of moved bytes (K/V copied out and back): ok, the arrays
    compared, the first that differs and how many of its elements do."""
    if len(reference) != len(got):
        return {"ok": False, "arrays": [len(reference), len(got)], "first_differing": 0}
    for i, (a, b) in enumerate(zip(reference, got, strict=True)):
        a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
        if a.shape != b.shape or a.dtype != b.dtype:
            return {"ok": False, "arrays": len(reference), "first_differing": i,
                    "why": f"array {i}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"}
        same = a.reshape(-1).view(np.uint8) == b.reshape(-1).view(np.uint8)
        if not same.all():
            return {"ok": False, "arrays": len(reference), "first_differing": i,
                    "differing_bytes": int((~same).sum()),
                    "why": f"array {i}: {int((~same).sum())} of {same.size} bytes differ"}
    return {"ok": True, "arrays": len(reference), "first_differing": None}
