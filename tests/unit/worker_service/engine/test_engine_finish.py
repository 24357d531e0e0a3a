"""How a sequence finishes: EOS (counted, no text), min_new_tokens holding EOS back, a stop
sequence (the output ends before the match) and the length limit (all text sent)."""

from __future__ import annotations

import dataclasses

import pytest

from tests.unit.worker_service.event_recorder import Recorder
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import FinishReason, SequenceRequest

SAMPLED = SamplingConfig(temperature=1.0, seed=21)


@pytest.fixture
def eos_engine(engine, prompt):
    """The engine, with its EOS set to the token the random model emits first (greedy)."""
    first = engine.generate(SequenceRequest("probe", prompt, 1)).token_ids[0]
    original = engine.spec
    engine.spec = dataclasses.replace(original, eos_token_ids=(first,))
    yield engine
    engine.spec = original


def test_eos_ends_the_sequence_and_counts_but_adds_no_text(eos_engine, prompt):
    rec = Recorder()
    eos_engine.submit(SequenceRequest("eos", prompt, 20), rec)
    assert rec.done.wait(5)
    [done] = rec.terminal()
    assert (done.finish_reason, done.generated_tokens, done.text) == (FinishReason.EOS, 1, "")
    assert rec.token_ids() == list(done.token_ids) and rec.text() == ""


def test_min_new_tokens_masks_eos_until_reached(eos_engine, prompt):
    eos = eos_engine.spec.eos_token_ids[0]
    done = eos_engine.generate(SequenceRequest("min", prompt, 20, min_new_tokens=5))
    assert done.generated_tokens >= 5
    assert eos not in done.token_ids[:5]
    if done.finish_reason is FinishReason.EOS:
        assert done.token_ids[-1] == eos and eos not in done.token_ids[:-1]


def test_stop_sequence_ends_the_output_before_the_match(engine):
    base = SequenceRequest("free", tuple(engine.tokenizer.encode("Once upon a time")), 80,
                           sampling=SAMPLED)
    free = engine.generate(base)
    text = free.text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assert len(stop) == 3
    rec = Recorder()
    engine.submit(dataclasses.replace(base, sequence_id="stopped", stop=("never-there", stop)), rec)
    assert rec.done.wait(5)
    [done] = rec.terminal()
    assert (done.finish_reason, done.stop_sequence) == (FinishReason.STOP_SEQUENCE, stop)
    assert done.text == text[: text.index(stop)] == rec.text()
    assert stop not in rec.text()
    assert done.generated_tokens < free.generated_tokens
    assert engine.held_bytes() == 0


def test_length_finish_emits_all_text(engine):
    req = SequenceRequest("len", tuple(engine.tokenizer.encode("Hello")), 25,
                          sampling=SAMPLED, stop=("zzzzqqqq",))
    rec = Recorder()
    engine.submit(req, rec)
    assert rec.done.wait(5)
    [done] = rec.terminal()
    assert done.finish_reason is FinishReason.LENGTH and done.generated_tokens == 25
    assert rec.text() == done.text == engine.tokenizer.decode(done.token_ids)
    assert done.seed == 21
