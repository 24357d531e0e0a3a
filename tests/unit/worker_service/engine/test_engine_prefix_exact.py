"""A prefix-cache hit computes the floats a miss computes, bit for bit, on the shipped
precisions (docs/features/prefix-cache.md, "A hit is exact"): the same request sent twice to one
engine (a miss, then a hit) gives the same tokens, text, sampled tokens and logprobs.

The tiny model (fast), and the real SmolLM2 folders: int4 is where a single-token run over a past moved logits
by up to 0.7 (greedy answers parted), fp32 where it moved a logprob in its 6th digit
(a seeded sample parted).
"""

from __future__ import annotations

import threading

import pytest

from tests.models import prepared_model_dir
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest, TokenDelta
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine

GREEDY = SamplingConfig()
SEEDED = SamplingConfig(temperature=1.0, seed=4242)

# About 800 tokens of varied prose (the chat below is 828 tokens).
_LONG_TEXT = " ".join(
    f"Section {i}: the {word} of the river valley changed as the {other} moved north, and the "
    f"people who kept the records wrote {i * 7} lines about the {word} before winter."
    for i, (word, other) in enumerate(zip(
        ["weather", "harvest", "trade", "language", "music", "law", "roads", "bridges",
         "schools", "markets", "ships", "songs", "farms", "mills", "temples", "gardens",
         "coins", "maps", "tools", "stories", "games", "boats"],
        ["herds", "traders", "armies", "birds", "families", "priests", "miners", "poets",
         "judges", "sailors", "builders", "children", "farmers", "weavers", "scribes",
         "hunters", "potters", "smiths", "bakers", "dancers", "singers", "clerks"],
        strict=True)))


def _chat(engine: Engine, question: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode_chat([("user", question)]))


def _generate(engine: Engine, sid: str, prompt: tuple[int, ...], max_new: int,
              sampling: SamplingConfig, top_logprobs: int | None = None
              ) -> tuple[Completed, list]:
    """Run one request; its Completed and every token's logprobs (when asked)."""
    done = threading.Event()
    events: list = []

    def on_event(event) -> None:
        events.append(event)
        if isinstance(event, TERMINAL):
            done.set()

    engine.submit(SequenceRequest(sid, prompt, max_new, sampling=sampling,
                                  top_logprobs=top_logprobs), on_event)
    assert done.wait(300)
    final = events[-1]
    assert isinstance(final, Completed), final
    logprobs = [lp for e in events if isinstance(e, TokenDelta) for lp in e.logprobs]
    return final, logprobs


def _engine(name: str, **config) -> Engine:
    return Engine(EngineConfig(model_dir=prepared_model_dir(name), intra_op_threads=2,
                               kv_capacity_bytes=256 * 2**20, **config))


def test_tiny_hits_give_the_miss_s_logprobs_bit_for_bit():
    prompt = tuple((i * 7) % 200 + 3 for i in range(300))
    other = prompt[:200] + tuple((i * 11) % 200 + 3 for i in range(90))
    with _engine("tiny-llama", prefill_chunk_tokens=64, prefix_cache_bytes=0) as off:
        want = [_generate(off, "a", p, 12, SEEDED, top_logprobs=4)[1] for p in (prompt, other)]
    with _engine("tiny-llama", prefill_chunk_tokens=64) as on:
        miss, miss_lp = _generate(on, "miss", prompt, 12, SEEDED, top_logprobs=4)
        hit, hit_lp = _generate(on, "hit", prompt, 12, SEEDED, top_logprobs=4)
        part, part_lp = _generate(on, "part", other, 12, SEEDED, top_logprobs=4)
    assert (miss.cached_prompt_tokens, hit.cached_prompt_tokens, part.cached_prompt_tokens) == (
        0, 256, 192)  # whole blocks of 64, two prompt tokens left at least
    assert miss_lp == hit_lp == want[0]  # every float equal, not close
    assert part_lp == want[1]


def test_a_hit_among_decoding_sequences_gives_the_idle_miss_s_floats():
    """The miss and the hit each join a batch of decoding rows (another row, masks as wide
    as the longest row): the floats of the miss on an idle engine."""
    prompt = tuple((i * 3) % 150 + 5 for i in range(200))
    with _engine("tiny-llama", prefill_chunk_tokens=64) as engine:
        idle = _generate(engine, "idle", prompt, 12, SEEDED, top_logprobs=4)[1]
        engine.prefix_cache.clear()
        done = [threading.Event() for _ in range(3)]
        for i, d in enumerate(done):
            engine.submit(SequenceRequest(f"bg{i}", tuple(range(100 + i, 160 + 70 * i)), 300,
                                          sampling=SEEDED),
                          lambda e, d=d: d.set() if isinstance(e, TERMINAL) else None)
        miss = _generate(engine, "miss", prompt, 12, SEEDED, top_logprobs=4)
        hit = _generate(engine, "hit", prompt, 12, SEEDED, top_logprobs=4)
        assert all(d.wait(300) for d in done)
    assert miss[0].cached_prompt_tokens == 0 and hit[0].cached_prompt_tokens == 192
    assert miss[1] == idle and hit[1] == idle


def test_a_prompt_s_floats_do_not_depend_on_how_it_is_chunked():
    """Chunks of 512, 64 and 7 tokens (the last cut leaving two, never one), with another
    sequence decoding beside the long prompt's chunks: the same logprobs."""
    prompt = tuple((i * 5) % 180 + 3 for i in range(250))
    seen = []
    for chunk in (512, 64, 7):
        with _engine("tiny-llama", prefill_chunk_tokens=chunk, prefix_cache_bytes=0) as engine:
            done = threading.Event()
            engine.submit(SequenceRequest("beside", (9, 10, 11), 200, sampling=SEEDED),
                          lambda e, d=done: d.set() if isinstance(e, TERMINAL) else None)
            seen.append(_generate(engine, "long", prompt, 12, SEEDED, top_logprobs=4)[1])
            assert done.wait(300)
    assert seen[0] == seen[1] == seen[2]


@pytest.mark.slow
@pytest.mark.parametrize("question, max_new, min_cached", [
    ("What is the capital of Peru?", 24, 32),  # 37 tokens
    (f"{_LONG_TEXT}\n\nWhich section mentions ships?", 32, 800),  # 828 tokens
], ids=["short", "long"])
def test_int4_greedy_hit_gives_the_miss_s_tokens(question, max_new, min_cached):
    with _engine("smollm2-135m-instruct-int4") as engine:
        prompt = _chat(engine, question)
        miss, _ = _generate(engine, "miss", prompt, max_new, GREEDY)
        hit, _ = _generate(engine, "hit", prompt, max_new, GREEDY)
    assert miss.cached_prompt_tokens == 0 and hit.cached_prompt_tokens >= min_cached
    assert hit.token_ids == miss.token_ids
    assert hit.text == miss.text


@pytest.mark.slow
def test_fp32_seeded_sample_and_logprobs_of_a_hit_equal_the_miss_s():
    with _engine("smollm2-135m-instruct-fp32") as engine:
        prompt = _chat(engine, "Explain in a few words what a river delta is and why it forms.")
        miss, miss_lp = _generate(engine, "miss", prompt, 24, SEEDED, top_logprobs=3)
        hit, hit_lp = _generate(engine, "hit", prompt, 24, SEEDED, top_logprobs=3)
    assert miss.cached_prompt_tokens == 0 and hit.cached_prompt_tokens > 0
    assert hit.token_ids == miss.token_ids
    assert hit_lp == miss_lp  # every float equal, not close
