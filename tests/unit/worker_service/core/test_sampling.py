"""Sampler and SamplingConfig on fixed logits: no model needed."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from ortserve.status.errors import InvalidField
from worker_service.core.sampling import Sampler, SamplingConfig, apply_repetition_penalty

VOCAB = 50
# A fixed, strictly ordered distribution: token 0 most likely, then 1, ...
LOGITS = np.linspace(3.0, -3.0, VOCAB).astype(np.float32)


def draws(config: SamplingConfig, n: int, logits: np.ndarray = LOGITS) -> list[int]:
    sampler = Sampler(config, logits.size)
    return [sampler(logits, []) for _ in range(n)]


def entropy_bits(tokens: list[int]) -> float:
    counts = np.array(list(Counter(tokens).values()), dtype=np.float64)
    p = counts / counts.sum()
    return float(-(p * np.log2(p)).sum())


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (SamplingConfig(temperature=-0.1), "sampling.temperature"),
        (SamplingConfig(temperature=math.inf), "sampling.temperature"),
        (SamplingConfig(temperature=math.nan), "sampling.temperature"),
        (SamplingConfig(temperature=1.0, top_k=-1), "sampling.top_k"),
        (SamplingConfig(temperature=1.0, top_p=0.0), "sampling.top_p"),
        (SamplingConfig(temperature=1.0, top_p=1.5), "sampling.top_p"),
        (SamplingConfig(temperature=1.0, top_p=math.nan), "sampling.top_p"),
        (SamplingConfig(temperature=1.0, seed=-3), "sampling.seed"),
        (SamplingConfig(repetition_penalty=0.0), "sampling.repetition_penalty"),
        (SamplingConfig(repetition_penalty=-1.0), "sampling.repetition_penalty"),
        (SamplingConfig(repetition_penalty=math.inf), "sampling.repetition_penalty"),
        # Greedy has no use for these: rejected, never silently ignored.
        (SamplingConfig(top_k=5), "sampling.top_k"),
        (SamplingConfig(temperature=0.0, top_p=0.9), "sampling.top_p"),
        (SamplingConfig(seed=1), "sampling.seed"),
    ],
)
def test_bad_sampling_field_is_rejected_naming_the_field(config, field):
    with pytest.raises(InvalidField) as info:
        config.validate()
    assert info.value.field == field
    assert field in str(info.value)


def test_greedy_rejection_says_how_to_sample():
    with pytest.raises(InvalidField, match="set temperature > 0 to sample, or drop top_k"):
        SamplingConfig(top_k=3).validate()


@pytest.mark.parametrize(
    "config",
    [
        SamplingConfig(),
        SamplingConfig(temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.3),
        SamplingConfig(temperature=0.7, top_k=40, top_p=0.9, seed=0, repetition_penalty=1.1),
    ],
)
def test_valid_configs_pass(config):
    config.validate()


def test_greedy_is_argmax_and_has_no_seed():
    sampler = Sampler(SamplingConfig(), VOCAB)
    shuffled = np.random.default_rng(0).permutation(LOGITS)
    assert sampler(shuffled, []) == int(np.argmax(shuffled))
    assert sampler.seed is None


def test_same_seed_same_tokens_and_different_seeds_differ():
    config = SamplingConfig(temperature=1.0, seed=1234)
    assert draws(config, 200) == draws(config, 200)
    assert draws(config, 200) != draws(SamplingConfig(temperature=1.0, seed=1235), 200)


def test_unset_seed_is_resolved_and_reproduces_the_draws():
    sampler = Sampler(SamplingConfig(temperature=1.0), VOCAB)
    assert isinstance(sampler.seed, int) and sampler.seed >= 0
    first = [sampler(LOGITS, []) for _ in range(100)]
    assert draws(SamplingConfig(temperature=1.0, seed=sampler.seed), 100) == first


def test_top_k_1_is_always_the_argmax():
    assert set(draws(SamplingConfig(temperature=5.0, top_k=1, seed=3), 500)) == {0}


def test_top_k_5_never_leaves_the_top_5():
    tokens = draws(SamplingConfig(temperature=5.0, top_k=5, seed=4), 2000)
    assert set(tokens) == {0, 1, 2, 3, 4}


def test_high_temperature_spreads_the_distribution():
    cold = draws(SamplingConfig(temperature=0.3, seed=5), 2000)
    hot = draws(SamplingConfig(temperature=3.0, seed=5), 2000)
    assert len(set(hot)) > len(set(cold))
    assert entropy_bits(hot) > entropy_bits(cold) + 1.0


def test_temperature_1_matches_the_softmax():
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    n = 20000
    counts = Counter(draws(SamplingConfig(temperature=1.0, seed=6), n, logits))
    expected = np.exp(logits) / np.exp(logits).sum()
    for token, p in enumerate(expected):
        assert abs(counts[token] / n - p) < 0.015


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    logits = np.log(probs).astype(np.float32)
    n = 4000
    # 0.5 < 0.75 <= 0.5 + 0.3: tokens 0 and 1, renormalised to 0.625 / 0.375.
    counts = Counter(draws(SamplingConfig(temperature=1.0, top_p=0.75, seed=7), n, logits))
    assert set(counts) == {0, 1}
    assert abs(counts[0] / n - 0.625) < 0.03
    # 0.8 < 0.85 <= 0.95: three tokens.
    assert set(draws(SamplingConfig(temperature=1.0, top_p=0.85, seed=7), n, logits)) == {0, 1, 2}
    # A tiny top_p still keeps the most likely token.
    assert set(draws(SamplingConfig(temperature=1.0, top_p=0.01, seed=7), 200, logits)) == {0}


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits():
    scores = np.array([2.0, -1.0, 0.5, 4.0])
    apply_repetition_penalty(scores, [0, 1, 1, 0], 2.0)
    np.testing.assert_allclose(scores, [1.0, -2.0, 0.5, 4.0])
    scores = np.array([2.0, -1.0])
    apply_repetition_penalty(scores, [0, 1], 0.5)  # < 1 favours repeats
    np.testing.assert_allclose(scores, [4.0, -0.5])


def test_repetition_penalty_changes_the_greedy_choice():
    logits = np.array([1.0, 0.9, -3.0], dtype=np.float32)
    assert Sampler(SamplingConfig(), 3)(logits, [0]) == 0
    assert Sampler(SamplingConfig(repetition_penalty=2.0), 3)(logits, [0]) == 1
    negative = np.array([-1.0, -1.5], dtype=np.float32)
    assert Sampler(SamplingConfig(repetition_penalty=2.0), 2)(negative, [0, 0, 0]) == 1


def test_suppressed_tokens_are_never_chosen_until_released():
    sampler = Sampler(SamplingConfig(), VOCAB)
    sampler.suppress([0, 1])
    assert sampler(LOGITS, []) == 2
    sampler.suppress([])
    assert sampler(LOGITS, []) == 0
    hot = Sampler(SamplingConfig(temperature=2.0, seed=8), VOCAB)
    hot.suppress([0])
    assert 0 not in {hot(LOGITS, []) for _ in range(500)}


# -- the draw's helpers: the same distribution as a full sort and a full running sum --------

def reference_nucleus(scores: np.ndarray, top_p: float) -> np.ndarray:
    """The plain definition: a stable sort of the whole row, the smallest prefix reaching top_p."""
    order = np.argsort(-scores, kind="stable")
    probs = np.exp(scores[order] - scores.max())
    cumulative = np.cumsum(probs / probs.sum())
    return order[:int(np.searchsorted(cumulative, top_p, side="left")) + 1]


@pytest.mark.parametrize("scale", [0.3, 1.0, 4.0])
@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.99])
def test_nucleus_equals_a_full_stable_sort(scale, top_p):
    from worker_service.core.sampling import _nucleus, _weights

    rng = np.random.default_rng(int(scale * 10 + top_p * 100))
    scores = rng.standard_normal(5000) * scale
    scores[rng.integers(0, 5000, 300)] = np.round(scores.max(), 1)  # ties at the top
    scores[:50] = -np.inf  # masked tokens (a constraint, a suppressed EOS)
    got = _nucleus(scores, _weights(scores), top_p)
    want = reference_nucleus(scores, top_p)
    # Equal but for float rounding at the very boundary (sums taken in another order).
    assert abs(got.size - want.size) <= 1
    common = min(got.size, want.size)
    assert np.array_equal(got[:common], want[:common])


@pytest.mark.parametrize("size", [7, 1000, 49152, 50001])
def test_pick_draws_in_proportion_and_never_a_zero_weight(size):
    from worker_service.core.sampling import _pick

    rng = np.random.default_rng(size)
    weights = np.zeros(size, dtype=np.float32)
    hot = rng.choice(size, min(size, 5), replace=False)
    weights[hot] = [1.0, 2.0, 3.0, 4.0, 10.0][:hot.size]
    draws = Counter(_pick(weights, rng.random()) for _ in range(4000))
    assert set(draws) <= set(hot.tolist())  # a zero weight is never picked
    total = float(weights.sum())
    for token, count in draws.items():
        assert abs(count / 4000 - weights[token] / total) < 0.03
    # The ends of [0, 1): the first and the last token that can be picked.
    assert _pick(weights, 0.0) == int(np.flatnonzero(weights)[0])
    assert _pick(weights, np.nextafter(1.0, 0.0)) == int(np.flatnonzero(weights)[-1])


def test_a_temperature_draw_over_a_long_row_follows_the_softmax():
    row = np.full(49152, -30.0, dtype=np.float32)
    row[[5, 20_000, 49_151]] = [0.0, np.log(2.0), np.log(5.0)]  # softmax ~ 1 : 2 : 5
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=11), row.size)
    draws = Counter(sampler(row, []) for _ in range(4000))
    assert set(draws) <= {5, 20_000, 49_151}
    assert abs(draws[49_151] / 4000 - 5 / 8) < 0.03
    assert abs(draws[20_000] / 4000 - 2 / 8) < 0.03
