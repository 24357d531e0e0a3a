"""Human-readable numbers for messages people act on."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_bytes(n_bytes: int) -> str:
    """1536 -> '1.5 KiB'; exact bytes below 1 KiB."""
    value = float(n_bytes)
    for unit in _UNITS:
        if abs(value) < 1024 or unit == _UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def tokens(n_tokens: int) -> str:
    """3900 -> '3,900 tokens'."""
    return f"{n_tokens:,} token" + ("" if n_tokens == 1 else "s")


def parse_bytes(text: str) -> int:
    """'512MiB', '1.5GiB', '1000000' -> bytes. Raises ValueError naming the input."""
    s = text.strip().replace(" ", "")
    factors = {
        "tib": 1024**4, "gib": 1024**3, "mib": 1024**2, "kib": 1024,
        "tb": 10**12, "gb": 10**9, "mb": 10**6, "kb": 10**3, "b": 1,
    }
    for suffix, factor in factors.items():
        if s.lower().endswith(suffix):
            number = s[: -len(suffix)]
            break
    else:
        number, factor = s, 1
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a byte size: {text!r} (use e.g. 512MiB, 2GiB or a number of bytes)") from None
    if value < 0:
        raise ValueError(f"byte size must be >= 0, got {text!r}")
    return int(value * factor)
