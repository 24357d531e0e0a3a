"""Sequences side by side in one engine: they interleave and each equals its solo run,
decoding goes on while a long prompt prefills, one failure fails alone, and the batched KV
arena never commits more memory than was charged."""

from __future__ import annotations

import worker_service.core.sequence as sequence_module
from tests.unit.worker_service.event_recorder import Recorder
from worker_service.core.errors import EngineError
from worker_service.core.sampling import Sampler, SamplingConfig
from worker_service.core.sequence import (
    Cancelled,
    Completed,
    Failed,
    SequenceRequest,
    TokenDelta,
)
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine


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


def test_a_step_that_fails_whole_fails_its_sequences_and_the_engine_goes_on(tiny_dir, prompt):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as engine:
        run = engine.runner.run
        calls = []

        def exploding_run(plan):
            calls.append(plan)
            if len(calls) == 3:  # a decode step with both sequences in it
                raise RuntimeError("runner exploded")
            return run(plan)

        engine.runner.run = exploding_run
        first, second = Recorder(), Recorder()
        with engine._cond:  # the engine thread takes them together
            engine.submit(SequenceRequest("a", prompt, 30), first)
            engine.submit(SequenceRequest("b", prompt, 30), second)
        assert first.done.wait(30) and second.done.wait(30)
        for rec in (first, second):
            [failed] = rec.terminal()
            assert isinstance(failed, Failed) and "RuntimeError: runner exploded" in str(
                failed.error)
        assert engine.held_bytes() == 0 and engine.active_sequences() == 0
        assert engine.generate(SequenceRequest("after", prompt, 2)).generated_tokens == 2


def test_committed_kv_memory_never_exceeds_the_charge_in_a_concurrent_run(tiny_dir, prompt):
    with Engine(EngineConfig(model_dir=tiny_dir, intra_op_threads=2)) as eng:
        assert eng.kv_layout == "arena"
        arena = eng.runtime.rows
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
