"""Teacher forcing through the whole engine: a sequence's tokens are set in advance and the
logits the model gave at each of them are recorded.

The seam: the engine runs `runner.run(plan)` and its postprocess takes a step's
`token` when the runner set one (runtime/runner.py `SequenceStep.token`, the
bench's rate-set runner uses it) instead of sampling. `TeacherForcing` wraps
the engine's runner: after each run it copies the logits handed back for a
forced sequence (the last position's, as the engine would sample from) and sets
the step's token to the next forced one. Nothing else changes: the scheduler,
the batched runs, rows joining and leaving, session turns, the prefix cache,
the device rows, the ledger all run as they serve. No engine code knows.

A forced sequence asks exactly len(forced) new tokens, EOS ignored, so its
logits are [len(forced), vocab]: row k scores the token after the prompt and
forced[:k].
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np

from worker_service.core.errors import EngineError
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest, TokenDelta
from worker_service.runtime.runner import Runner, StepOutput


class TeacherForcing:
    """The engine's runner with forced tokens for registered sequences (engine thread)."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._lock = threading.Lock()
        self._forced: dict[str, tuple[int, ...]] = {}
        self._logits: dict[str, list[np.ndarray]] = {}

    def __getattr__(self, name: str):  # everything else is the runner's own
        return getattr(self._runner, name)

    def force(self, sequence_id: str, tokens: Sequence[int]) -> None:
        """Register before submitting: the sequence's new tokens will be `tokens`."""
        with self._lock:
            self._forced[sequence_id] = tuple(tokens)
            self._logits[sequence_id] = []

    def logits(self, sequence_id: str) -> np.ndarray:
        """The recorded logits [positions, vocab] (float32), and forget the sequence."""
        with self._lock:
            self._forced.pop(sequence_id, None)
            rows = self._logits.pop(sequence_id, [])
        if not rows:
            raise EngineError(f"no logits were recorded for {sequence_id!r}")
        return np.stack(rows)

    def run(self, plan) -> StepOutput:
        out = self._runner.run(plan)
        with self._lock:
            for sid, step in out.steps.items():
                forced = self._forced.get(sid)
                if forced is None or step.error is not None:
                    continue
                if step.verify_logits is not None:
                    step.error = EngineError("teacher forcing does not take speculative "
                                             "verification; run the check with speculation off")
                    continue
                if step.logits is None:
                    continue  # a middle prompt chunk
                rows = self._logits[sid]
                if len(rows) >= len(forced):
                    step.error = EngineError(f"{sid!r} ran past its {len(forced)} forced tokens")
                    continue
                # A copy: the runner's decode buffer is rewritten by the next run.
                rows.append(np.array(step.logits, dtype=np.float32).reshape(-1))
                step.token = forced[len(rows) - 1]
        return out


def install(engine) -> TeacherForcing:
    """Wrap `engine`'s runner (once) and return the wrapper."""
    if not isinstance(engine.runner, TeacherForcing):
        engine.runner = TeacherForcing(engine.runner)
    return engine.runner


# Never sampled from (the forced token wins), but not plain greedy either: a runner that
# picks greedy rows' tokens itself, with no host logits, must still hand these logits back.
FORCED_SAMPLING = SamplingConfig(temperature=1.0, seed=0)


def forced_request(sequence_id: str, prompt: Sequence[int], forced: Sequence[int]
                   ) -> SequenceRequest:
    """A request that runs exactly the forced tokens (EOS does not end it)."""
    n = len(forced)
    return SequenceRequest(sequence_id, tuple(prompt), n, min_new_tokens=n, ignore_eos=True,
                           sampling=FORCED_SAMPLING)


def run_together(engine, requests: list[SequenceRequest], timeout_s: float,
                 between: Callable[[], None] | None = None) -> dict[str, Completed]:
    """Submit half the requests, the rest once the first token is out (they join a batch
    already decoding); `between` runs on the engine thread at every event. Returns the
    Completed events by sequence id; raises, naming the numbers, on a failure or when
    they are not all done within `timeout_s`."""
    done: dict[str, object] = {}
    finished = threading.Event()
    first = threading.Event()

    def on_event(event) -> None:
        if isinstance(event, TokenDelta) and not first.is_set():
            first.set()
        if between is not None:
            between()
        if isinstance(event, TERMINAL):
            done[event.sequence_id] = event
            if len(done) == len(requests):
                finished.set()

    half = len(requests) // 2
    handles = [engine.submit(req, on_event) for req in requests[:half]]
    if half and not first.wait(timeout_s):
        for h in handles:
            h.cancel()
        raise EngineError(f"no first token within {timeout_s:.0f} s")
    handles += [engine.submit(req, on_event) for req in requests[half:]]
    if not finished.wait(timeout_s):
        for h in handles:
            h.cancel()
        raise EngineError(f"{len(requests) - len(done)} of {len(requests)} sequences did not "
                          f"finish within {timeout_s:.0f} s")
    bad = [e for e in done.values() if not isinstance(e, Completed)]
    if bad:
        raise EngineError(f"{len(bad)} sequences did not complete; the first: {bad[0]}")
    return done  # type: ignore[return-value]
