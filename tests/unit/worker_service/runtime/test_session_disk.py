"""The disk tier of parked sessions over the session table (runtime/session_disk.py,
session_kv.py): every move releases what it held and charges what it takes, exactly once;
a turn charges the pool before it reads the file; a refused file leaves the session empty."""

from __future__ import annotations

import numpy as np
import pytest

from worker_service.core.errors import CapacityExceeded
from worker_service.runtime.kv_pool import HostBudget, KVPool
from worker_service.runtime.session_disk import SessionDisk
from worker_service.runtime.session_file import ModelIdentity
from worker_service.runtime.session_kv import DiskMeta, HeldKV, SessionState, SessionTable

IDENTITY = ModelIdentity(name="toy", fingerprint="0" * 64, num_layers=1, kv_heads=1,
                         head_dim=1, kv_dtype="float32")


class _Layout:
    block_tokens = 4

    def bytes_for(self, n: int) -> int:
        return -(-n // 4) * 4 * 8


def _held(n: int, start: int = 0) -> HeldKV:
    keys = np.arange(start, start + n, dtype=np.float32).reshape(1, n, 1)
    return HeldKV(tuple(range(n)), [keys], [keys + 0.5])


def _table(tmp_path, host_bytes=0, disk_bytes=2**20, capacity=10_000):
    pool = KVPool(_Layout(), capacity_bytes=capacity, host=HostBudget(host_bytes))
    disk = SessionDisk(tmp_path, disk_bytes, IDENTITY)
    table = SessionTable(pool, disk=disk)
    table.disk_meta = lambda sid: DiskMeta(tenant="acme", extras={"lease": sid.encode()})
    return pool, disk, table


def _resident(table, sid, n):
    table.open(sid)
    start = table.begin_turn(sid, tuple(range(n)), n + 10, "")
    table.end_turn(sid, start.allocation, _held(n))


def test_idle_to_disk_frees_the_pool_and_charges_disk_then_a_turn_brings_it_back(tmp_path):
    pool, disk, table = _table(tmp_path)
    _resident(table, "s", 40)
    assert pool.held_bytes() == _Layout().bytes_for(40)
    freed, file_bytes = table.to_disk("s")
    info = table.info("s")
    assert freed == _Layout().bytes_for(40) and pool.held_bytes() == 0
    assert info.state is SessionState.ON_DISK and info.held_tokens == 40
    assert info.disk_bytes == file_bytes == disk.used_bytes > 40 * 8
    assert table.tier_bytes() == {"s": (0, file_bytes)}
    start = table.begin_turn("s", tuple(range(45)), 55, "")
    assert start.reused_tokens == 40 and start.rejected is None
    assert start.resume.keys[0].tobytes() == _held(40).keys[0].tobytes()  # bit-identical
    assert disk.used_bytes == 0 and not list(tmp_path.glob("*.session"))
    assert pool.held_bytes() == _Layout().bytes_for(55)
    table.end_turn("s", start.allocation, _held(45))
    table.close("s")
    assert pool.held_bytes() == 0 and disk.used_bytes == 0


def test_a_turn_that_the_pool_cannot_take_leaves_the_file_on_disk(tmp_path):
    pool, disk, table = _table(tmp_path, capacity=1_000)
    _resident(table, "s", 40)
    table.to_disk("s")
    used = disk.used_bytes
    with pytest.raises(CapacityExceeded):
        table.begin_turn("s", tuple(range(45)), 500, "")
    assert table.info("s").state is SessionState.ON_DISK and disk.used_bytes == used


def test_swap_out_without_host_room_goes_to_disk_not_dropped(tmp_path):
    pool, disk, table = _table(tmp_path, host_bytes=0)
    _resident(table, "s", 30)
    assert table.swap_out("s") == _Layout().bytes_for(30)
    assert table.info("s").state is SessionState.ON_DISK and pool.host.used_bytes == 0
    pool2, disk2, full = _table(tmp_path / "small", host_bytes=0, disk_bytes=10)
    _resident(full, "t", 30)
    full.swap_out("t")  # neither host nor disk room: dropped, the next turn recomputes
    assert full.info("t").state is SessionState.EMPTY and disk2.used_bytes == 0


def test_close_on_disk_deletes_the_file_and_gives_its_bytes_back(tmp_path):
    _, disk, table = _table(tmp_path)
    _resident(table, "s", 20)
    table.to_disk("s")
    table.close("s")
    assert disk.used_bytes == 0 and not list(tmp_path.glob("*.session"))


def test_a_restart_adopts_files_and_a_corrupt_one_is_set_aside_and_re_prefilled(tmp_path):
    pool, disk, table = _table(tmp_path)
    _resident(table, "good", 20)
    _resident(table, "bad", 24)
    table.to_disk("good"), table.to_disk("bad")
    bad_path = disk.path_of("bad")
    data = bytearray(bad_path.read_bytes())
    data[-3] ^= 0x40  # in the K/V payload
    bad_path.write_bytes(bytes(data))
    table.drop_all()  # the worker stops: the files stay
    assert len(list(tmp_path.glob("*.session"))) == 2

    pool, disk, table = _table(tmp_path)  # a new worker on the same folder
    found = {f.session_id: f for f in disk.scan()}
    assert found["good"].on_disk is not None and found["good"].record.tenant == "acme"
    assert found["good"].record.extras == {"lease": b"good"}
    assert found["bad"].on_disk is None and found["bad"].rejected.why == "corrupt"
    assert found["bad"].record.tokens == tuple(range(24))  # its header held: history known
    assert (tmp_path / (bad_path.name + ".rejected")).exists() and not bad_path.exists()
    assert disk.rejected == {"corrupt": 1} and disk.used_bytes == found["good"].on_disk.file_bytes
    for f in found.values():
        table.adopt(f)
    assert table.info("good").state is SessionState.ON_DISK
    assert table.info("bad").state is SessionState.EMPTY and pool.held_bytes() == 0
    start = table.begin_turn("good", tuple(range(22)), 30, "")
    assert start.reused_tokens == 20 and start.resume.values[0].tobytes() == _held(20).values[0].tobytes()
    again = table.begin_turn("bad", tuple(range(26)), 30, "")
    assert again.reused_tokens == 0 and again.resume is None  # re-prefilled, never wrong


def test_a_file_corrupted_after_start_up_is_refused_at_the_turn_and_re_prefilled(tmp_path):
    pool, disk, table = _table(tmp_path)
    _resident(table, "s", 20)
    table.to_disk("s")
    path = disk.path_of("s")
    path.write_bytes(path.read_bytes()[:-5])
    start = table.begin_turn("s", tuple(range(22)), 30, "")
    assert start.rejected is not None and start.rejected.why == "truncated"
    assert start.resume is None and start.reused_tokens == 0
    assert disk.used_bytes == 0 and (tmp_path / (path.name + ".rejected")).exists()
    assert pool.held_bytes() == _Layout().bytes_for(30)  # the turn's charge, nothing more
    table.end_turn("s", start.allocation, None)
    assert pool.held_bytes() == 0


def test_a_thousand_sessions_on_disk_leave_the_pool_untouched(tmp_path):
    pool, disk, table = _table(tmp_path, disk_bytes=2**30)
    for i in range(1_000):
        _resident(table, f"s{i}", 8)
        table.to_disk(f"s{i}")
    assert pool.held_bytes() == 0 and pool.host.used_bytes == 0
    assert disk.used_bytes == sum(b for _, b in table.tier_bytes().values()) > 0
    assert len(table.idle_in_memory(0.0)) == 0


def test_idle_in_memory_lists_least_recently_used_first(tmp_path):
    _, _, table = _table(tmp_path)
    _resident(table, "old", 4)
    _resident(table, "new", 4)
    assert table.idle_in_memory(0.0, now=1e12) == ["old", "new"]
    assert table.idle_in_memory(1e13) == []
