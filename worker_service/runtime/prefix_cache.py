"""The automatic prefix cache: whole KV blocks of finished prompts, in host memory, inside
the worker's KV capacity (docs/features/prefix-cache.md). Pure bookkeeping over numpy arrays.

Keys are chain hashes over `block_tokens`-sized token runs (ortserve.rules.prefix_hash,
the scheduler computes the same ones), so a later prompt that starts with the
same tokens finds its longest cached block prefix. Arena rows cannot share
physical pages, so a hit is a COPY of the cached blocks into the new row
(memcpy, ~10 ms for 1,000 tokens of the default model) plus a prefill of the
rest: it saves compute, not memory, and the row's charge stays whole.

The ledger sees it. The pool's bytes are live charges + counted cache bytes +
free, and `KVPool` keeps charges + counted <= capacity by asking the cache to
evict (LRU) before any charge grows. A block is counted unless it is PINNED:
a pinned block is covered by the charge of a sequence whose row has not
touched it yet (a hit waiting to be copied in, or a finishing sequence whose
row pages were returned as its blocks were copied out), so physical bytes
(rows' pages + every block) never pass charges + counted. Pinned blocks are
never evicted.

A block may also be KEPT until a time (a stored Responses call, GenerateRequest.keep_prefix_s:
its prompt and answer, so the follow-up copies them instead of keeping an idle session).
Kept is not pinned: a kept block is counted like any other and evicted under pressure,
but only after every unkept block, so ordinary traffic does not push it out first.
The answer's blocks (any block holding a generated token) are keyed apart (`answer_key`):
their K/V came from decode runs, so only a lookup for the stored response's follow-up
(`kept_answer`) matches them; any other prompt that starts the same way gets the prompt's
blocks only, and with them the floats its miss computes.

Thread-safety: every method takes the pool's lock (the pool calls `evict_locked`
while holding it), so allocation and eviction are one decision.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ortserve.rules import prefix_hash
from ortserve.rules.prefix_hash import SUMMARY_DEPTH_BLOCKS, SUMMARY_MAX_HASHES
from worker_service.runtime.kv_pool import KVPool


def answer_key(key: int) -> int:
    """The key a kept answer block is cached under: its chain hash, salted, so an ordinary
    lookup (which walks the plain chain) never finds it."""
    return prefix_hash.block_hash(key, (_ANSWER_SALT,))


_ANSWER_SALT = 0xA5A5_A5A5  # above any vocabulary: no token run hashes the same

# Prompt tokens a hit leaves to prefill: two, so the run after the copied blocks is the run
# a miss makes there, never a one-token run over a past (core/step_scheduler.py).
MIN_PREFILL_TOKENS = 2


@dataclass(eq=False)
class CachedBlock:
    """The K/V of one block: [2 x layers, kv_heads, block_tokens, head_dim] (K of layer i
    at 2i, V at 2i + 1)."""

    key: int  # its chain hash
    depth: int  # its index in the prompt (0: the first block)
    kv: np.ndarray
    pins: int = 0
    kept_until_s: float = 0.0  # the cache's clock; evicted after unkept blocks until then

    @property
    def nbytes(self) -> int:
        return self.kv.nbytes


@dataclass(eq=False)
class CachedPrefix:
    """A sequence's hit: the blocks it copies into its row, pinned until then."""

    blocks: list[CachedBlock]
    block_tokens: int
    copied: int = 0  # blocks already in the row (and unpinned)

    @property
    def tokens(self) -> int:
        return len(self.blocks) * self.block_tokens


@dataclass
class CacheStats:
    lookups: int = 0
    lookup_tokens: int = 0  # prompt tokens a hit could have supplied (whole blocks, not the last token)
    hit_tokens: int = 0  # of those, served from the cache
    inserted_bytes: int = 0
    evicted_bytes: int = 0
    evictions: dict[str, int] = field(default_factory=dict)
    kept_evicted_bytes: int = 0  # of evicted_bytes, blocks still kept (pressure took them)


class PrefixCache:
    """Cached KV blocks keyed by chain hash, LRU, bounded by `limit_bytes` and by the pool."""

    def __init__(self, pool: KVPool, limit_bytes: int, block_tokens: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if limit_bytes < 0:
            raise ValueError(f"the prefix cache's limit must be >= 0 bytes, got {limit_bytes}")
        self.pool = pool
        self.limit_bytes = limit_bytes
        self.block_tokens = block_tokens
        self._clock = clock
        self._lock = pool.lock
        # Least recently used first. A chain is touched leaf first, root last, so its
        # root outlives its leaves: a lookup walks from the root and stops at a gap.
        self._blocks: OrderedDict[int, CachedBlock] = OrderedDict()
        self._counted_bytes = 0  # unpinned blocks: what the pool adds to its charges
        self._pinned_bytes = 0
        self.stats = CacheStats()
        pool.attach_cache(self)

    # --- what the ledger sees -------------------------------------------------

    def cached_bytes(self) -> int:
        """Every block's bytes (pinned ones included): what the worker reports as cached."""
        with self._lock:
            return self._counted_bytes + self._pinned_bytes

    def counted_bytes_locked(self) -> int:
        """Unpinned blocks' bytes: evictable, and what the pool counts beside its charges."""
        return self._counted_bytes

    def summary(self) -> list[int]:
        """Chain hashes of the blocks near prompt starts, for the scheduler's placement."""
        with self._lock:
            keys = [b.key for b in reversed(self._blocks.values())
                    if b.depth < SUMMARY_DEPTH_BLOCKS]
        return keys[:SUMMARY_MAX_HASHES]

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    # --- a sequence starts: lookup --------------------------------------------

    def lookup(self, prompt_ids: Sequence[int], adapter: str = "",
               kept_answer: bool = False) -> CachedPrefix | None:
        """Pin the longest cached block prefix of the prompt, leaving at least its last two
        tokens to prefill (its logits give the first new token, and a one-token run over a
        past would compute other floats than the miss's longer run); None on a miss. Blocks
        are keyed under their LoRA adapter ("": the base): another adapter's never match.
        `kept_answer` (a stored response's follow-up): a kept answer's blocks match too."""
        bt = self.block_tokens
        usable = max(len(prompt_ids) - MIN_PREFILL_TOKENS, 0) // bt
        hashes = prefix_hash.chain_hashes(prompt_ids, bt, usable, adapter)
        with self._lock:
            self.stats.lookups += 1
            self.stats.lookup_tokens += usable * bt  # the most a hit could supply
            found: list[CachedBlock] = []
            for key in hashes:
                block = self._blocks.get(key)
                if block is None and kept_answer:
                    block = self._blocks.get(answer_key(key))
                if block is None:
                    break
                found.append(block)
            if not found:
                return None
            for block in reversed(found):
                self._pin_locked(block)
                self._blocks.move_to_end(block.key)
            self.stats.hit_tokens += len(found) * bt
        return CachedPrefix(found, bt)

    def copied(self, prefix: CachedPrefix, block_index: int) -> None:
        """Block `block_index` of the hit is in the row now: unpin it (then it counts, and
        the pool may need room: evict)."""
        with self._lock:
            self._unpin_locked(prefix.blocks[block_index])
            prefix.copied = block_index + 1
            self._fit_locked()

    def release(self, prefix: CachedPrefix) -> None:
        """The sequence leaves without copying the rest (cancelled, failed): unpin it."""
        with self._lock:
            for block in prefix.blocks[prefix.copied:]:
                self._unpin_locked(block)
            prefix.copied = len(prefix.blocks)
            self._fit_locked()

    # --- a sequence finishes: fill --------------------------------------------

    def missing(self, token_ids: Sequence[int], adapter: str = "", keep_s: float = 0.0,
                answer_from: int | None = None) -> list[tuple[int, int]]:
        """(block index, key) of the whole blocks of `token_ids` not cached yet, at most
        what the limit holds; the blocks already cached are touched (recently used), and
        kept `keep_s` seconds more from now when it is longer than they were. Blocks from
        index `answer_from` on hold generated tokens: keyed by `answer_key`."""
        if self.limit_bytes == 0:
            return []
        hashes = prefix_hash.chain_hashes(token_ids, self.block_tokens, adapter=adapter)
        if answer_from is not None:
            hashes = hashes[:answer_from] + [answer_key(k) for k in hashes[answer_from:]]
        until = self.keep_until(keep_s)
        with self._lock:
            for key in reversed(hashes):
                if key in self._blocks:
                    block = self._blocks[key]
                    block.kept_until_s = max(block.kept_until_s, until)
                    self._blocks.move_to_end(key)
            room = self.limit_bytes // max(self.pool.bytes_for(self.block_tokens), 1)
            return [(i, key) for i, key in enumerate(hashes) if key not in self._blocks][:room]

    def keep_until(self, keep_s: float) -> float:
        """The clock's time `keep_s` from now (0: not kept)."""
        return self._clock() + keep_s if keep_s > 0 else 0.0

    def insert_pinned(self, key: int, depth: int, kv: np.ndarray,
                      kept_until_s: float = 0.0) -> CachedBlock | None:
        """Add a block copied out of a finishing sequence's row, pinned: that sequence's
        charge covers it until `unpin_all` (its row's pages went as the block was copied).
        `kept_until_s` (keep_until): evicted after every unkept block until then."""
        with self._lock:
            if key in self._blocks:
                return None
            block = CachedBlock(key, depth, kv, pins=1, kept_until_s=kept_until_s)
            self._pinned_bytes += block.nbytes
            self._blocks[key] = block
            self.stats.inserted_bytes += block.nbytes
            return block

    def unpin_all(self, blocks: Sequence[CachedBlock]) -> None:
        """The finishing sequence's charge is gone: its new blocks count now (evict to fit)."""
        with self._lock:
            for block in reversed(blocks):  # the root last: most recently used
                self._unpin_locked(block)
                if block.key in self._blocks:
                    self._blocks.move_to_end(block.key)
            self._fit_locked()

    def clear(self) -> None:
        with self._lock:
            for block in [b for b in self._blocks.values() if b.pins == 0]:
                self._drop_locked(block, "clear")

    # --- eviction (under the pool's lock) -------------------------------------

    def kept_bytes(self) -> int:
        """Bytes of blocks kept past now (GenerateRequest.keep_prefix_s), pinned or not."""
        with self._lock:
            now = self._clock()
            return sum(b.nbytes for b in self._blocks.values() if b.kept_until_s > now)

    def evict_locked(self, nbytes: int, why: str = "admission") -> int:
        """Evict unpinned blocks, least recently used first, until `nbytes` are freed (or
        none is left): every unkept block before any kept one (pressure takes those too);
        returns the bytes freed. The pool calls it before a charge grows."""
        freed = 0
        now = self._clock()
        unkept = [b for b in self._blocks.values() if b.kept_until_s <= now]
        kept = [b for b in self._blocks.values() if b.kept_until_s > now]
        for block in unkept + kept:
            if freed >= nbytes:
                break
            if block.pins == 0:
                freed += block.nbytes
                if block.kept_until_s > now:
                    self.stats.kept_evicted_bytes += block.nbytes
                self._drop_locked(block, why)
        return freed

    def _fit_locked(self) -> None:
        """Charges + counted <= capacity and counted + pinned <= limit, by evicting."""
        over_pool = self.pool.held_bytes_locked() + self._counted_bytes - self.pool.capacity_bytes
        if over_pool > 0:
            self.evict_locked(over_pool, "admission")
        over_limit = self._counted_bytes + self._pinned_bytes - self.limit_bytes
        if over_limit > 0:
            self.evict_locked(over_limit, "limit")

    def _pin_locked(self, block: CachedBlock) -> None:
        if block.pins == 0:
            self._counted_bytes -= block.nbytes
            self._pinned_bytes += block.nbytes
        block.pins += 1

    def _unpin_locked(self, block: CachedBlock) -> None:
        if block.pins <= 0:
            raise RuntimeError(f"prefix cache block {block.key:#x} unpinned more than pinned")
        block.pins -= 1
        if block.pins == 0:
            self._pinned_bytes -= block.nbytes
            self._counted_bytes += block.nbytes

    def _drop_locked(self, block: CachedBlock, why: str) -> None:
        del self._blocks[block.key]
        self._counted_bytes -= block.nbytes
        self.stats.evicted_bytes += block.nbytes
        self.stats.evictions[why] = self.stats.evictions.get(why, 0) + 1

