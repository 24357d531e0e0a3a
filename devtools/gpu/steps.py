"""Steps of the GPU proof: each a process with its own timeout, under one overall deadline.

A step that outlives its timeout is stopped with its whole process group (SIGTERM, then
SIGKILL 10 s later) and recorded as `timeout`; the next step still runs. A step whose time
the deadline no longer allows is `skipped`, with the seconds that were left. Nothing here
raises for a step's failure: every outcome is a record for proof.json.

Standard library only: the device's python3 runs this before anything is installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

# Seconds kept back from every step's timeout for what follows the last step (collecting the
# logs, writing proof.json), and the least a step is started with.
RESERVE_S = 15.0
MIN_STEP_S = 15.0
TERM_GRACE_S = 10.0


@dataclass
class StepOutcome:
    """What became of one step."""

    name: str
    status: str  # ok, failed (exit != 0), timeout, skipped, error (could not start)
    exit_code: int | None = None
    seconds: float = 0.0
    timeout_s: float | None = None
    note: str = ""

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in ("", None)}


class Deadline:
    """The proof's overall budget: every step stops by it."""

    def __init__(self, budget_s: float, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.budget_s = budget_s
        self.start = clock()

    def elapsed_s(self) -> float:
        return self.clock() - self.start

    def left_s(self) -> float:
        return self.budget_s - self.elapsed_s()

    def timeout_for(self, planned_s: float) -> float | None:
        """planned_s, shortened to what the deadline leaves (less the reserve); None when that
        is under MIN_STEP_S: the step is not worth starting."""
        allowed = min(planned_s, self.left_s() - RESERVE_S)
        return allowed if allowed >= MIN_STEP_S else None


class Running:
    """One started step: its process (a session of its own, so the group can be stopped)."""

    def __init__(self, name: str, argv: list[str], timeout_s: float, log_path: Path,
                 env: dict[str, str] | None = None, stdout_path: Path | None = None,
                 cwd: Path | None = None, clock: Callable[[], float] = time.monotonic):
        self.name, self.timeout_s, self.clock = name, timeout_s, clock
        self.started = clock()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "ab")  # noqa: SIM115 (the child holds it; closed below)
        out = open(stdout_path, "wb") if stdout_path else log  # noqa: SIM115
        try:
            self.process = subprocess.Popen(argv, stdout=out, stderr=log,
                                            stdin=subprocess.DEVNULL, env=env, cwd=cwd,
                                            start_new_session=True)
        finally:
            log.close()
            if out is not log:
                out.close()

    def running(self) -> bool:
        return self.process.poll() is None

    def wait(self, until_s: float | None = None) -> StepOutcome:
        """Wait until the step ends or its timeout (or `until_s` of the clock, if sooner)
        passes; then stop it and say which."""
        end = self.started + self.timeout_s
        if until_s is not None:
            end = min(end, until_s)
        try:
            code = self.process.wait(timeout=max(0.0, end - self.clock()))
        except subprocess.TimeoutExpired:
            self.stop()
            return StepOutcome(self.name, "timeout", self.process.returncode,
                               round(self.clock() - self.started, 1), round(self.timeout_s, 1),
                               f"stopped after {self.clock() - self.started:.0f} s")
        return StepOutcome(self.name, "ok" if code == 0 else "failed", code,
                           round(self.clock() - self.started, 1), round(self.timeout_s, 1))

    def stop(self) -> None:
        """SIGTERM to the step's process group, SIGKILL if it is still there after a grace."""
        for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, TERM_GRACE_S)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue


def start(name: str, argv: list[str], planned_s: float, deadline: Deadline, log_dir: Path,
          env: dict[str, str] | None = None, stdout_path: Path | None = None,
          cwd: Path | None = None) -> Running | StepOutcome:
    """Start a step with min(planned_s, what the deadline leaves) as its timeout; a StepOutcome
    instead when it cannot start (skipped for time, or an error starting it)."""
    timeout = deadline.timeout_for(planned_s)
    if timeout is None:
        return StepOutcome(name, "skipped", note=f"{deadline.left_s():.0f} s left before the "
                           "deadline, too little to start it")
    try:
        return Running(name, argv, timeout, log_dir / f"{name}.log", env, stdout_path, cwd,
                       deadline.clock)
    except OSError as error:
        return StepOutcome(name, "error", note=f"could not start {argv[0]}: {error}")


def run(name: str, argv: list[str], planned_s: float, deadline: Deadline, log_dir: Path,
        env: dict[str, str] | None = None, stdout_path: Path | None = None,
        cwd: Path | None = None) -> StepOutcome:
    """Start a step and wait for it (never past the deadline)."""
    step = start(name, argv, planned_s, deadline, log_dir, env, stdout_path, cwd)
    if isinstance(step, StepOutcome):
        return step
    return step.wait(deadline.start + deadline.budget_s - RESERVE_S)
