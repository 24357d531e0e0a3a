"""bytes_for / tokens_within: the one arithmetic the ledger and the KV pool share."""

from __future__ import annotations

import pytest

from ortserve.rules.kv_math import bytes_for, tokens_within
from scheduler_service.ledger.ledger import WorkerGeometry

BPT = 46_080


@pytest.mark.parametrize(("n_tokens", "block_tokens", "expected_blocks"), [
    (0, 1, 0), (1, 1, 1), (37, 1, 37),
    (1, 16, 1), (16, 16, 1), (17, 16, 2), (537, 16, 34),
    (255, 256, 1), (256, 256, 1), (257, 256, 2),
])
def test_bytes_for_rounds_up_to_whole_blocks(n_tokens, block_tokens, expected_blocks):
    assert bytes_for(n_tokens, BPT, block_tokens) == expected_blocks * block_tokens * BPT


@pytest.mark.parametrize("block_tokens", [1, 4, 16, 64, 256])
def test_tokens_within_is_the_inverse_of_bytes_for(block_tokens):
    for n_bytes in (0, BPT - 1, BPT, block_tokens * BPT - 1, block_tokens * BPT, 1_000 * BPT + 7):
        n = tokens_within(n_bytes, BPT, block_tokens)
        assert n % block_tokens == 0
        assert bytes_for(n, BPT, block_tokens) <= n_bytes
        assert bytes_for(n + 1, BPT, block_tokens) > n_bytes  # the most that fits


@pytest.mark.parametrize("block_tokens", [1, 16, 256])
def test_ledger_geometry_uses_the_shared_arithmetic(block_tokens):
    g = WorkerGeometry(worker_id="w", address="a", model="m", context_length=8_192,
                       bytes_per_token=BPT, capacity_bytes=10_000 * BPT, block_tokens=block_tokens)
    for n in (1, 17, 300, 4_097):
        assert g.bytes_for(n) == bytes_for(n, BPT, block_tokens)
        assert g.tokens_within(n * BPT) == tokens_within(n * BPT, BPT, block_tokens)


def test_bad_geometry_raises_naming_both_numbers():
    with pytest.raises(ValueError, match="block_tokens"):
        bytes_for(1, BPT, 0)
