"""A flag's default from its environment variable, checked as the flag itself would be.

argparse checks `type` and `choices` only on what the command line gives: a default is
taken as it is (a string default goes through `type`, its error naming the flag the
user never typed; `choices` are never checked, so ORTSERVE_WORKER_DEVICE=gpu would
reach the engine). Every service reads its variables here instead: a value that does
not parse, or is not one of the choices, stops the program with exit 2 and a message
naming the variable, its value and what it takes. A flag with a rule beyond its type (a
range) takes a `Checked` type, so the rule is checked on the flag and on its variable
alike, and each is named as the user gave it.

every_flag_from_env is the net under the hand-written defaults: once a parser has all its
flags, every flag whose variable (<prefix><DEST>) no from_env call read takes it here,
through the flag's own type, choices or yes/no, so no flag is left whose variable is
ignored or taken unchecked (ORTSERVE_WORKER_LORA=broken started the worker while
--lora broken exited 2).
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


class Checked:
    """A flag's type: the text parsed by `kind`, then `rule(value)`, which returns what is
    wrong with it (None: nothing). argparse names the flag (`argument --x: <problem>`),
    from_env the variable (`KEY: <problem>`); neither names what the user did not type."""

    def __init__(self, kind: Callable[[str], Any], rule: Callable[[Any], str | None]):
        self.kind, self.rule = kind, rule
        self.__name__ = getattr(kind, "__name__", "value")  # argparse's "invalid int value"

    def __call__(self, text: str) -> Any:
        value = self.kind(text)
        problem = self.rule(value)
        if problem:
            raise argparse.ArgumentTypeError(problem)
        return value


def in_range(kind: Callable[[str], Any], low: float, high: float, unit: str = "",
             what: str = "") -> Checked:
    """A number from `low` to `high` (NaN refused), e.g. in_range(int, 1, 1024)."""
    def rule(value):
        if low <= value <= high:
            return None
        return (f"{value:,g}{unit} is outside {low:,g} to {high:,g}{unit}"
                + (f" ({what})" if what else ""))
    return Checked(kind, rule)


def from_env(parser: argparse.ArgumentParser, key: str, default: Any = None,
             kind: Callable[[str], Any] | None = None,
             choices: Collection[str] | None = None) -> Any:
    """The variable `key` parsed by `kind` (default: the default's type; str when the
    default is None); `default` when it is unset. A bad value: parser.error (exit 2)."""
    _read_keys(parser).add(key)
    value = os.environ.get(key)
    if value is None:
        return default
    kind = kind or (str if default is None else type(default))
    base = kind.kind if isinstance(kind, Checked) else kind
    try:
        parsed = kind(value)
    except ValueError:
        parser.error(f"{key}={value!r} is not {_WHAT.get(base, base.__name__)}")
    except argparse.ArgumentTypeError as problem:
        parser.error(f"{key}: {problem}")
    if choices is not None and parsed not in choices:
        parser.error(f"{key}={value!r} is not one of {', '.join(choices)}")
    return parsed


def _read_keys(parser: argparse.ArgumentParser) -> set[str]:
    """The variables from_env read for this parser (every_flag_from_env leaves them)."""
    if not hasattr(parser, "_ortserve_env_keys"):
        parser._ortserve_env_keys = set()
    return parser._ortserve_env_keys


def every_flag_from_env(parser: argparse.ArgumentParser, prefix: str,
                        skip: Collection[str] = ()) -> None:
    """Every flag of `parser` whose variable `prefix + DEST` (upper case) no from_env call
    read, and whose dest is not in `skip` (a flag whose variable has another name), takes
    that variable as its default, checked as the flag is: its type and choices; a yes/no for
    a switch; for a repeatable flag, a comma list whose items each pass its type. Call it
    after the last add_argument, before parse_args."""
    read = _read_keys(parser)
    for action in parser._actions:
        key = prefix + action.dest.upper()
        if (not action.option_strings or action.dest in skip or key in read
                or action.help == argparse.SUPPRESS
                or isinstance(action, (argparse._HelpAction, argparse._VersionAction))):
            continue
        if key not in os.environ:
            read.add(key)
            continue
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                               argparse.BooleanOptionalAction)):
            value = from_env(parser, key, kind=boolean)
            if isinstance(action, argparse._StoreFalseAction):
                value = not value
        elif isinstance(action, argparse._AppendAction):
            value = [_item(parser, key, text.strip(), action)
                     for text in os.environ[key].split(",") if text.strip()]
            read.add(key)
        elif type(action) is argparse._StoreAction:
            value = from_env(parser, key, kind=action.type or str,
                             choices=list(action.choices) if action.choices else None)
        else:  # store_const, count: nothing a variable could say that a flag word does not
            continue
        parser.set_defaults(**{action.dest: value})


def _item(parser: argparse.ArgumentParser, key: str, text: str, action: argparse.Action) -> Any:
    """One item of a repeatable flag's comma list, checked as one use of the flag."""
    kind = action.type or str
    try:
        value = kind(text)
    except ValueError:
        parser.error(f"{key}: {text!r} is not {_WHAT.get(kind, getattr(kind, '__name__', 'valid'))}")
    except argparse.ArgumentTypeError as problem:
        parser.error(f"{key}: {problem}")
    if action.choices and value not in action.choices:
        parser.error(f"{key}: {text!r} is not one of {', '.join(action.choices)}")
    return value
