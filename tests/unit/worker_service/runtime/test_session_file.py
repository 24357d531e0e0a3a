"""The session file format (runtime/session_file.py): a round trip is bit-identical, and a
truncated, corrupt (one flipped byte) or foreign (another model's) file is refused by name."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from worker_service.runtime import session_file
from worker_service.runtime.session_file import ModelIdentity, SessionFileRejected, SessionRecord

IDENTITY = ModelIdentity(name="tiny", fingerprint="ab" * 32, num_layers=2, kv_heads=2,
                         head_dim=4, kv_dtype="float32")


def _record(n: int = 5, session_id: str = "sess/1 é") -> SessionRecord:
    rng = np.random.default_rng(7)
    shape = (IDENTITY.kv_heads, n, IDENTITY.head_dim)
    return SessionRecord(
        session_id=session_id, tokens=tuple(range(100, 100 + n)),
        keys=[rng.standard_normal(shape, dtype=np.float32) for _ in range(2)],
        values=[rng.standard_normal(shape, dtype=np.float32) for _ in range(2)],
        adapter="a1", tenant="acme", turns=3, extras={"lease": b"\x00\x01lease", "live": b"talk"})


def _write(tmp_path, record=None):
    record = record or _record()
    path = tmp_path / session_file.file_name(record.session_id)
    size = session_file.write(path, record, IDENTITY)
    assert size == path.stat().st_size
    return path, record


def test_round_trip_is_bit_identical(tmp_path):
    path, record = _write(tmp_path)
    back = session_file.read(path, IDENTITY)
    assert back.session_id == record.session_id and back.tokens == record.tokens
    assert (back.adapter, back.tenant, back.turns) == ("a1", "acme", 3)
    assert back.extras == record.extras
    for a, b in zip([*record.keys, *record.values], [*back.keys, *back.values], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()  # bit-identical, not merely close
    assert session_file.session_id_of(path) == record.session_id
    assert not list(tmp_path.glob("*.tmp"))  # the temporary file was renamed


def test_truncated_file_is_refused_by_name(tmp_path):
    path, _ = _write(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:-3])
    with pytest.raises(SessionFileRejected) as refused:
        session_file.read(path, IDENTITY)
    assert refused.value.why == "truncated" and path.name in str(refused.value)
    assert refused.value.header is not None  # the header held: the history is still known
    path.write_bytes(data[:20])  # inside the header
    with pytest.raises(SessionFileRejected) as refused:
        session_file.read(path, IDENTITY)
    assert refused.value.why == "truncated" and refused.value.header is None


def test_a_flipped_payload_byte_is_refused_as_corrupt_but_the_header_holds(tmp_path):
    path, record = _write(tmp_path)
    data = bytearray(path.read_bytes())
    data[-7] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(SessionFileRejected) as refused:
        session_file.read(path, IDENTITY)
    assert refused.value.why == "corrupt" and "SHA-256" in refused.value.detail
    assert refused.value.header["tokens"] == list(record.tokens)


def test_a_flipped_header_byte_is_refused_as_corrupt(tmp_path):
    path, _ = _write(tmp_path)
    data = bytearray(path.read_bytes())
    data[30] ^= 0x20
    path.write_bytes(bytes(data))
    with pytest.raises(SessionFileRejected) as refused:
        session_file.read(path, IDENTITY)
    assert refused.value.why == "corrupt" and refused.value.header is None


@pytest.mark.parametrize("other", [replace(IDENTITY, fingerprint="cd" * 32),
                                   replace(IDENTITY, name="smollm2"),
                                   replace(IDENTITY, kv_dtype="float16")])
def test_another_models_file_is_refused_as_foreign(tmp_path, other):
    path, _ = _write(tmp_path)
    with pytest.raises(SessionFileRejected) as refused:
        session_file.read(path, other)
    assert refused.value.why == "foreign" and path.name in str(refused.value)


def test_an_unknown_format_is_refused_by_version(tmp_path):
    path, _ = _write(tmp_path)
    data = bytearray(path.read_bytes())
    data[7] = 9  # the magic's version byte
    path.write_bytes(bytes(data))
    with pytest.raises(SessionFileRejected) as refused:
        session_file.read(path, IDENTITY)
    assert refused.value.why == "version"


def test_arrays_that_do_not_match_the_model_are_not_written(tmp_path):
    record = _record()
    record.keys[0] = record.keys[0].astype(np.float16)
    with pytest.raises(ValueError, match="does not match"):
        session_file.write(tmp_path / "x.session", record, IDENTITY)
    assert not list(tmp_path.iterdir())


def test_set_aside_keeps_the_file_under_a_rejected_name(tmp_path):
    path, _ = _write(tmp_path)
    moved = session_file.set_aside(path)
    assert not path.exists() and moved.name == path.name + ".rejected" and moved.exists()
