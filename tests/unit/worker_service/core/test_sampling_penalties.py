"""Presence/frequency penalties, logit_bias, min_p and log-probabilities on fixed logits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ortserve.status.errors import InvalidField
from worker_service.core.logprobs import token_logprobs, top_indices
from worker_service.core.sampling import Sampler, SamplingConfig

VOCAB = 50
LOGITS = np.linspace(3.0, -3.0, VOCAB).astype(np.float32)  # token 0 most likely, then 1, ...


def greedy_run(config: SamplingConfig, steps: int, logits: np.ndarray = LOGITS) -> list[int]:
    sampler = Sampler(config, logits.size)
    out: list[int] = []
    for _ in range(steps):
        out.append(sampler(logits, out))
    return out


def test_presence_penalty_moves_greedy_off_a_token_it_already_chose():
    # Token 0 leads token 1 by 6/49 ~ 0.12: a presence penalty of 0.5 makes it lose once chosen.
    assert greedy_run(SamplingConfig(), 3) == [0, 0, 0]
    assert greedy_run(SamplingConfig(presence_penalty=0.5), 3) == [0, 1, 2]


def test_frequency_penalty_grows_with_each_repetition():
    # Logits 3.0 and 1.0: token 0 pays 0.9 per use, so it wins until its count reaches 3.
    logits = np.array([3.0, 1.0, -5.0], dtype=np.float32)
    assert greedy_run(SamplingConfig(frequency_penalty=0.9), 4, logits) == [0, 0, 0, 1]
    # A presence penalty is paid once, whatever the count.
    assert greedy_run(SamplingConfig(presence_penalty=1.5), 4, logits) == [0, 0, 0, 0]


def test_negative_penalties_reward_repetition():
    logits = np.array([1.0, 1.1], dtype=np.float32)
    assert greedy_run(SamplingConfig(presence_penalty=-0.5), 3, logits) == [1, 1, 1]
    assert greedy_run(SamplingConfig(), 1, logits) == [1]


def test_penalties_count_only_the_output_not_the_prompt():
    sampler = Sampler(SamplingConfig(presence_penalty=2.0), VOCAB)
    assert sampler(LOGITS, [0, 0, 0]) == 0  # the prompt's zeros cost nothing


def test_logit_bias_bans_and_forces_under_greedy_and_sampling():
    ban = SamplingConfig(logit_bias=((0, -100.0),))
    assert greedy_run(ban, 2) == [1, 1]
    force = SamplingConfig(logit_bias=((37, 100.0),))
    assert greedy_run(force, 2) == [37, 37]
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=3, logit_bias=((37, 100.0),)), VOCAB)
    assert {sampler(LOGITS, []) for _ in range(200)} == {37}


def test_min_p_keeps_only_tokens_near_the_most_likely():
    # min_p 0.5 keeps tokens with p >= p0 / 2: score >= 3 - ln 2, i.e. tokens 0..5.
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=9, min_p=0.5), VOCAB)
    drawn = {sampler(LOGITS, []) for _ in range(3000)}
    threshold = 3.0 - math.log(2)
    allowed = {i for i in range(VOCAB) if LOGITS[i] >= threshold}
    assert drawn == allowed and 0 in drawn
    # min_p 1 keeps only the most likely.
    only = Sampler(SamplingConfig(temperature=2.0, seed=1, min_p=1.0), VOCAB)
    assert {only(LOGITS, []) for _ in range(200)} == {0}


def test_min_p_zero_changes_nothing():
    def draws(config):
        s = Sampler(config, VOCAB)
        return [s(LOGITS, []) for _ in range(300)]
    assert draws(SamplingConfig(temperature=1.0, seed=4, min_p=0.0)) == \
        draws(SamplingConfig(temperature=1.0, seed=4))


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (SamplingConfig(presence_penalty=2.5), "sampling.presence_penalty"),
        (SamplingConfig(frequency_penalty=-2.01), "sampling.frequency_penalty"),
        (SamplingConfig(frequency_penalty=math.nan), "sampling.frequency_penalty"),
        (SamplingConfig(temperature=1.0, min_p=1.5), "sampling.min_p"),
        (SamplingConfig(temperature=1.0, min_p=-0.1), "sampling.min_p"),
        (SamplingConfig(min_p=0.1), "sampling.min_p"),  # greedy: it would be ignored
        (SamplingConfig(logit_bias=((5, 100.5),)), "sampling.logit_bias[5]"),
        (SamplingConfig(logit_bias=((5, math.inf),)), "sampling.logit_bias[5]"),
        (SamplingConfig(logit_bias=tuple((i, 1.0) for i in range(301))), "sampling.logit_bias"),
    ],
)
def test_out_of_range_values_are_refused_naming_the_field(config, field):
    with pytest.raises(InvalidField) as info:
        config.validate()
    assert info.value.field == field


def test_edge_values_are_accepted():
    SamplingConfig(presence_penalty=-2.0, frequency_penalty=2.0, min_p=0.0,
                   logit_bias=tuple((i, -100.0) for i in range(300))).validate()
    SamplingConfig(temperature=0.5, min_p=1.0).validate()


def test_logprobs_chosen_entry_is_the_greedy_token_and_top_k_sums_to_at_most_one():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=1000).astype(np.float32)
    sampler = Sampler(SamplingConfig(), logits.size)
    token, lp = sampler.choose(logits, [], top_logprobs=5)
    assert token == int(np.argmax(logits))
    assert lp is not None and lp.token_id == token
    assert [t for t, _ in lp.top][0] == token
    assert lp.top[0][1] == pytest.approx(lp.logprob)
    assert [t for t, _ in lp.top] == list(np.argsort(-logits.astype(np.float64))[:5])
    assert sum(math.exp(v) for _, v in lp.top) <= 1.0
    # The reference: a full float64 log-softmax.
    ref = logits.astype(np.float64) - np.log(np.sum(np.exp(logits.astype(np.float64))))
    assert lp.logprob == pytest.approx(ref[token], abs=1e-6)  # float32 exp, float32 on the wire


def test_logprobs_follow_the_temperature_and_not_the_truncation():
    sampler = Sampler(SamplingConfig(temperature=2.0, top_k=3, seed=1), VOCAB)
    token, lp = sampler.choose(LOGITS, [], top_logprobs=4)
    scaled = LOGITS.astype(np.float64) / 2.0
    ref = scaled - np.log(np.sum(np.exp(scaled)))
    assert lp.logprob == pytest.approx(ref[token])
    # Before truncation: the 4th alternative is listed though top_k=3 could not draw it.
    assert [t for t, _ in lp.top] == [0, 1, 2, 3]
    assert lp.top[3][1] == pytest.approx(ref[3])


def test_logprobs_after_penalties_and_bias():
    sampler = Sampler(SamplingConfig(logit_bias=((0, -100.0),)), VOCAB)
    token, lp = sampler.choose(LOGITS, [], top_logprobs=2)
    assert token == 1 and lp.top[0][0] == 1 and lp.top[1][0] == 2


def test_asking_for_logprobs_does_not_change_the_draws():
    def run(top):
        s = Sampler(SamplingConfig(temperature=1.0, seed=11), VOCAB)
        return [s.choose(LOGITS, [], top)[0] for _ in range(100)]
    assert run(None) == run(20)


def test_top_indices_orders_ties_by_id_and_handles_k_beyond_the_row():
    scores = np.array([1.0, 2.0, 2.0, -np.inf, 0.5])
    assert list(top_indices(scores, 3)) == [1, 2, 0]
    assert list(top_indices(scores, 10)) == [1, 2, 0, 4, 3]
    assert list(top_indices(scores, 0)) == []
    entry = token_logprobs(scores, 3, 5)
    assert entry.logprob == -math.inf
    assert sum(math.exp(v) for _, v in entry.top) == pytest.approx(1.0)
