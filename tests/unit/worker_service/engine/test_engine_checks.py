"""What the engine refuses before it runs anything, naming the cause and the numbers: a bad
field, a full context window, a reservation over capacity, CUDA without a GPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ortserve.status.errors import InvalidField
from tests.unit.worker_service.event_recorder import Recorder
from worker_service.core.errors import CapacityExceeded, ContextWindowFull, DeviceUnavailable
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import SequenceRequest
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prompt_ids": ()}, "prompt"),
        ({"prompt_ids": (1, 49152)}, "token_ids.ids[1]"),
        ({"prompt_ids": (-1,)}, "token_ids.ids[0]"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"min_new_tokens": 9}, "min_new_tokens"),
        ({"stop": ("ok", "")}, "stop[1]"),
        ({"sampling": SamplingConfig(temperature=1.0, top_p=0.0)}, "sampling.top_p"),
        ({"sampling": SamplingConfig(temperature=-1.0)}, "sampling.temperature"),
        ({"sampling": SamplingConfig(temperature=1.0, top_k=-2)}, "sampling.top_k"),
        ({"sampling": SamplingConfig(seed=5)}, "sampling.seed"),
        ({"sampling": SamplingConfig(repetition_penalty=0.0)}, "sampling.repetition_penalty"),
    ],
)
def test_bad_request_is_rejected_naming_the_field_and_holds_nothing(engine, change, field):
    # The rules' one invalid-field error (ortserve.rules.request_rules), whichever rule refused.
    with pytest.raises(InvalidField) as info:
        engine.submit(dataclasses.replace(SequenceRequest("bad", (1, 2, 3), 8), **change),
                      Recorder())
    assert info.value.field == field
    assert engine.held_bytes() == 0 and engine.active_sequences() == 0


def test_full_context_window_is_an_error_with_the_numbers(engine):
    context = engine.spec.context_length
    with pytest.raises(ContextWindowFull) as info:
        engine.check(SequenceRequest("full", (1,) * context, 1))
    assert (info.value.prompt_tokens, info.value.context_length) == (context, context)
    assert f"{context:,} tokens" in str(info.value)
    assert "a full context window is an error, not an empty turn" in str(info.value)
    with pytest.raises(ContextWindowFull) as info:
        engine.check(SequenceRequest("over", (1,) * 100, context))
    message = str(info.value)
    assert info.value.max_new_tokens == context
    assert f"lower max_new_tokens to {context - 100:,}" in message and "100 tokens" in message
    engine.check(SequenceRequest("fits", (1,) * 100, context - 100))


def test_held_bytes_equal_the_reservation_and_overflow_raises_with_numbers(tiny_dir, prompt):
    max_new = 1500
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as probe:
        per_seq = probe.kv.bytes_for(len(prompt) + max_new)
    assert per_seq == (len(prompt) + max_new) * probe.spec.bytes_per_token
    capacity = 2 * per_seq - 1
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2,
                             kv_capacity_bytes=capacity)) as eng:
        rec = Recorder()
        handle = eng.submit(SequenceRequest("a", prompt, max_new), rec)
        assert eng.held_bytes() == per_seq  # reserved synchronously, before the engine thread runs
        with pytest.raises(CapacityExceeded) as info:
            eng.submit(SequenceRequest("b", prompt, max_new), Recorder())
        err = info.value
        assert (err.needed_bytes, err.held_bytes, err.capacity_bytes) == (per_seq, per_seq, capacity)
        assert f"{per_seq:,} bytes" in str(err) and "--kv-capacity" in str(err)
        # A smaller one still fits beside it.
        small = eng.generate(SequenceRequest("c", prompt[:4], 4))
        assert small.generated_tokens == 4
        handle.cancel()
        assert rec.done.wait(5)
        assert eng.held_bytes() == 0


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU is present here")
def test_cuda_without_a_gpu_is_refused_naming_the_provider(tiny_dir):
    with pytest.raises(DeviceUnavailable) as info:
        Engine(EngineConfig(model_dir=tiny_dir, device="cuda"))
    message = str(info.value)
    assert message.startswith("CUDAExecutionProvider not active")
    assert "--device cpu" in message
