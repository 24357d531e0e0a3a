"""One parked session as a file: its K/V rows, token history and what the worker needs to
serve it again (cap, adapter, tenant, the edge's lease and conversation). Pure: numpy,
json, hashlib; no ORT, no grpc, no pickle.

Layout (FORMAT_VERSION 1), little-endian:

    MAGIC (8 bytes, b"ORTSKV\\x00\\x01")
    header_len: uint32
    header: header_len bytes of UTF-8 JSON (format, model identity, session id, tokens,
            adapter, tenant, the K/V geometry and dtype, payload_bytes, payload_sha256,
            extras: name -> base64 of bytes the edge stores opaquely)
    header_sha256: 32 bytes, SHA-256 of the header's bytes
    payload: per layer its keys then its values, each [kv_heads, tokens, head_dim] in
             C order, raw (numpy tofile / frombuffer), payload_bytes in all

Two checksums (SHA-256, hashlib): a header whose own checksum holds is trusted even
when the payload's fails, so a flipped byte in the K/V (nearly the whole file) still
leaves the session's token history and conversation: the worker restores the session
empty and its next turn re-prefills the history, never serving wrong K/V.

Writes are atomic: a temporary file in the same folder, fsync, rename, fsync of the
folder; a crash leaves either the old file or the new one, plus at most a stray
`.tmp` that the next scan deletes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAGIC = b"ORTSKV\x00\x01"
FORMAT_VERSION = 1
SUFFIX = ".session"
REJECTED_SUFFIX = ".rejected"
_LEN = struct.Struct("<I")
_SHA = 32
_MAX_HEADER_BYTES = 64 * 2**20  # a header is token ids and a conversation: far below this


@dataclass(frozen=True)
class ModelIdentity:
    """What a session's K/V is only valid for: the same model and the same K/V geometry.

    `fingerprint` is a hash of the model folder's config and graph sizes
    (`fingerprint_of`): another folder with the same geometry is still refused.
    """

    name: str
    fingerprint: str
    num_layers: int
    kv_heads: int
    head_dim: int
    kv_dtype: str  # numpy's name, e.g. "float32"

    @classmethod
    def of(cls, spec) -> ModelIdentity:
        """The identity of a loaded model (runtime/model.py's ModelSpec)."""
        return cls(name=spec.name, fingerprint=fingerprint_of(spec.model_dir, spec.model_file),
                   num_layers=spec.num_layers, kv_heads=spec.kv_heads, head_dim=spec.head_dim,
                   kv_dtype=str(np.dtype(spec.kv_dtype)))

    def as_dict(self) -> dict:
        return {"name": self.name, "fingerprint": self.fingerprint,
                "num_layers": self.num_layers, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "kv_dtype": self.kv_dtype}


def fingerprint_of(model_dir: Path, model_file: Path) -> str:
    """SHA-256 of genai_config.json's bytes and the graph's (and its data's) file sizes:
    cheap at start-up (no hashing of gigabytes), and a rebuilt or other model differs."""
    h = hashlib.sha256()
    config = model_dir / "genai_config.json"
    h.update(config.read_bytes() if config.exists() else b"")
    for path in (model_file, model_file.with_name(model_file.name + ".data")):
        h.update(f"{path.name}:{path.stat().st_size if path.exists() else -1};".encode())
    return h.hexdigest()


@dataclass
class SessionRecord:
    """What one file holds. keys/values: per layer [kv_heads, len(tokens), head_dim]."""

    session_id: str
    tokens: tuple[int, ...]
    keys: list[np.ndarray]
    values: list[np.ndarray]
    adapter: str = ""
    tenant: str = ""
    turns: int = 0
    extras: dict[str, bytes] = field(default_factory=dict)  # the edge's, stored opaquely


class SessionFileRejected(Exception):
    """A session file that may not be used; `why` is one of truncated, corrupt, foreign,
    version, unreadable. `header` is the trusted header when only the payload failed."""

    def __init__(self, path: Path, why: str, detail: str, header: dict | None = None) -> None:
        super().__init__(f"session file {path.name} refused ({why}): {detail}")
        self.path = path
        self.why = why
        self.detail = detail
        self.header = header


def file_name(session_id: str) -> str:
    """The session's file name: its id in URL-safe base64, so any id is a safe name and a
    file whose header is unreadable still names its session."""
    return base64.urlsafe_b64encode(session_id.encode()).decode().rstrip("=") + SUFFIX


def session_id_of(path: Path) -> str:
    """The session id a file's name encodes ("" when the name is not one of ours)."""
    stem = path.name[:-len(SUFFIX)] if path.name.endswith(SUFFIX) else ""
    try:
        return base64.urlsafe_b64decode(stem + "=" * (-len(stem) % 4)).decode() if stem else ""
    except (ValueError, UnicodeDecodeError):
        return ""


def payload_bytes_of(record: SessionRecord) -> int:
    return sum(a.nbytes for a in record.keys) + sum(a.nbytes for a in record.values)


def write(path: Path, record: SessionRecord, identity: ModelIdentity) -> int:
    """Write `record` at `path` atomically; returns the file's size in bytes."""
    n = len(record.tokens)
    arrays = [a for pair in zip(record.keys, record.values, strict=True) for a in pair]
    for a in arrays:
        if a.shape != (identity.kv_heads, n, identity.head_dim) or str(a.dtype) != identity.kv_dtype:
            raise ValueError(f"session {record.session_id!r}: a K/V array of shape {a.shape} "
                             f"{a.dtype} does not match {n} tokens of {identity.as_dict()}")
    digest = hashlib.sha256()
    for a in arrays:
        digest.update(np.ascontiguousarray(a).data)
    header = {
        "format": FORMAT_VERSION, "model": identity.as_dict(), "session_id": record.session_id,
        "tokens": list(record.tokens), "adapter": record.adapter, "tenant": record.tenant,
        "turns": record.turns, "payload_bytes": payload_bytes_of(record),
        "payload_sha256": digest.hexdigest(),
        "extras": {k: base64.b64encode(v).decode() for k, v in record.extras.items()},
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC + _LEN.pack(len(head)) + head + hashlib.sha256(head).digest())
        for a in arrays:
            np.ascontiguousarray(a).tofile(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)
    return path.stat().st_size


def read_header(path: Path, identity: ModelIdentity) -> tuple[dict, int]:
    """The file's checked header and the payload's offset; raises SessionFileRejected."""
    try:
        with open(path, "rb") as f:
            lead = f.read(len(MAGIC) + _LEN.size)
            if len(lead) < len(MAGIC) + _LEN.size:
                raise SessionFileRejected(path, "truncated", f"{len(lead)} bytes, shorter "
                                          "than the file's fixed start")
            if lead[:len(MAGIC)] != MAGIC:
                raise SessionFileRejected(path, "version" if lead[:6] == MAGIC[:6] else "corrupt",
                                          f"starts with {lead[:len(MAGIC)]!r}, not {MAGIC!r}")
            (head_len,) = _LEN.unpack(lead[len(MAGIC):])
            if head_len > _MAX_HEADER_BYTES:
                raise SessionFileRejected(path, "corrupt", f"header length {head_len:,} bytes")
            head = f.read(head_len)
            sha = f.read(_SHA)
    except OSError as error:
        raise SessionFileRejected(path, "unreadable", str(error)) from error
    if len(head) < head_len or len(sha) < _SHA:
        raise SessionFileRejected(path, "truncated", "the file ends inside its header")
    if hashlib.sha256(head).digest() != sha:
        raise SessionFileRejected(path, "corrupt", "the header's SHA-256 does not match")
    header = json.loads(head)
    if header.get("format") != FORMAT_VERSION:
        raise SessionFileRejected(path, "version", f"format {header.get('format')!r}; this "
                                  f"worker reads format {FORMAT_VERSION}")
    if header.get("model") != identity.as_dict():
        raise SessionFileRejected(path, "foreign", f"written for model {header.get('model')}, "
                                  f"this worker serves {identity.as_dict()}")
    return header, len(MAGIC) + _LEN.size + head_len + _SHA


def record_of(header: dict, keys: list[np.ndarray], values: list[np.ndarray]) -> SessionRecord:
    return SessionRecord(
        session_id=header["session_id"], tokens=tuple(header["tokens"]), keys=keys,
        values=values, adapter=header.get("adapter", ""), tenant=header.get("tenant", ""),
        turns=header.get("turns", 0),
        extras={k: base64.b64decode(v) for k, v in header.get("extras", {}).items()})


def read(path: Path, identity: ModelIdentity, with_kv: bool = True) -> SessionRecord:
    """The file's session, every checksum verified; raises SessionFileRejected by name.
    `with_kv=False` still verifies the payload but returns no arrays (a start-up scan)."""
    header, offset = read_header(path, identity)
    n = len(header["tokens"])
    dtype = np.dtype(identity.kv_dtype)
    shape = (identity.kv_heads, n, identity.head_dim)
    each = int(np.prod(shape)) * dtype.itemsize
    expected = 2 * identity.num_layers * each
    if header.get("payload_bytes") != expected:
        raise SessionFileRejected(path, "corrupt", f"payload_bytes {header.get('payload_bytes')} "
                                  f"for {n:,} tokens, expected {expected:,}", header)
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            payload = f.read(expected + 1)
    except OSError as error:
        raise SessionFileRejected(path, "unreadable", str(error), header) from error
    if len(payload) != expected:
        why = "truncated" if len(payload) < expected else "corrupt"
        raise SessionFileRejected(path, why, f"payload is {len(payload):,} bytes"
                                  f"{'+' if len(payload) > expected else ''}, expected "
                                  f"{expected:,}", header)
    if hashlib.sha256(payload).hexdigest() != header["payload_sha256"]:
        raise SessionFileRejected(path, "corrupt", "the K/V payload's SHA-256 does not match",
                                  header)
    if not with_kv:
        return record_of(header, [], [])
    flat = np.frombuffer(payload, dtype=dtype)
    per = each // dtype.itemsize
    arrays = [flat[i * per:(i + 1) * per].reshape(shape) for i in range(2 * identity.num_layers)]
    return record_of(header, arrays[0::2], arrays[1::2])


def set_aside(path: Path) -> Path:
    """Move a refused file out of the way (`<name>.rejected`), kept for a person to look at."""
    target = path.with_name(path.name + REJECTED_SUFFIX)
    os.replace(path, target)
    return target
