"""The automatic prefix cache: keys, LRU, pins, and its share of the KV pool's capacity.

The pool's rule with a cache: charges + counted (unpinned) cache bytes <=
capacity after every call, and a charge that needs the cache's bytes evicts
them first; a pinned block (a sequence is about to copy it) is never evicted.
"""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.rules import kv_math, prefix_hash
from worker_service.core.errors import CapacityExceeded
from worker_service.runtime.kv_pool import KVPool
from worker_service.runtime.prefix_cache import PrefixCache

BT = 4  # block tokens
BPT = 8  # bytes per token: one block is 32 bytes


class _Layout:
    block_tokens = BT

    def bytes_for(self, max_tokens: int) -> int:
        return kv_math.bytes_for(max_tokens, BPT, BT)

    def allocate(self, max_tokens: int):  # pragma: no cover - never materialized here
        raise AssertionError


def _block() -> np.ndarray:
    return np.zeros(BT * BPT // 4, dtype=np.float32)  # 32 bytes, like a real block


def _cache(capacity: int, limit: int) -> tuple[KVPool, PrefixCache]:
    pool = KVPool(_Layout(), capacity)
    return pool, PrefixCache(pool, limit, BT)


def _fill(cache: PrefixCache, tokens: list[int]) -> None:
    blocks = [cache.insert_pinned(key, i, _block()) for i, key in cache.missing(tokens)]
    cache.unpin_all([b for b in blocks if b is not None])


def _invariant(pool: KVPool, cache: PrefixCache) -> None:
    with pool.lock:
        assert pool.held_bytes_locked() + cache.counted_bytes_locked() <= pool.capacity_bytes
    assert cache.cached_bytes() <= cache.limit_bytes or cache.cached_bytes() == 0


def test_chain_hashes_key_every_token_before_a_block():
    a = prefix_hash.chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    b = prefix_hash.chain_hashes([1, 2, 3, 4, 5, 6, 7, 0], 4)
    c = prefix_hash.chain_hashes([0, 2, 3, 4, 5, 6, 7, 8], 4)
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]  # the partial run has no hash
    assert c[1] != a[1]  # same second block, other first: another key
    assert prefix_hash.matched_blocks(a, {a[0]}) == 1
    assert prefix_hash.matched_blocks(a, {a[1]}) == 0  # a gap at the root matches nothing
    # The same in every process: a fixed value, not Python's salted hash().
    assert prefix_hash.block_hash(0, [1, 2]) == prefix_hash.block_hash(0, [1, 2])
    assert prefix_hash.chain_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4, max_blocks=1) == a[:1]


def test_lookup_finds_the_longest_block_prefix_and_leaves_two_tokens_to_prefill():
    pool, cache = _cache(1024, 512)
    _fill(cache, list(range(12)))  # 3 blocks
    assert len(cache) == 3 and cache.cached_bytes() == 96
    hit = cache.lookup(list(range(12)))  # the whole prompt cached: its last block is left
    assert hit is not None and hit.tokens == 8
    cache.release(hit)
    hit = cache.lookup([*range(8), 99, 98, 97, 96, 95])
    assert hit is not None and hit.tokens == 8
    cache.release(hit)
    assert cache.lookup([5, *range(1, 12)]) is None
    assert cache.stats.hit_tokens == 16 and cache.stats.lookups == 3
    # Two whole blocks and one token: the second block is left, so the run after the hit
    # is never one token over a past (a miss computes that token in a longer run).
    hit = cache.lookup([*range(8), 99])
    assert hit is not None and hit.tokens == 4
    cache.release(hit)


def test_a_charge_that_needs_the_caches_bytes_evicts_lru_first():
    pool, cache = _cache(128, 128)
    _fill(cache, [1] * 8)  # 2 blocks, 64 bytes
    _fill(cache, [2] * 8)  # 2 more: the cache fills the pool
    assert cache.cached_bytes() == 128
    lookup = cache.lookup([2] * 9)  # touch the second chain: the first is now the LRU
    cache.release(lookup)
    allocation = pool.allocate(8)  # 64 bytes: the first chain goes
    _invariant(pool, cache)
    assert cache.cached_bytes() == 64
    assert cache.lookup([1] * 9) is None
    assert cache.lookup([2] * 9) is not None
    assert cache.stats.evictions["admission"] == 2
    pool.free(allocation)


def test_pinned_blocks_are_never_evicted_and_their_charge_covers_them():
    pool, cache = _cache(128, 128)
    _fill(cache, [3] * 12)  # 3 blocks, 96 bytes
    hit = cache.lookup([3] * 14)  # pins all three
    assert hit is not None and hit.tokens == 12
    allocation = pool.allocate(14)  # the hit's own charge: 4 blocks = 128 bytes
    _invariant(pool, cache)
    assert cache.cached_bytes() == 96  # pinned: held beside a charge that covers them
    with pytest.raises(CapacityExceeded):
        pool.allocate(1)  # nothing evictable: the pins stay
    assert len(cache) == 3
    for b in range(3):  # the row takes them block by block; each then counts and may go
        cache.copied(hit, b)
        _invariant(pool, cache)
    assert cache.cached_bytes() == 0  # the charge fills the pool: the copies went
    pool.free(allocation)


def test_kept_blocks_go_after_every_unkept_one_and_pressure_still_takes_them():
    now = [100.0]
    pool = KVPool(_Layout(), 128)
    cache = PrefixCache(pool, 128, BT, clock=lambda: now[0])
    until = cache.keep_until(60)  # a stored response's prompt and answer, kept a minute
    kept = [cache.insert_pinned(key, i, _block(), until) for i, key in cache.missing([1] * 8)]
    cache.unpin_all(kept)
    _fill(cache, [2] * 8)  # ordinary traffic, used more recently than the kept chain
    assert cache.kept_bytes() == 64 and cache.cached_bytes() == 128
    allocation = pool.allocate(8)  # 64 bytes: LRU would take the kept chain; the unkept goes
    _invariant(pool, cache)
    assert cache.lookup([2] * 10) is None
    hit = cache.lookup([1] * 10)
    assert hit is not None and hit.tokens == 8
    cache.release(hit)
    # Kept, not pinned: more pressure takes it too (then the follow-up prefills again).
    more = pool.allocate(8)
    _invariant(pool, cache)
    assert cache.cached_bytes() == 0 and cache.stats.kept_evicted_bytes == 64
    pool.free(allocation)
    pool.free(more)
    # Past its time a kept block is an ordinary one again; a later keep extends it.
    _fill(cache, [3] * 4)
    cache.missing([3] * 4, keep_s=10)
    assert cache.kept_bytes() == 32
    now[0] += 11
    assert cache.kept_bytes() == 0


def test_the_limit_bounds_the_cache_and_zero_turns_it_off():
    pool, cache = _cache(1024, 64)
    _fill(cache, list(range(16)))  # 4 blocks, only 2 fit the limit
    assert cache.cached_bytes() == 64
    off_pool, off = _cache(1024, 0)
    _fill(off, list(range(16)))
    assert off.cached_bytes() == 0 and off.lookup(list(range(16))) is None


def test_summary_names_the_cached_chain_hashes():
    _, cache = _cache(1024, 1024)
    _fill(cache, list(range(8)))
    assert set(cache.summary()) == set(prefix_hash.chain_hashes(list(range(8)), BT))


def test_placement_follows_the_longest_cached_prefix_when_that_worker_can_admit():
    from scheduler_service.ledger.ledger import (
        AdmissionRequest,
        Decision,
        Ledger,
        PrefixCacheReport,
        WorkerGeometry,
    )

    ledger = Ledger()
    for worker_id, capacity in (("big", 4_000 * BPT), ("small", 1_000 * BPT)):
        ledger.register(WorkerGeometry(worker_id, f"{worker_id}:1", "m", 2_048, BPT, capacity,
                                       block_tokens=BT))
    prompt = tuple(range(100))
    hashes = frozenset(prefix_hash.chain_hashes(prompt, BT))
    ledger.heartbeat("small", prefix=PrefixCacheReport(10 * 32, hashes))
    ask = AdmissionRequest("r", len(prompt), 20, prompt_ids=prompt)
    assert ledger.admit(ask, dry_run=True).worker.worker_id == "small"  # its prefix, fewer bytes
    other = AdmissionRequest("r", 100, 20, prompt_ids=tuple(range(1, 101)))
    assert ledger.admit(other, dry_run=True).worker.worker_id == "big"  # no prefix: free bytes
    too_big = AdmissionRequest("r", len(prompt), 950, prompt_ids=prompt)
    admission = ledger.admit(too_big, dry_run=True)  # the cached worker cannot take it whole
    assert admission.decision is Decision.ADMITTED and admission.worker.worker_id == "big"
    budget = {w.geometry.worker_id: w.prefix.cached_bytes for w in ledger.snapshot()}
    assert budget == {"big": 0, "small": 320}


def test_a_kept_answers_blocks_match_only_a_lookup_for_its_follow_up():
    _, cache = _cache(1024, 1024)
    tokens = [7] * 4 + [8] * 8  # one prompt block, then two holding the answer
    until = cache.keep_until(60)
    kept = [cache.insert_pinned(key, i, _block(), until)
            for i, key in cache.missing(tokens, keep_s=60, answer_from=1)]
    cache.unpin_all(kept)
    follow = [*tokens, 1, 2]
    ordinary = cache.lookup(follow)
    assert ordinary is not None and ordinary.tokens == 4  # the prompt's block only
    cache.release(ordinary)
    continued = cache.lookup(follow, kept_answer=True)
    assert continued is not None and continued.tokens == 12
    cache.release(continued)
