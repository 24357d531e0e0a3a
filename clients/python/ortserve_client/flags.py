"""argparse `type=` functions for the CLI's numeric flags, one per range of the proto field,
and for the flags that take a file.

A value outside its field's range would otherwise reach protobuf, which raises
"Value out of range" from deep inside the request builder: argparse must refuse it
first, so the user sees exit 2 and a message naming the flag and the range.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

UINT32_MAX = 2**32 - 1
UINT64_MAX = 2**64 - 1
# NOTE: the sampling fields are proto `float` (32-bit): a larger double becomes inf on the wire.
FLOAT32_MAX = 3.4028234663852886e38


def int_range(low: int, high: int, what: str) -> Callable[[str], int]:
    """A parser of integers in [low, high]; `what` names the range in the error."""

    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer; expected {what}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is out of range; expected {what}")
        return value

    parse.__name__ = what  # argparse names the type in some of its own messages
    return parse


def float_range(low: float, high: float, what: str, *, low_open: bool = False) -> Callable[[str], float]:
    """A parser of finite floats in [low, high] (or (low, high] with low_open)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected {what}") from None
        above_low = value > low if low_open else value >= low
        if not (math.isfinite(value) and above_low and value <= high):
            raise argparse.ArgumentTypeError(f"{text} is out of range; expected {what}")
        return value

    parse.__name__ = what
    return parse


# One per proto field (protos/ortserve/v1/types.proto); the servers check the same ranges.
max_new_tokens = int_range(1, UINT32_MAX, f"an integer from 1 to {UINT32_MAX:,} (uint32)")
uint32 = int_range(0, UINT32_MAX, f"an integer from 0 to {UINT32_MAX:,} (uint32)")
uint64 = int_range(0, UINT64_MAX, f"an integer from 0 to {UINT64_MAX:,} (uint64)")
temperature = float_range(0.0, FLOAT32_MAX, "a finite number >= 0 (0: greedy)")
top_p = float_range(0.0, 1.0, "a number in (0, 1]", low_open=True)
repetition_penalty = float_range(0.0, FLOAT32_MAX, "a finite number > 0 (1: no penalty)",
                                 low_open=True)
# The gRPC deadline: a zero or negative one would fail every call before it is sent.
timeout_s = float_range(0.0, 365 * 86_400.0, "a number of seconds > 0", low_open=True)
# Whole milliseconds on the wire (uint32): at most ~49 days.
queue_wait_s = float_range(0.0, UINT32_MAX / 1e3, "a number of seconds >= 0 (0: do not wait)")
retries = int_range(0, 100, "an integer from 0 to 100")
# NOTE: the newer SamplingParams fields get only their proto type's range here: their own
# ranges are the server's to check (its INVALID_ARGUMENT names the field, exit 4).
finite_float = float_range(-FLOAT32_MAX, FLOAT32_MAX, "a finite number")


def text_file(path: str) -> str:
    """The UTF-8 text of a file (a grammar, a schema)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: "
                                         f"{getattr(error, 'strerror', None) or error}") from None


def json_schema(text: str) -> str:
    """A JSON Schema given inline (text that starts with `{`) or as a file's path; sent as it
    is (the server compiles it and names constraint.json_schema when it cannot)."""
    return text if text.lstrip().startswith("{") else text_file(text)



def add_goal_flags(p: argparse.ArgumentParser, per: str = "") -> None:
    """--max-itl-ms and --max-ttft-ms, the request's latency goals (GenerateRequest's fields,
    docs/features/time-budget.md); `per`: how they apply (", per turn" on a session)."""
    p.add_argument("--max-itl-ms", type=uint32, default=None,
                   help=f"a latency goal{per}: the longest gap between tokens, ms; admission "
                        "starts the request only where every stream keeps its goal, else it "
                        "waits or is refused with the numbers (docs/features/time-budget.md); "
                        "unset or 0: the scheduler's default")
    p.add_argument("--max-ttft-ms", type=uint32, default=None,
                   help=f"a latency goal{per}: the longest wait for the first token, ms; a "
                        "request whose estimated wait passes it is refused at once (retry after "
                        "the wait); unset or 0: the scheduler's default")
