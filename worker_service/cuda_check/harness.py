"""Runs cuda_check's checks one by one, each guarded, under one deadline; the summary is
always whole JSON (see the package docstring for its shape).

- One check's exception is its entry's (status "error", the error and the last
  frames of its traceback); the next check runs.
- A check that needs what an earlier one failed to make (the device engine)
  raises `Unmet`: status "skipped" with the reason.
- Past the deadline the checks not yet run are "skipped" with the deadline's
  numbers. Waits inside checks are bounded by `Context.wait_s()`, so a stuck
  stream costs at most what is left, not 600 s a stream.
- A watchdog prints the summary as it stands and exits if the checks are still
  running well past the deadline (a hung ORT run cannot be interrupted).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

STATUSES = ("passed", "failed", "error", "skipped", "not_applicable")
# The watchdog's grace past the deadline: closing engines, a check's last wait (the GPU
# proof's step gives cuda_check its timeout less 30 s: devtools/gpu/proof.py).
WATCHDOG_GRACE_S = 20.0


class Unmet(Exception):  # noqa: N818 - a check's precondition, reported as "skipped"
    """A check cannot run: what it needs (named in the message) is missing."""


@dataclass
class Context:
    """What the checks share: the options, the engines they open, the deadline."""

    model_dir: Path
    device: str  # "cuda" | "cpu" (the dry run)
    device_id: int
    dry_run: bool
    deadline_at: float  # time.monotonic()
    new_tokens: int = 32
    speed_tokens: int = 128
    streams: tuple[int, ...] = (1, 8, 32, 64, 128)
    shared: dict = field(default_factory=dict)  # what one check leaves for another
    _engine: object | None = None
    engine_error: str = ""
    closers: list[Callable[[], None]] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)

    @property
    def engine(self):
        """The device engine (opened by session_starts); Unmet when it did not open."""
        if self._engine is None:
            raise Unmet(f"the device engine did not start ({self.engine_error or 'not opened'})")
        return self._engine

    def remaining_s(self) -> float:
        return self.deadline_at - time.monotonic()

    def wait_s(self, cap_s: float = 300.0) -> float:
        """How long a wait inside a check may take: what is left of the deadline, at most
        `cap_s`, at least 1 s (a check that runs has its chance to finish a step)."""
        return max(1.0, min(cap_s, self.remaining_s()))


Check = tuple[str, Callable[[Context], dict]]


def _traceback_summary(exc: BaseException, frames: int = 6) -> list[str]:
    """The last frames as 'file:line in function: code', innermost last."""
    stack = traceback.extract_tb(exc.__traceback__)[-frames:]
    return [f"{Path(f.filename).name}:{f.lineno} in {f.name}: {(f.line or '').strip()}"
            for f in stack]


def run_one(name: str, check: Callable[[Context], dict], ctx: Context) -> dict:
    """One check, guarded: its result with `status` and `elapsed_s` added."""
    started = time.monotonic()
    try:
        result = dict(check(ctx))
        ok = bool(result.get("ok", False))
        result["ok"] = ok
        result.setdefault("status", "passed" if ok else "failed")
    except Unmet as exc:
        result = {"ok": False, "status": "skipped", "skipped": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one check's failure is its own entry
        result = {"ok": False, "status": "error", "error": f"{type(exc).__name__}: {exc}"[:2000],
                  "traceback": _traceback_summary(exc)}
    result["elapsed_s"] = round(time.monotonic() - started, 2)
    return result


def run_checks(checks: list[Check], ctx: Context, summary: dict) -> dict:
    """Run `checks` in order into summary["checks"] (filled as they finish, so a watchdog
    prints what is done), then close what they opened; returns the summary."""
    results = summary["checks"]
    for name, check in checks:
        left = ctx.remaining_s()
        if left <= 0:
            results[name] = {"ok": False, "status": "skipped", "elapsed_s": 0.0,
                             "skipped": f"the deadline of {summary['deadline_s']:g} s passed "
                                        f"({-left:.0f} s ago) before it ran"}
            continue
        results[name] = {"ok": False, "status": "running"}
        results[name] = run_one(name, check, ctx)
    close_all(ctx)
    return finish(summary, ctx)


def close_all(ctx: Context, timeout_s: float = 8.0) -> None:
    """Close what the checks opened, each on a thread of its own: an engine whose thread
    is stuck in a run must not keep the summary from being printed."""
    for close in reversed(ctx.closers):
        t = threading.Thread(target=close, daemon=True)
        t.start()
        t.join(timeout_s)
    ctx.closers.clear()


def finish(summary: dict, ctx: Context) -> dict:
    checks = summary["checks"]
    summary["failed"] = [n for n, c in checks.items() if not c.get("ok")]
    summary["ok"] = bool(checks) and not summary["failed"]
    summary["elapsed_s"] = round(time.monotonic() - ctx.started_at, 1)
    return summary


class Printer:
    """Prints the summary exactly once, from the main thread or the watchdog."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.printed = False

    def print(self, summary: dict) -> bool:
        with self._lock:
            if self.printed:
                return False
            self.printed = True
            sys.stdout.write(json.dumps(summary, indent=2, ensure_ascii=False, default=str) + "\n")
            sys.stdout.flush()
            return True


def start_watchdog(summary: dict, checks: list[Check], ctx: Context, printer: Printer,
                   grace_s: float = WATCHDOG_GRACE_S) -> threading.Timer:
    """Past the deadline + grace: mark what has not finished, print, exit 1."""

    def fire() -> None:
        results = summary["checks"]
        for name, _ in checks:
            entry = results.get(name)
            if entry is None or entry.get("status") == "running":
                what = "not run" if entry is None else "still running"
                results[name] = {"ok": False, "status": "skipped",
                                 "skipped": f"{what} {grace_s:g} s past the deadline of "
                                            f"{summary['deadline_s']:g} s: stopped"}
        finish(summary, ctx)
        if printer.print(summary):
            print("cuda_check: stopped past its deadline; the summary is as it stood",
                  file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)

    timer = threading.Timer(max(0.0, ctx.remaining_s()) + grace_s, fire)
    timer.daemon = True
    timer.start()
    return timer
