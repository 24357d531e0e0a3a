"""A size a remedy names is never below what it must hold, as the flag reads it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ortserve.status.units import human_bytes, human_bytes_at_least, parse_bytes


def test_a_remedy_size_is_rounded_up_where_the_nearest_tenth_is_short():
    assert human_bytes(9_584_640) == "9.1 MiB"  # a --kv-capacity of 9.1MiB: 42,599 B short
    assert human_bytes_at_least(9_584_640) == "9.2 MiB"
    assert human_bytes_at_least(8 * 2**20) == "8.0 MiB"  # exact stays exact
    assert human_bytes_at_least(1000) == "1000 B"


@given(st.integers(min_value=0, max_value=2**50))
def test_following_a_remedy_size_always_holds_the_bytes(n_bytes):
    text = human_bytes_at_least(n_bytes)
    assert parse_bytes(text.replace(" ", "")) >= n_bytes
    # and by less than a tenth of its unit: the advice is not wasteful
    value, unit = text.split()
    if unit != "B":
        assert parse_bytes(f"{float(value) - 0.1:.1f}{unit}") < n_bytes
