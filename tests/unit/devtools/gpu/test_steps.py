"""devtools/gpu/steps.py: each step under its own timeout and the proof's deadline.

Real processes; time is a fake clock where a test needs a timeout to have passed, so no test
waits for one."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from devtools.gpu import steps


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (FileNotFoundError, IndexError):
        return True
    return state == "Z"


def wait_until(condition, what: str, limit_s: float = 30.0) -> None:
    end = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.05)


def test_a_step_that_exits_zero_is_ok_and_one_that_does_not_is_failed(tmp_path):
    deadline = steps.Deadline(600)
    ok = steps.run("fine", python("print('out'); import sys; print('err', file=sys.stderr)"),
                   60, deadline, tmp_path)
    assert (ok.status, ok.exit_code, ok.timeout_s) == ("ok", 0, 60)
    assert (tmp_path / "fine.log").read_text().split() == ["out", "err"]
    bad = steps.run("broken", python("import sys; sys.exit(3)"), 60, deadline, tmp_path)
    assert (bad.status, bad.exit_code) == ("failed", 3)


def test_stdout_can_be_the_steps_result_file(tmp_path):
    result = tmp_path / "result.json"
    steps.run("json", python("print('{\"a\": 1}')"), 60, steps.Deadline(600), tmp_path,
              stdout_path=result)
    assert result.read_text().strip() == '{"a": 1}'


def test_a_step_past_its_timeout_is_stopped_with_its_children_and_recorded(tmp_path):
    pidfile = tmp_path / "child.pid"
    code = ("import subprocess, sys, time\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
            "time.sleep(600)\n")
    clock = Clock()
    step = steps.Running("slow", python(code), 30, tmp_path / "slow.log", clock=clock)
    wait_until(lambda: pidfile.exists() and pidfile.read_text(), "the step started its child")
    child = int(pidfile.read_text())
    clock.now += 31  # its timeout has passed
    outcome = step.wait()
    assert outcome.status == "timeout" and outcome.timeout_s == 30
    assert "stopped after" in outcome.note
    assert step.process.poll() is not None
    wait_until(lambda: gone(child), "the step's child was stopped with it")


def test_a_step_the_deadline_leaves_too_little_time_for_is_skipped_not_started(tmp_path):
    clock = Clock()
    deadline = steps.Deadline(100, clock)
    clock.now += 100 - steps.RESERVE_S - steps.MIN_STEP_S + 1
    outcome = steps.run("late", python("open('started', 'w')"), 60, deadline, tmp_path,
                        cwd=tmp_path)
    assert outcome.status == "skipped" and "s left before the deadline" in outcome.note
    assert not (tmp_path / "started").exists()


def test_the_deadline_shortens_a_steps_planned_timeout():
    clock = Clock()
    deadline = steps.Deadline(100, clock)
    assert deadline.timeout_for(60) == 60
    clock.now += 50
    assert deadline.timeout_for(60) == 100 - 50 - steps.RESERVE_S
    assert deadline.left_s() == 50


def test_a_step_that_cannot_start_is_an_error_outcome(tmp_path):
    outcome = steps.run("missing", [str(tmp_path / "no-such-program")], 60,
                        steps.Deadline(600), tmp_path)
    assert outcome.status == "error" and "could not start" in outcome.note


def test_an_outcome_leaves_empty_fields_out_of_its_json():
    assert steps.StepOutcome("x", "skipped", note="why").to_json() == {
        "name": "x", "status": "skipped", "seconds": 0.0, "note": "why"}


def test_environment_reaches_the_step(tmp_path):
    env = {**os.environ, "GPU_PROOF_TEST": "yes"}
    steps.run("env", python("import os; print(os.environ['GPU_PROOF_TEST'])"), 60,
              steps.Deadline(600), tmp_path, env=env)
    assert (tmp_path / "env.log").read_text().strip() == "yes"
