"""Progress for people and the tools' output in a log: one line per step (what, how long).

stderr gets the progress lines; fds 1 and 2 go to a log file while a step runs,
so transformers' logging, tqdm bars and the builder's chatter never reach the
terminal (or stdout, which is for results).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

RETRY_HINT = ("fix the cause and rerun `.venv-tools/bin/python -m model_tools.prepare` "
              "(--force also rebuilds the intermediate folders under <cache>/hf)")


class PrepareError(RuntimeError):
    """A failure with a one-line cause and a next step."""

    def __init__(self, what: str, hint: str = RETRY_HINT) -> None:
        super().__init__(what)
        self.what, self.hint = what, hint

    def line(self) -> str:
        return f"{self.what}; {self.hint}" if self.hint else self.what


@dataclass(frozen=True)
class Step:
    label: str
    run: Callable[[], None]
    expected: str = ""  # how long it takes on a 2-core machine, for the progress line


# Where progress for people goes: the real stderr, even while fds 1 and 2 point at the
# log file (see captured_output).
_console = sys.stderr


def say(text: str, end: str = "\n") -> None:
    """Progress for people, on stderr (stdout is for the output paths)."""
    print(f"prepare: {text}", file=_console, end=end, flush=True)


@contextlib.contextmanager
def captured_output(log_path: Path) -> Iterator[None]:
    """Send fds 1 and 2 (transformers' logging and tqdm bars, the builder's and the
    quantizer's output, tracebacks) to `log_path`; `say` still reaches the terminal."""
    global _console
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    console = os.fdopen(os.dup(2), "w", buffering=1)
    previous, _console = _console, console
    with open(log_path, "ab", buffering=0) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved_out, 1)
            os.dup2(saved_err, 2)
            os.close(saved_out)
            os.close(saved_err)
            _console = previous
            console.close()


def log_tail(log_path: Path, lines: int = 15) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def run_steps(steps: list[Step], log_path: Path) -> None:
    """Run the steps in order, one progress line each (what, how long), the tools' output
    in `log_path`; any failure becomes one PrepareError naming the step and the log."""
    say(f"{len(steps)} step(s); the tools' own output goes to {log_path}")
    for index, step in enumerate(steps, 1):
        expected = f" (expected: {step.expected})" if step.expected else ""
        say(f"[{index}/{len(steps)}] {step.label}{expected} ...", end="")
        start_s = time.monotonic()
        failure: PrepareError | None = None
        with captured_output(log_path):
            print(f"==> [{index}/{len(steps)}] {step.label}", flush=True)
            try:
                step.run()
            except KeyboardInterrupt:
                print(" interrupted", file=_console, flush=True)
                raise
            except PrepareError as error:
                failure = PrepareError(f"{step.label} failed: {error.what}", error.hint)
            except Exception as error:
                traceback.print_exc()
                failure = PrepareError(f"{step.label} failed: {type(error).__name__}: {error}")
        if failure is not None:
            print(" failed", file=_console, flush=True)
            tail = log_tail(log_path)
            if tail:
                print(f"--- the last lines of {log_path}:\n{tail}\n---", file=_console,
                      flush=True)
            raise failure
        print(f" done in {time.monotonic() - start_s:.1f} s", file=_console, flush=True)
