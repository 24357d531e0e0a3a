"""One typed parameter read from a request body, refused naming it when it is not that type (pure).

Booleans are not integers here (JSON's `true` is no token id or count).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.request.param_error import ParamError


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def int_param(params: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if not is_int(value) or not low <= value <= high:
        raise ParamError(key, f"{value!r} is not an integer from {low:,} to {high:,}")
    return value


def number_param(params: Mapping[str, Any], key: str, default: float | None) -> float | None:
    value = params.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ParamError(key, f"{value!r} is not a number")
    return float(value)


def bool_param(params: Mapping[str, Any], key: str, default: bool, where: str = "") -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise ParamError(where or key, f"{value!r} is not true or false")
    return value
