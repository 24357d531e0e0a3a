"""The engine with the prefix cache: a hit copies cached blocks into the new row and prefills
the rest, and must never change a token; the pool's figures stay within the capacity."""

from __future__ import annotations

import pytest

from tests.models import prepared_model_dir
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine

SAMPLED = SamplingConfig(temperature=1.0, seed=7)  # any logit difference shows in the tokens


def _physical_within_charges(engine: Engine) -> None:
    """The arena's pages + every cached block <= charges + counted cache <= capacity."""
    cache = engine.prefix_cache
    with engine.kv.lock:
        charged = engine.kv.held_bytes_locked() + (cache.counted_bytes_locked() if cache is not None else 0)
    assert charged <= engine.capacity_bytes
    physical = engine.runtime.rows.kernel_committed_bytes() + engine.cached_bytes()
    assert physical <= engine.held_bytes() + engine.cached_bytes() <= engine.capacity_bytes


def _run(engine: Engine, prompt, max_new=10, sampling=SAMPLED, sid="s"):
    return engine.generate(SequenceRequest(sid, tuple(prompt), max_new, sampling=sampling), 120)


def test_a_hit_equals_a_run_without_the_cache(tiny_dir):
    prompt = [(i * 7) % 200 + 3 for i in range(300)]
    other = prompt[:200] + [(i * 11) % 200 + 3 for i in range(90)]
    config = dict(model_dir=tiny_dir, intra_op_threads=2, prefill_chunk_tokens=64,
                  kv_capacity_bytes=8 * 2**20)
    with Engine(EngineConfig(**config, prefix_cache_bytes=0)) as off:
        assert off.prefix_cache is None
        want = [_run(off, prompt).token_ids, _run(off, other).token_ids]
        assert off.cached_bytes() == 0
    with Engine(EngineConfig(**config)) as on:
        first = _run(on, prompt)
        _physical_within_charges(on)
        assert first.cached_prompt_tokens == 0 and on.cached_bytes() > 0
        second = _run(on, other)
        bt = on.runtime.rows.block_tokens  # 64 on the tiny model: 3 whole blocks of the shared 200
        assert second.cached_prompt_tokens == 200 // bt * bt
        assert [first.token_ids, second.token_ids] == want
        again = _run(on, prompt)  # the whole prompt is cached: its last block is prefilled
        assert again.cached_prompt_tokens == (len(prompt) - 1) // bt * bt
        assert again.token_ids == want[0]
        _physical_within_charges(on)
        assert on.held_bytes() == 0


def test_an_admission_that_needs_the_caches_bytes_evicts_and_succeeds(tiny_dir):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2,
                             kv_capacity_bytes=2**20, prefix_cache_bytes=2**20)) as engine:
        whole = engine.capacity_bytes // engine.spec.bytes_per_token  # 2,048 tokens
        _run(engine, [5 + i % 90 for i in range(1000)], max_new=2)
        assert engine.cached_bytes() > 0
        # Nearly the whole capacity: it fits only once the cache's bytes are evicted.
        done = _run(engine, [9] * (whole - 100), max_new=4, sampling=SamplingConfig())
        assert done.generated_tokens >= 1
        assert engine.prefix_cache.stats.evictions.get("admission", 0) > 0
        _physical_within_charges(engine)


@pytest.mark.slow
def test_default_model_600_token_prefix_greedy_equals_no_cache():
    model = prepared_model_dir("smollm2-135m-instruct-fp32")
    shared = [(i * 13) % 5000 + 100 for i in range(600)]
    a, b = shared + [42, 43, 44], shared + [77, 78]
    config = dict(model_dir=model, intra_op_threads=2, kv_capacity_bytes=256 * 2**20)
    greedy = SamplingConfig()
    with Engine(EngineConfig(**config, prefix_cache_bytes=0)) as off:
        want = _run(off, b, 12, greedy).token_ids
    with Engine(EngineConfig(**config)) as on:
        _run(on, a, 4, greedy)
        got = _run(on, b, 12, greedy)
    assert got.cached_prompt_tokens == 600 // 16 * 16
    assert got.token_ids == want


def test_physical_kv_stays_within_charges_after_every_step_with_hits(tiny_dir):
    """Arena pages (the kernel's count) + every cached block <= charges + counted cache <=
    capacity after each step, while sequences hit, fill and evict concurrently; a block a
    live sequence is copying from (pinned) is never evicted."""
    import threading

    from worker_service.core.sequence import TERMINAL

    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2, prefill_chunk_tokens=64,
                             kv_capacity_bytes=2**20, prefix_cache_bytes=2**20)) as eng:
        samples = []
        step = eng.step

        def checked_step():
            step()  # on the engine thread: nothing frees between the step and the reads
            cache = eng.prefix_cache
            with eng.kv.lock:
                charged = eng.kv.held_bytes_locked() + cache.counted_bytes_locked()
                pinned = [b for b in cache._blocks.values() if b.pins]
            samples.append((eng.runtime.rows.kernel_committed_bytes() + eng.cached_bytes(), charged))
            assert all(b.key in cache._blocks for b in pinned)

        eng.step = checked_step
        base = [(i * 5) % 150 + 3 for i in range(400)]
        _run(eng, base, 2)
        done = [threading.Event() for _ in range(5)]
        for i in range(5):
            prompt = base[: 130 + 60 * i] + [7 + i] * 20
            eng.submit(SequenceRequest(f"s{i}", tuple(prompt), 30, sampling=SAMPLED),
                       lambda e, d=done[i]: d.set() if isinstance(e, TERMINAL) else None)
        assert all(d.wait(120) for d in done)
        assert eng.prefix_cache.stats.hit_tokens > 0
        assert samples and all(physical <= charged <= eng.capacity_bytes
                               for physical, charged in samples)
        assert eng.held_bytes() == 0 and eng.runtime.rows.kernel_committed_bytes() == 0


def test_a_kept_request_leaves_its_prompt_and_answer_for_the_follow_up(tiny_dir):
    # keep_prefix_s (a stored Responses call): the answer's whole blocks are cached too,
    # kept; without it only the prompt's are.
    prompt = [(i * 7) % 200 + 3 for i in range(100)]
    config = dict(model_dir=tiny_dir, intra_op_threads=2, kv_capacity_bytes=8 * 2**20)
    with Engine(EngineConfig(**config)) as engine:
        bt = engine.runtime.rows.block_tokens  # 64: the prompt is one whole block and a bit
        plain = engine.generate(SequenceRequest("p", tuple(prompt), 80, ignore_eos=True), 120)
        follow = prompt + list(plain.token_ids) + [5, 6, 7]
        assert _run(engine, follow, 2, sid="p2").cached_prompt_tokens == bt
        assert engine.prefix_cache.kept_bytes() == 0
        engine.prefix_cache.clear()
        kept = engine.generate(SequenceRequest("k", tuple(prompt), 80, ignore_eos=True,
                                               keep_prefix_s=60), 120)
        assert kept.token_ids == plain.token_ids
        assert engine.prefix_cache.kept_bytes() == engine.runtime.rows.bytes_for(2 * bt)
        # The answer's blocks came from decode runs: an ordinary prompt that starts with
        # the conversation gets the prompt's block only (a hit stays exact for it) ...
        resent = _run(engine, follow, 2, sid="r")
        assert resent.cached_prompt_tokens == bt
        # ... the stored response's follow-up gets both (what its session would have held).
        again = engine.generate(SequenceRequest("k2", tuple(follow), 2, sampling=SAMPLED,
                                                continues_kept_answer=True), 120)
        assert again.cached_prompt_tokens == (len(prompt) + 79) // bt * bt == 2 * bt
        _physical_within_charges(engine)
        assert engine.held_bytes() == 0
