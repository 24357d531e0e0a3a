"""The postprocess takes the device's greedy id where it is the sequence's token, and goes to
the logits where it is not (a sampled row, a suppressed id)."""

from __future__ import annotations

import numpy as np
import pytest

from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import Sequence, SequenceRequest
from worker_service.core.tokenizer import Tokenizer
from worker_service.engine.postprocess import apply_step
from worker_service.runtime.runner import StepOutput, takes_greedy_id

EOS = 2


@pytest.fixture(scope="module")
def tokenizer(tiny_dir) -> Tokenizer:
    return Tokenizer(tiny_dir)


def _seq(tokenizer, sid: str, **fields) -> Sequence:
    seq = Sequence(SequenceRequest(sid, (1, 2, 3), 4, **fields), lambda e: None, tokenizer,
                   tokenizer.vocab_size, (EOS,))
    seq.num_computed_tokens = 2  # its last prompt token is this step's input
    return seq


def _step(out: StepOutput, seq: Sequence, greedy: int | None, logits: np.ndarray | None):
    step = out.step_of(seq)
    step.computed_tokens = 1
    step.greedy_token, step.logits = greedy, logits


def test_a_greedy_row_takes_the_device_id_with_no_logits_on_the_host(tokenizer):
    seq = _seq(tokenizer, "greedy")
    assert takes_greedy_id(seq)
    out = StepOutput()
    _step(out, seq, 77, None)  # its logits stayed on the device
    applied = apply_step(out, runner=None, vocab_size=tokenizer.vocab_size)
    assert not applied.failed and seq.token_ids[-1] == 77


def test_a_suppressed_id_sends_the_sampler_to_the_logits(tokenizer):
    seq = _seq(tokenizer, "min", min_new_tokens=2)
    assert not takes_greedy_id(seq)  # the runner brings its logits down
    logits = np.zeros(tokenizer.vocab_size, dtype=np.float32)
    logits[EOS], logits[55] = 9.0, 8.0
    out = StepOutput()
    _step(out, seq, EOS, logits)  # the device's first maximum is EOS: not allowed yet
    apply_step(out, runner=None, vocab_size=tokenizer.vocab_size)
    assert seq.token_ids[-1] == 55


def test_a_sampled_row_reads_its_logits_not_the_device_id(tokenizer):
    seq = _seq(tokenizer, "sampled", sampling=SamplingConfig(temperature=1.0, seed=3, top_k=1))
    assert not takes_greedy_id(seq)
    logits = np.zeros(tokenizer.vocab_size, dtype=np.float32)
    logits[66] = 5.0
    out = StepOutput()
    _step(out, seq, 77, logits)  # an id for the batch's greedy rows, not this one's
    apply_step(out, runner=None, vocab_size=tokenizer.vocab_size)
    assert seq.token_ids[-1] == 66
