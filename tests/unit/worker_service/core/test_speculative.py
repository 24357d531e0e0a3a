"""The speculative rejection rule keeps the sampler's distribution exactly (pure, no model).

A toy "model" over a small vocabulary (logits that depend on the previous
token) is sampled two tokens at a time, with and without a proposed draft, at
temperature 1 and under every parameter the sampler applies. The pair
frequencies are compared with the exact target probabilities by a chi-square
statistic; the generators are seeded, so each test is deterministic. The last
test breaks the rule on purpose and shows the same check catches it.
"""

from __future__ import annotations

import numpy as np
import pytest

from worker_service.core import sampling, speculative
from worker_service.core.sampling import Sampler, SamplingConfig

VOCAB = 6
TRIALS = 6000
# The chi-square statistic's 0.9999 quantile for up to 35 degrees of freedom is 71.6:
# a correct rule exceeds it once in 10,000 seeds; a biased one by far (see the last test).
CHI2_LIMIT = 72.0

_TABLE = np.random.default_rng(7).normal(0, 1.5, size=(VOCAB + 1, VOCAB)).astype(np.float32)


def model_logits(previous: int) -> np.ndarray:
    """The toy model: the next token's logits after `previous` (VOCAB: the prompt's end)."""
    return _TABLE[previous]


def target(config: SamplingConfig, logits: np.ndarray, history: list[int],
           counts: dict[int, int]) -> np.ndarray:
    """The exact distribution Sampler draws from, written out independently of it."""
    scores = logits.astype(np.float64).copy()
    if config.repetition_penalty:
        for t in set(history):
            scores[t] = scores[t] / config.repetition_penalty if scores[t] > 0 else (
                scores[t] * config.repetition_penalty)
    for t, c in counts.items():
        scores[t] -= (config.frequency_penalty or 0) * c + (config.presence_penalty or 0)
    for t, b in config.logit_bias:
        scores[t] += b
    scores /= config.temperature
    keep = np.ones(VOCAB, dtype=bool)
    if config.top_k:
        keep &= scores >= np.sort(scores)[-config.top_k]
    if config.min_p:
        keep &= scores >= scores[keep].max() + np.log(config.min_p)
    p = np.where(keep, np.exp(scores - scores.max()), 0.0)
    if config.top_p is not None and config.top_p < 1:
        order = np.argsort(-p, kind="stable")
        cumulative = np.cumsum(p[order]) / p.sum()
        cut = int(np.searchsorted(cumulative, config.top_p)) + 1
        kept = np.zeros(VOCAB, dtype=bool)
        kept[order[:cut]] = True
        p = np.where(kept, p, 0.0)
    return p / p.sum()


def exact_pairs(config: SamplingConfig, prompt: list[int]) -> np.ndarray:
    """P(t1, t2) of two sampled tokens after `prompt`."""
    p1 = target(config, model_logits(prompt[-1]), prompt, {})
    pairs = np.zeros((VOCAB, VOCAB))
    for t1 in range(VOCAB):
        if p1[t1] > 0:
            pairs[t1] = p1[t1] * target(config, model_logits(t1), [*prompt, t1], {t1: 1})
    return pairs


def sample_pairs(config: SamplingConfig, prompt: list[int], draft: list[int],
                 seed: int) -> np.ndarray:
    """Pair counts from TRIALS two-token generations, each verifying `draft` the way the
    engine does: position i gets draft[i] while every earlier draft was accepted."""
    counts = np.zeros((VOCAB, VOCAB))
    for trial in range(TRIALS):
        sampler = Sampler(SamplingConfig(**{**config.__dict__, "seed": seed * 100_003 + trial}),
                          VOCAB)
        history = list(prompt)
        accepted_so_far = True
        for i in range(2):
            proposed = draft[i] if accepted_so_far and i < len(draft) else None
            token = sampler(model_logits(history[-1]), history, draft=proposed) if (
                proposed is not None) else sampler(model_logits(history[-1]), history)
            accepted_so_far = proposed is not None and token == proposed
            history.append(token)
        counts[history[-2], history[-1]] += 1
    return counts


def chi_square(counts: np.ndarray, probabilities: np.ndarray) -> float:
    expected = probabilities * counts.sum()
    support = expected > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was drawn"
    return float((((counts - expected) ** 2)[support] / expected[support]).sum())


CONFIGS = {
    "temperature 1": SamplingConfig(temperature=1.0),
    "top_k 3": SamplingConfig(temperature=1.0, top_k=3),
    "top_p 0.8": SamplingConfig(temperature=1.0, top_p=0.8),
    "min_p 0.1": SamplingConfig(temperature=1.0, min_p=0.1),
    "penalties and bias": SamplingConfig(temperature=1.0, repetition_penalty=1.3,
                                         frequency_penalty=0.7, presence_penalty=0.4,
                                         logit_bias=((2, 1.5), (4, -1.0))),
}
PROMPT = [VOCAB - 1, 3]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("draft", [[2, 2], [0, 5], [1]])
def test_verified_drafts_leave_the_output_distribution_unchanged(name, draft):
    config = CONFIGS[name]
    stat = chi_square(sample_pairs(config, PROMPT, draft, seed=1), exact_pairs(config, PROMPT))
    assert stat < CHI2_LIMIT, f"{name}, draft {draft}: chi-square {stat:.1f}"


def test_without_a_draft_the_same_check_passes():
    """The reference itself: the plain sampler against the exact pair distribution."""
    config = CONFIGS["penalties and bias"]
    stat = chi_square(sample_pairs(config, PROMPT, [], seed=2), exact_pairs(config, PROMPT))
    assert stat < CHI2_LIMIT


def test_the_check_fails_when_the_rule_is_broken(monkeypatch):
    """On rejection, drawing from p (the draft still in it) instead of the residual makes
    the draft likelier than p says: the same statistic is far past its limit."""

    def broken(weights, draft_index, uniform, pick):
        if draft_index is not None and uniform() * weights.sum() < weights[draft_index]:
            return draft_index
        return pick(weights, uniform())

    monkeypatch.setattr(speculative, "accept_point_draft", broken)
    config = CONFIGS["temperature 1"]
    stat = chi_square(sample_pairs(config, PROMPT, [2, 2], seed=1), exact_pairs(config, PROMPT))
    assert stat > 2 * CHI2_LIMIT


def test_a_draft_outside_the_candidates_is_always_replaced():
    config = SamplingConfig(temperature=1.0, top_k=1, seed=3)
    best = int(np.argmax(model_logits(3)))
    other = (best + 1) % VOCAB
    sampler = Sampler(config, VOCAB)
    assert all(sampler(model_logits(3), [3], draft=other) == best for _ in range(50))


def test_greedy_ignores_the_draft():
    sampler = Sampler(SamplingConfig(), VOCAB)
    best = int(np.argmax(model_logits(3)))
    assert sampler(model_logits(3), [3], draft=(best + 1) % VOCAB) == best
    assert sampler(model_logits(3), [3], draft=best) == best


def test_point_mass_target_keeps_its_draft():
    weights = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    assert speculative.accept_point_draft(weights, 1, lambda: 0.999999, sampling._pick) == 1
    assert speculative.accept_point_draft(weights, 0, lambda: 0.5, sampling._pick) == 1


def test_verify_costs_take_rows_while_they_pay_and_probe_after_declining():
    costs = speculative.VerifyCosts(weight=1.0, probe_every=3)
    assert costs.chosen(4, [3.0, 1.0]) == 2  # nothing measured: verify, to measure
    costs.record_decode(4, 0.010)
    costs.record_verify(0.010)
    # 4 tokens in 10 ms; a row expecting 5 more in 10 ms more pays, one expecting 3 not.
    assert costs.chosen(4, [5.0, 3.0]) == 1
    assert costs.chosen(1, [0.5]) == 1  # alone: its verification replaces the decode run
    costs.record_decode(1, 0.004)
    assert [costs.chosen(1, [0.5]) for _ in range(3)] == [0, 0, 1]  # the third: a probe
