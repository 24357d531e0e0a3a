"""A flag's default from its environment variable, checked as the flag itself would be.

argparse checks `type` and `choices` only on what the command line gives: a default is
taken as it is (a string default goes through `type`, its error naming the flag the
user never typed; `choices` are never checked, so ORTSERVE_WORKER_DEVICE=gpu would
reach the engine). Every service reads its variables here instead: a value that does
not parse, or is not one of the choices, stops the program with exit 2 and a message
naming the variable, its value and what it takes.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Collection
from typing import Any

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def boolean(value: str) -> bool:
    """A yes/no variable: one of 1/true/yes/on or 0/false/no/off (any case)."""
    word = value.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(value)


_WHAT = {int: "a whole number", float: "a number",
         boolean: f"a yes or no ({'/'.join(_TRUE)} or {'/'.join(_FALSE)})"}


def from_env(parser: argparse.ArgumentParser, key: str, default: Any = None,
             kind: Callable[[str], Any] | None = None,
             choices: Collection[str] | None = None) -> Any:
    """The variable `key` parsed by `kind` (default: the default's type; str when the
    default is None); `default` when it is unset. A bad value: parser.error (exit 2)."""
    value = os.environ.get(key)
    if value is None:
        return default
    kind = kind or (str if default is None else type(default))
    try:
        parsed = kind(value)
    except ValueError:
        parser.error(f"{key}={value!r} is not {_WHAT.get(kind, kind.__name__)}")
    if choices is not None and parsed not in choices:
        parser.error(f"{key}={value!r} is not one of {', '.join(choices)}")
    return parsed
