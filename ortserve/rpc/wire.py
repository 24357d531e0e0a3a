"""Protobuf wire format, read by hand where parsing a whole message would cost too much or
fail: the error path's scan of a raw request and the scheduler's frame relay. Pure."""

from __future__ import annotations


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at data[pos:]: (its value, the index after it)."""
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def varint(value: int) -> bytes:
    """`value` (>= 0) as a varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
