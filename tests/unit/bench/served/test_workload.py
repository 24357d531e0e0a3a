"""The load's workload is seeded, within its stated lengths, and shaped as each mix says:
chat prompts share no prefix, agentic turns extend their agent's history over one system prefix."""

from __future__ import annotations

import pytest

from bench.served.workload import (
    OUTPUT_LAWS,
    PROMPT_LAWS,
    TOKEN_RANGE,
    make_workload,
    poisson_arrivals,
)


@pytest.mark.parametrize("mix", ["chat", "long", "agentic"])
def test_the_same_seed_gives_the_same_requests_and_a_longer_run_starts_with_them(mix):
    a = make_workload(mix, 40, seed=3)
    assert a == make_workload(mix, 40, seed=3)
    assert make_workload(mix, 15, seed=3) == a[:15]  # every rate's run sends the same first items
    assert a != make_workload(mix, 40, seed=4)


@pytest.mark.parametrize("mix", ["chat", "long"])
def test_lengths_stay_within_each_mix_s_bounds_and_ids_within_the_plain_vocabulary(mix):
    items = make_workload(mix, 300, seed=1)
    prompt, output = PROMPT_LAWS[mix], OUTPUT_LAWS[mix]
    assert all(prompt.low <= it.prompt_tokens <= prompt.high for it in items)
    assert all(output.low <= it.output_tokens <= output.high for it in items)
    assert all(TOKEN_RANGE[0] <= t < TOKEN_RANGE[1] for it in items for t in it.prompt_ids)
    # log-normal around its median, not a constant: the lengths spread
    lengths = sorted(it.prompt_tokens for it in items)
    assert lengths[len(lengths) // 10] < prompt.median < lengths[len(lengths) * 9 // 10]


def test_chat_prompts_share_no_prefix_so_no_cache_serves_one_from_another():
    items = make_workload("chat", 2_000, seed=1)
    assert len({it.prompt_ids[:2] for it in items}) == len(items)


def test_agentic_turns_grow_their_agent_s_history_over_one_shared_system_prefix():
    items = make_workload("agentic", 24, seed=1, agents=4)
    system = items[0].prompt_ids[:1_200]
    assert all(it.prompt_ids[:1_200] == system for it in items)
    for agent in range(4):
        turns = [it for it in items if it.agent == agent]
        assert [t.turn for t in turns] == list(range(6))
        for before, after in zip(turns, turns[1:], strict=False):
            # the next prompt is the last one, its answer's tokens, and a new message
            assert after.prompt_ids[:before.prompt_tokens] == before.prompt_ids
            assert after.prompt_tokens > before.prompt_tokens + before.output_tokens
    # agents differ after the system prefix
    assert len({it.prompt_ids[1_200] for it in items if it.turn == 0}) == 4


def test_scale_shrinks_every_length_for_quick_runs():
    items = make_workload("chat", 200, seed=1, scale=0.1)
    assert max(it.prompt_tokens for it in items) <= 200 and max(it.output_tokens for it in items) <= 100


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match="mix must be one of chat, long, agentic"):
        make_workload("sharegpt", 4, seed=1)
    with pytest.raises(ValueError, match="scale"):
        make_workload("chat", 4, seed=1, scale=2)
    with pytest.raises(ValueError, match="rate_per_s"):
        poisson_arrivals(0, 10, seed=1)


def test_poisson_arrivals_are_seeded_increasing_and_near_the_rate_over_a_long_window():
    times = poisson_arrivals(4.0, 1_000, seed=7)
    assert times == poisson_arrivals(4.0, 1_000, seed=7)
    assert all(a < b for a, b in zip(times, times[1:], strict=False)) and times[-1] < 1_000
    assert 3_800 < len(times) < 4_200  # 4,000 expected; the seed fixes the count
    assert poisson_arrivals(0.001, 1, seed=1) == [0.0]  # a slow rate still sends one
