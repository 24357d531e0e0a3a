"""Prompt-lookup drafting (worker_service/core/ngram.py): pure, no model."""

from __future__ import annotations

import pytest

from worker_service.core.ngram import AdaptiveDraft, Drafter, NgramProposer


def test_proposes_what_followed_the_tails_earlier_occurrence():
    tokens = [5, 6, 7, 8, 9, 1, 2, 6, 7]
    assert NgramProposer().propose(tokens, 3) == [8, 9, 1]


def test_longest_tail_wins_over_a_later_shorter_match():
    # "2 3" occurs at 0 (then 4); "3" alone occurs later, at 5 (then 9).
    tokens = [2, 3, 4, 0, 7, 3, 9, 1, 2, 3]
    assert NgramProposer(max_ngram=2).propose(tokens, 1) == [4]


def test_the_most_recent_occurrence_is_used():
    tokens = [1, 2, 3, 1, 2, 4, 1, 2]
    assert NgramProposer(max_ngram=2).propose(tokens, 2) == [4, 1]


def test_no_recurring_tail_proposes_nothing():
    assert NgramProposer().propose([1, 2, 3, 4, 5], 4) == []
    assert NgramProposer().propose([1], 4) == []
    assert NgramProposer().propose([1, 1], 0) == []


def test_the_tail_is_never_its_own_match_and_a_repeat_is_found():
    # A run of one token: the tail "1 1 1" matches the occurrence one position back.
    assert NgramProposer().propose([1, 1, 1, 1], 3) == [1]
    assert NgramProposer().propose([4, 1, 1], 3) == [1]


def test_proposal_is_capped_at_k_and_at_the_end_of_the_sequence():
    tokens = [1, 2, 3, 4, 5, 6, 1, 2]
    assert NgramProposer().propose(tokens, 2) == [3, 4]
    assert NgramProposer().propose(tokens, 100) == [3, 4, 5, 6, 1, 2]


def test_index_follows_a_growing_sequence_as_a_fresh_one_would():
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3]
    growing = NgramProposer()
    for end in range(1, len(tokens) + 1):
        assert growing.propose(tokens[:end], 4) == NgramProposer().propose(tokens[:end], 4), end


def test_bad_ngram_sizes_are_refused():
    with pytest.raises(ValueError, match="min_ngram"):
        NgramProposer(max_ngram=1, min_ngram=2)


def test_adaptive_size_grows_on_full_acceptance_and_shrinks_on_partial():
    size = AdaptiveDraft(max_k=8, start_k=4, grow=2)
    size.record(4, 4)
    assert size.next_k() == 6
    size.record(6, 6)
    size.record(8, 8)
    assert size.next_k() == 8  # capped at max_k
    size.record(8, 2)
    assert size.next_k() == 3  # what was accepted, and one more


def test_adaptive_size_pauses_after_misses_and_backs_off_longer_each_time():
    size = AdaptiveDraft(max_k=8, start_k=4, misses_to_pause=3, pause_steps=2)
    for _ in range(3):
        assert size.next_k() > 0
        size.record(size.k, 0)
    assert [size.next_k() for _ in range(2)] == [0, 0]
    assert size.next_k() == 1  # probing again, one token
    for _ in range(3):
        size.record(1, 0)
    assert [size.next_k() for _ in range(4)] == [0, 0, 0, 0]  # twice as long
    assert size.next_k() == 1
    size.record(1, 1)  # a hit resets the back-off
    for _ in range(3):
        size.record(1, 0)
    assert [size.next_k() for _ in range(3)] == [0, 0, 1]


def test_adaptive_record_refuses_impossible_counts():
    with pytest.raises(ValueError, match="accepted 3 of 2"):
        AdaptiveDraft().record(2, 3)


def test_drafter_respects_the_room_left_and_counts():
    drafter = Drafter(max_k=8)
    tokens = [1, 2, 3, 4, 5, 6, 7, 1, 2]
    assert drafter.propose(tokens, room_tokens=2) == [3, 4]
    assert drafter.propose(tokens, room_tokens=0) == []
    drafter.record(2, 1)
    assert (drafter.proposed_tokens, drafter.accepted_tokens) == (2, 1)


def test_the_drafter_needs_a_two_token_match():
    assert Drafter().propose([7, 1, 2, 9, 5, 1], room_tokens=4) == []
    assert Drafter().propose([7, 1, 2, 9, 5, 7, 1], room_tokens=4) == [2, 9, 5, 7]
