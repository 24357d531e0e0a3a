"""ignore_eos and stop_token_ids on the real engine (the tiny random model, greedy)."""

from __future__ import annotations

import pytest

from ortserve.output.constraint_grammar import ConstraintSpec
from ortserve.status.errors import InvalidField
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import FinishReason, SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_dir):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=1)) as engine:
        yield engine


def prompt(engine) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode("Once upon a time"))


def eos_forced(engine) -> SamplingConfig:
    # A +100 bias makes the random model pick EOS first: the case ignore_eos is for.
    return SamplingConfig(logit_bias=((engine.spec.eos_token_ids[0], 100.0),))


def test_eos_ends_the_output_unless_ignore_eos(engine):
    ended = engine.generate(SequenceRequest("eos", prompt(engine), 6, sampling=eos_forced(engine)))
    assert ended.finish_reason is FinishReason.EOS and ended.generated_tokens == 1
    ignored = engine.generate(SequenceRequest("no-eos", prompt(engine), 6,
                                              sampling=eos_forced(engine), ignore_eos=True))
    assert ignored.finish_reason is FinishReason.LENGTH and ignored.generated_tokens == 6
    assert set(ignored.token_ids) == {engine.spec.eos_token_ids[0]}


def test_a_stop_token_ends_the_output_after_its_text(engine):
    free = engine.generate(SequenceRequest("free", prompt(engine), 8, min_new_tokens=8))
    stop_id = free.token_ids[2]
    first = free.token_ids.index(stop_id)
    stopped = engine.generate(SequenceRequest("stop", prompt(engine), 8, stop_token_ids=(stop_id,)))
    assert stopped.finish_reason is FinishReason.STOP_TOKEN and stopped.stop_token_id == stop_id
    assert stopped.token_ids == free.token_ids[:first + 1]
    assert stopped.text == engine.tokenizer.decode(free.token_ids[:first + 1])


def test_min_new_tokens_masks_the_stop_tokens_too(engine):
    free = engine.generate(SequenceRequest("free", prompt(engine), 8, min_new_tokens=8))
    stop_id = free.token_ids[0]
    held = engine.generate(SequenceRequest("held", prompt(engine), 8, min_new_tokens=3,
                                           stop_token_ids=(stop_id,)))
    assert stop_id not in held.token_ids[:3]


def test_stop_token_rules(engine):
    with pytest.raises(InvalidField, match="ignore_eos"):
        SequenceRequest("c", (1, 2), 4, ignore_eos=True, constraint=ConstraintSpec("regex", "a+"))
    with pytest.raises(InvalidField, match="stop_token_ids"):
        SequenceRequest("n", (1, 2), 4, stop_token_ids=tuple(range(17)))
    with pytest.raises(InvalidField, match="vocabulary"):
        engine.check(SequenceRequest("v", (1, 2), 4, stop_token_ids=(10**7,)))
