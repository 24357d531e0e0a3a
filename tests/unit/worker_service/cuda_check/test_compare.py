"""cuda_check's CUDA-mode comparison (worker_service/cuda_check/compare.py) on synthetic
logits: what fp16 rounding does passes; a wrong row's logits and a stale past's fail, and
the failure names the numbers."""

from __future__ import annotations

import numpy as np
import pytest

from worker_service.cuda_check import compare

VOCAB, POSITIONS = 49_152, 12


@pytest.fixture(scope="module")
def reference() -> np.ndarray:
    # Logits of SmolLM2's scale: |logit| up to ~25, a clear winner per position.
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 4.0, (POSITIONS, VOCAB)).astype(np.float32)
    logits[np.arange(POSITIONS), rng.integers(0, VOCAB, POSITIONS)] += 8.0
    return logits


def fp16_run(logits: np.ndarray, seed: int = 1) -> np.ndarray:
    """What another fp16 schedule of the same math gives: fp16 rounding plus a few ulps of
    accumulation noise (relative 2e-3)."""
    rng = np.random.default_rng(seed)
    noisy = logits * (1 + rng.normal(0.0, 2e-3, logits.shape)) + rng.normal(0, 2e-3, logits.shape)
    return noisy.astype(np.float16).astype(np.float32)


def test_fp16_scale_noise_passes_with_its_numbers(reference):
    got = compare.compare_logits(reference, fp16_run(reference), compare.SAME_DEVICE)
    assert got["ok"], got["why"]
    assert 0 < got["max_abs_diff"] <= got["tolerance"]
    assert got["argmax_agree"] == POSITIONS and got["positions"] == POSITIONS
    assert got["ref_abs_max"] == pytest.approx(float(np.abs(reference).max()), rel=1e-6)
    assert got["why"] == ""


def test_an_argmax_flip_at_a_near_tie_is_forgiven_and_counted(reference):
    ref = reference.copy()
    best = ref[3].argmax()
    second = np.argsort(ref[3])[-2]
    ref[3, second] = ref[3, best] - 0.01  # a near tie
    got = ref.copy()
    got[3, second], got[3, best] = ref[3, best], ref[3, second]  # the tie broken the other way
    result = compare.compare_logits(ref, got, compare.SAME_DEVICE)
    assert result["ok"], result["why"]
    assert result["near_ties"] >= 1 and result["argmax_agree"] == POSITIONS - 1


def test_a_perturbed_row_another_sequence_s_logits_fails_naming_the_numbers(reference):
    got = fp16_run(reference)
    other = np.random.default_rng(7).normal(0.0, 4.0, VOCAB).astype(np.float32)
    got[5] = other  # row 5 read another row's logits
    result = compare.compare_logits(reference, got, compare.SAME_DEVICE)
    assert not result["ok"]
    assert result["worst_position"] == 5 and result["max_abs_diff"] > 5 * result["tolerance"]
    assert 5 in result["argmax_disagree_at"]
    why = result["why"]
    assert f"{result['max_abs_diff']:.4g}" in why and "position 5" in why
    assert f"{result['tolerance']:.4g}" in why and "argmax differs" in why


def test_a_stale_past_logits_of_a_different_prefix_fails(reference):
    # From position 4 on the run attended to a stale past: the logits of a related but
    # different prefix (most of the signal shared, the rest another context's).
    got = fp16_run(reference)
    other = np.random.default_rng(11).normal(0.0, 4.0, (POSITIONS - 4, VOCAB)).astype(np.float32)
    got[4:] = 0.8 * reference[4:] + 0.2 * other
    result = compare.compare_logits(reference, got, compare.SAME_DEVICE)
    assert not result["ok"] and result["worst_position"] >= 4
    assert result["max_abs_diff"] > result["tolerance"]
    assert "max |d|" in result["why"] and f"{result['ref_abs_max']:.4g}" in result["why"]
    # Even the looser tolerances (history recomputed, another device) do not let it pass.
    for loose in (compare.RECOMPUTED, compare.ACROSS_DEVICES):
        assert not compare.compare_logits(reference, got, loose)["ok"]


def test_compare_runs_reports_the_worst_and_which_sequence_failed(reference):
    good = fp16_run(reference)
    bad = fp16_run(reference, seed=2)
    bad[0] += 3.0
    result = compare.compare_runs([reference, reference], [good, bad], compare.SAME_DEVICE)
    assert not result["ok"] and result["failed_sequences"] == [1]
    assert result["sequences"] == 2 and result["positions"] == 2 * POSITIONS
    assert result["why"].startswith("sequence 1:")


def test_shapes_that_differ_fail_with_both_shapes(reference):
    result = compare.compare_logits(reference, reference[:3], compare.SAME_DEVICE)
    assert not result["ok"] and "[12, 49152]" in result["why"] and "[3, 49152]" in result["why"]


def test_nan_fails(reference):
    got = reference.copy()
    got[2, 10] = np.nan
    assert "NaN" in compare.compare_logits(reference, got, compare.SAME_DEVICE)["why"]


def test_exact_rules_for_tokens_and_moved_bytes():
    assert compare.exact_tokens([1, 2, 3], [1, 2, 3])["ok"]
    assert compare.exact_tokens([1, 2, 3], [1, 5, 3])["first_difference_at"] == 1
    assert compare.exact_tokens([1, 2], [1, 2, 3])["first_difference_at"] == 2
    a = np.arange(24, dtype=np.float16).reshape(2, 3, 4)
    b = a.copy()
    assert compare.exact_arrays([a], [b])["ok"]
    b[1, 2, 3] = np.nextafter(b[1, 2, 3], np.float16(100))  # one last bit
    moved = compare.exact_arrays([a], [b])
    assert not moved["ok"] and moved["first_differing"] == 0 and moved["differing_bytes"] >= 1
    # A non-contiguous view (a row's first n tokens) compares by its values.
    assert compare.exact_arrays([a[:, :2]], [a.copy()[:, :2]])["ok"]
