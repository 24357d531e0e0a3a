"""The prefix cache's key: a hash chain over block-sized token runs (pure, shared).

The worker keys its cached KV blocks with it and the scheduler hashes a
request's prompt the same way to find the worker holding its longest cached
prefix, so both sides must compute the same numbers: this is the one place
they are computed (as vLLM's block hashes: hash(parent, block tokens), so a
block's key names every token before it, and equal keys mean equal prefixes).

blake2b (64-bit digests) rather than Python's `hash`: it is the same in every
process (no PYTHONHASHSEED) and on every machine (little-endian token bytes).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

ROOT = 0  # the parent of a prompt's first block
# A worker's heartbeat names the cached blocks among the first SUMMARY_DEPTH_BLOCKS of a
# prompt (at most SUMMARY_MAX_HASHES of them): enough to tell workers apart by a long
# shared prefix, bounded per heartbeat (8 bytes a hash: 64 KiB at most).
SUMMARY_DEPTH_BLOCKS = 256
SUMMARY_MAX_HASHES = 8192


def block_hash(parent: int, tokens: Sequence[int]) -> int:
    """The chain hash of one block of token ids after the block whose hash is `parent`."""
    h = hashlib.blake2b(digest_size=8)
    h.update(parent.to_bytes(8, "little"))
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return int.from_bytes(h.digest(), "little")


def adapter_root(adapter: str) -> int:
    """The parent of a prompt's first block under a LoRA adapter ("": the base, ROOT), so
    equal tokens under different adapters (whose KV differs) never share a key."""
    if not adapter:
        return ROOT
    h = hashlib.blake2b(adapter.encode(), digest_size=8, person=b"ortserve-lora")
    return int.from_bytes(h.digest(), "little")


def chain_hashes(token_ids: Sequence[int], block_tokens: int, max_blocks: int | None = None,
                 adapter: str = "") -> list[int]:
    """The chain hashes of the whole `block_tokens` runs at the start of `token_ids`.

    hashes[i] keys tokens [0, (i + 1) x block_tokens); a partial last run has
    none. `max_blocks` bounds the work (the scheduler only needs the first few).
    """
    if block_tokens < 1:
        raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
    n_blocks = len(token_ids) // block_tokens
    if max_blocks is not None:
        n_blocks = min(n_blocks, max_blocks)
    hashes: list[int] = []
    parent = adapter_root(adapter)
    for b in range(n_blocks):
        parent = block_hash(parent, token_ids[b * block_tokens:(b + 1) * block_tokens])
        hashes.append(parent)
    return hashes


def matched_blocks(hashes: Sequence[int], held: frozenset[int] | set[int]) -> int:
    """How many leading blocks of a prompt (its `chain_hashes`) `held` has, in a row."""
    n = 0
    for h in hashes:
        if h not in held:
            break
        n += 1
    return n
