"""Engine lifecycle: validation, capacity, cancel, concurrency, failures, EOS, stop sequences."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import pytest

import worker_service.core.sequence as sequence_module
from ortserve.status.errors import InvalidField
from worker_service.core.errors import (
    CapacityExceeded,
    ContextWindowFull,
    DeviceUnavailable,
    EngineError,
    LeaseNotRestored,
)
from worker_service.core.sampling import Sampler, SamplingConfig
from worker_service.core.sequence import (
    Cancelled,
    Completed,
    Failed,
    FinishReason,
    SequenceRequest,
    TokenDelta,
)
from worker_service.engine import Engine, EngineConfig

TERMINAL = (Completed, Cancelled, Failed)


class Recorder:
    """An on_event callback that keeps every event (thread-safe enough: appends only)."""

    def __init__(self) -> None:
        self.events: list = []
        self.done = threading.Event()
        self.tokens = threading.Semaphore(0)

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TokenDelta):
            self.tokens.release()
        if isinstance(event, TERMINAL):
            self.done.set()

    def terminal(self) -> list:
        return [e for e in self.events if isinstance(e, TERMINAL)]

    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TokenDelta))

    def token_ids(self) -> list[int]:
        return [t for e in self.events if isinstance(e, TokenDelta) for t in e.token_ids]


def wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.002)
    return predicate()


@pytest.fixture(scope="module")
def engine(tiny_dir):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as eng:
        yield eng


@pytest.fixture(scope="module")
def prompt(engine) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode_chat([("user", "Tell me a long story.")]))


SAMPLED = SamplingConfig(temperature=1.0, seed=21)


# --- validation -------------------------------------------------------------

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


# --- capacity ----------------------------------------------------------------

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


# --- cancel ------------------------------------------------------------------

def test_cancel_frees_the_buffer_within_a_step_and_sends_one_cancelled(engine, prompt):
    rec = Recorder()
    handle = engine.submit(SequenceRequest("cancel-me", prompt, 1800), rec)
    for _ in range(3):
        assert rec.tokens.acquire(timeout=5)
    assert engine.held_bytes() > 0
    handle.cancel()
    assert wait_for(lambda: engine.held_bytes() == 0 and rec.done.is_set(), 1.0)
    handle.cancel()  # idempotent
    time.sleep(0.05)
    [terminal] = rec.terminal()
    assert isinstance(terminal, Cancelled) and 3 <= terminal.generated_tokens < 1800
    assert isinstance(rec.events[0], TokenDelta) and rec.events[-1] is terminal
    assert engine.active_sequences() == 0


def test_held_bytes_by_key_names_each_live_sequence_and_stopping_one_fails_it(engine, prompt):
    """The worker's Info lists what each lease holds, and a lease the ledger did not take
    back stops its sequence (Failed with the worker's error, not Cancelled) and frees it."""
    running, other = Recorder(), Recorder()
    engine.submit(SequenceRequest("lease-a", prompt, 1800), running)
    engine.submit(SequenceRequest("lease-b", prompt, 40), other)
    assert running.tokens.acquire(timeout=5)
    held = engine.held_bytes_by_key()
    assert set(held) == {"lease-a", "lease-b"} or set(held) == {"lease-a"}  # b may be done
    assert held["lease-a"] == engine.kv.bytes_for(len(prompt) + 1800)
    error = LeaseNotRestored("lease-a", "worker-0")
    assert engine.stop_sequence("lease-a", error)
    assert wait_for(lambda: running.done.is_set(), 5.0)
    [terminal] = running.terminal()
    assert isinstance(terminal, Failed) and terminal.error is error
    assert other.done.wait(5) and isinstance(other.terminal()[0], Completed)
    assert wait_for(lambda: engine.held_bytes() == 0)
    assert engine.held_bytes_by_key() == {}
    assert not engine.stop_sequence("lease-a", error)  # ended: nothing to stop


def test_cancelling_a_finished_sequence_is_a_no_op(engine, prompt):
    rec = Recorder()
    handle = engine.submit(SequenceRequest("short", prompt, 3), rec)
    assert rec.done.wait(5)
    handle.cancel()
    time.sleep(0.05)
    assert [type(e) for e in rec.terminal()] == [Completed]


# --- concurrency -------------------------------------------------------------

def test_two_sequences_interleave_and_each_equals_its_solo_run(engine):
    reqs = [
        SequenceRequest("x", tuple(engine.tokenizer.encode("Once upon a time")), 60,
                        sampling=SamplingConfig(temperature=1.0, seed=1)),
        SequenceRequest("y", tuple(engine.tokenizer.encode_chat([("user", "Hi there")])), 60,
                        sampling=SamplingConfig(temperature=0.8, top_k=50, seed=2)),
    ]
    solo = [engine.generate(r).token_ids for r in reqs]
    order: list[str] = []
    recs = [Recorder(), Recorder()]

    def tap(i):
        def on_event(event):
            if isinstance(event, TokenDelta):
                order.append(event.sequence_id)
            recs[i](event)
        return on_event

    for i, r in enumerate(reqs):
        engine.submit(r, tap(i))
    assert all(rec.done.wait(10) for rec in recs)
    for rec, expected in zip(recs, solo, strict=True):
        [done] = rec.terminal()
        assert isinstance(done, Completed)
        assert tuple(rec.token_ids()) == done.token_ids == expected
    # Interleaved: each one's tokens arrive while the other is still generating.
    last = {rid: len(order) - 1 - order[::-1].index(rid) for rid in ("x", "y")}
    assert order.index("y") < last["x"] and order.index("x") < last["y"]
    assert sum(a != b for a, b in zip(order, order[1:], strict=False)) > 50
    assert engine.held_bytes() == 0


def test_running_sequences_keep_decoding_while_a_long_prompt_prefills(tiny_dir, prompt):
    order: list[tuple[str, str]] = []
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2,
                             prefill_chunk_tokens=4)) as eng:
        first = Recorder()
        eng.submit(SequenceRequest("decoding", prompt, 400), lambda e: (
            order.append((e.sequence_id, type(e).__name__)), first(e)))
        assert first.tokens.acquire(timeout=5)
        second = Recorder()
        long_prompt = tuple(eng.tokenizer.encode("word " * 200))
        order.append(("prefilling", "Submitted"))
        eng.submit(SequenceRequest("prefilling", long_prompt, 2), lambda e: (
            order.append((e.sequence_id, type(e).__name__)), second(e)))
        assert second.done.wait(10) and first.done.wait(10)
    started = order.index(("prefilling", "Submitted"))
    first_token = order.index(("prefilling", "TokenDelta"))
    # ~50 chunks of 4: the running sequence made a token in (nearly) every one of those iterations.
    assert order[started:first_token].count(("decoding", "TokenDelta")) >= 40


def test_a_failing_sequence_fails_alone(engine, prompt, monkeypatch):
    class BrokenSampler(Sampler):
        calls = 0

        def choose(self, logits, history, top_logprobs=None):
            if self.config.seed == 666:
                BrokenSampler.calls += 1
                if BrokenSampler.calls == 3:
                    raise RuntimeError("sampler exploded")
            return super().choose(logits, history, top_logprobs)

    monkeypatch.setattr(sequence_module, "Sampler", BrokenSampler)
    good, bad = Recorder(), Recorder()
    engine.submit(SequenceRequest("good", prompt, 30), good)
    engine.submit(SequenceRequest("bad", prompt, 30,
                                  sampling=SamplingConfig(temperature=1.0, seed=666)), bad)
    assert good.done.wait(10) and bad.done.wait(10)
    [failed] = bad.terminal()
    assert isinstance(failed, Failed) and isinstance(failed.error, EngineError)
    assert "RuntimeError: sampler exploded" in str(failed.error)
    assert isinstance(good.terminal()[0], Completed)
    assert engine.held_bytes() == 0
    assert engine.generate(SequenceRequest("after", prompt, 2)).generated_tokens == 2


def test_close_fails_what_is_in_flight_and_refuses_more(tiny_dir, prompt):
    eng = Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2))
    rec = Recorder()
    eng.submit(SequenceRequest("long", prompt, 1800), rec)
    assert rec.tokens.acquire(timeout=5)
    eng.close()
    [terminal] = rec.terminal()
    assert isinstance(terminal, Failed) and "closed" in str(terminal.error)
    assert eng.held_bytes() == 0
    with pytest.raises(EngineError, match="closed"):
        eng.submit(SequenceRequest("late", prompt, 2), Recorder())
    eng.close()


# --- EOS, min_new_tokens, stop sequences --------------------------------------

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


# --- devices -----------------------------------------------------------------

@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="a GPU is present here")
def test_cuda_without_a_gpu_is_refused_naming_the_provider(tiny_dir):
    with pytest.raises(DeviceUnavailable) as info:
        Engine(EngineConfig(model_dir=tiny_dir, device="cuda"))
    message = str(info.value)
    assert message.startswith("CUDAExecutionProvider not active")
    assert "--device cpu" in message


# --- the batched KV arena ------------------------------------------------------

def test_committed_kv_memory_never_exceeds_the_charge_in_a_concurrent_run(tiny_dir, prompt):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as eng:
        assert eng.kv_layout == "arena"
        arena = eng._arena
        samples: list[tuple[int, int]] = []
        step = eng.step

        def checked_step():
            # On the engine thread, after each step: only this thread frees, so the
            # kernel's count and the charge read here cannot race a release.
            step()
            samples.append((arena.kernel_committed_bytes(), eng.held_bytes()))

        eng.step = checked_step
        recs = [Recorder() for _ in range(6)]
        for i, rec in enumerate(recs):
            eng.submit(SequenceRequest(f"s{i}", prompt[: 5 + 6 * i], 40 + 30 * i,
                                       min_new_tokens=40 + 30 * i), rec)
        handle = eng.submit(SequenceRequest("cancelled", prompt, 500, min_new_tokens=500),
                            cancelled := Recorder())
        assert cancelled.tokens.acquire(timeout=10)
        handle.cancel()
        assert all(rec.done.wait(30) for rec in recs) and cancelled.done.wait(10)
        assert len(samples) > 10
        assert max(c for c, _ in samples) > 0  # the arena really committed memory
        assert all(committed <= held for committed, held in samples)
        assert arena.kernel_committed_bytes() == 0 and eng.held_bytes() == 0
        assert eng.runner.largest_batch >= 2


def test_a_cancel_mid_batch_leaves_the_other_rows_tokens_unchanged(tiny_dir, prompt):
    reqs = [SequenceRequest(f"k{i}", prompt[: 8 + 5 * i], 60, min_new_tokens=60,
                            sampling=SamplingConfig(temperature=1.0, seed=100 + i))
            for i in range(4)]
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as eng:
        solo = [eng.generate(r).token_ids for r in reqs]
        recs = [Recorder() for _ in reqs]
        handles = [eng.submit(r, rec) for r, rec in zip(reqs, recs, strict=True)]
        for _ in range(5):
            assert recs[1].tokens.acquire(timeout=10)
        handles[1].cancel()  # row 1 leaves; the last row moves into its place
        assert all(rec.done.wait(30) for rec in recs)
    assert isinstance(recs[1].terminal()[0], Cancelled)
    for i in (0, 2, 3):
        assert tuple(recs[i].token_ids()) == solo[i]
