"""Human-readable numbers for messages people act on."""

from __future__ import annotations

import math
import re

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n_bytes: int) -> str:
    """1536 -> '1.5 KiB'; exact bytes below 1 KiB."""
    value = float(n_bytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_bytes_at_least(n_bytes: int) -> str:
    """A size a remedy tells someone to set: rounded UP to what human_bytes shows, so
    following it works (9,584,640 B -> '9.2 MiB', where human_bytes says '9.1 MiB', and a
    --kv-capacity of 9.1MiB is 42,599 bytes short). parse_bytes of the text (its spaces
    dropped) is never below `n_bytes`."""
    if n_bytes < 1024:
        return f"{max(n_bytes, 0)} B"
    power = min(int(math.log(n_bytes, 1024)), len(_UNITS) - 1)
    tenths = math.ceil(n_bytes * 10 / 1024**power)
    while parse_bytes(f"{tenths / 10:.1f}{_UNITS[power]}") < n_bytes:  # float rounding
        tenths += 1
    return f"{tenths / 10:.1f} {_UNITS[power]}"


def tokens(n_tokens: int) -> str:
    """3900 -> '3,900 tokens'."""
    return f"{n_tokens:,} token" + ("" if n_tokens == 1 else "s")


_FACTORS = {
    "": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> int:
    """'512MiB', '1.5GiB', '1000000' -> bytes. Raises ValueError naming the input."""
    match = _SIZE.match(text)
    factor = _FACTORS.get(match.group(2).lower()) if match else None
    if match is None or factor is None:
        raise ValueError(f"not a byte size: {text!r} (use e.g. 512MiB, 2GiB or a number of bytes)")
    return int(float(match.group(1)) * factor)
