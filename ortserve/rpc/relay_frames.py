"""Serialized GenerateEvent frames, read as bytes: the relay's token path.

A GenerateEvent holds one field of its oneof, so a frame's first byte (that
field's tag: number << 3 | 2, length-delimited) says which event it is. A
chunk's TokenChunk holds packed token_ids (field 1) and text (field 2). Pure:
the wire format only, no protobuf runtime; the relay parses only what it must
read (the Finished), and passes chunks on as bytes.
"""

from __future__ import annotations

from ortserve.rpc.wire import read_varint, varint

ADMISSION_TAG, CHUNK_TAG, FINISHED_TAG = 1 << 3 | 2, 2 << 3 | 2, 3 << 3 | 2
_IDS_TAG, _TEXT_TAG = 1 << 3 | 2, 2 << 3 | 2
_VARINT_ENDS = bytes(range(128))  # a byte below 128 ends a varint


def chunk_fields(frame: bytes) -> tuple[bytes, bytes] | None:
    """(packed token ids, UTF-8 text) of a chunk frame; None when it holds anything else
    (an unknown field, unpacked ids, text twice)."""
    length, i = read_varint(frame, 1)
    end = i + length
    ids, text = [], []
    while i < end:
        tag = frame[i]
        if tag != _IDS_TAG and tag != _TEXT_TAG:
            return None
        size, start = read_varint(frame, i + 1)
        (ids if tag == _IDS_TAG else text).append(frame[start:start + size])
        i = start + size
    if len(text) > 1:
        return None
    return b"".join(ids), text[0] if text else b""


def chunk_tokens(frame: bytes) -> int:
    """Token ids in a chunk frame (varints counted in its bytes, not parsed)."""
    fields = chunk_fields(frame)
    if fields is None:
        return 0
    ids = fields[0]
    return len(ids) - len(ids.translate(None, _VARINT_ENDS))


def merge_chunks(frames: list[bytes]) -> bytes | None:
    """Chunk frames as one chunk frame: the ids and the text in order, as if the worker
    had sent them together. None when one holds more than ids and text (logprobs)."""
    ids, text = [], []
    for frame in frames:
        fields = chunk_fields(frame)
        if fields is None:
            return None
        ids.append(fields[0])
        text.append(fields[1])
    packed, utf8 = b"".join(ids), b"".join(text)
    chunk = ((bytes((_IDS_TAG,)) + varint(len(packed)) + packed if packed else b"")
             + (bytes((_TEXT_TAG,)) + varint(len(utf8)) + utf8 if utf8 else b""))
    return bytes((CHUNK_TAG,)) + varint(len(chunk)) + chunk
