"""KV-cache byte arithmetic shared by the scheduler's ledger and the worker's KV pool.

One function each way so the two sides can never disagree on what a sequence
costs: the ledger reserves exactly what the pool will allocate.
"""

from __future__ import annotations


def _check(bytes_per_token: int, block_tokens: int) -> None:
    if bytes_per_token < 1 or block_tokens < 1:
        raise ValueError(f"bytes_per_token ({bytes_per_token}) and block_tokens ({block_tokens}) "
                         "must both be >= 1")


def bytes_for(n_tokens: int, bytes_per_token: int, block_tokens: int) -> int:
    """Bytes a sequence of `n_tokens` holds: whole blocks of `block_tokens`, rounded up."""
    _check(bytes_per_token, block_tokens)
    blocks = -(-max(n_tokens, 0) // block_tokens)
    return blocks * block_tokens * bytes_per_token


def tokens_within(n_bytes: int, bytes_per_token: int, block_tokens: int) -> int:
    """The most tokens whose `bytes_for` fits in `n_bytes` (whole blocks only)."""
    _check(bytes_per_token, block_tokens)
    return (max(n_bytes, 0) // (block_tokens * bytes_per_token)) * block_tokens
