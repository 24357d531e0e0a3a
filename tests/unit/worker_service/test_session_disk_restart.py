"""A worker started again on its --session-dir (session_lifecycle.WorkerSessions): the
sessions found there come back with their leases (0 KV bytes, their disk bytes, tenant and
cap) and conversations, ready for the registration; a refused file whose header held comes
back empty, with its history."""

from __future__ import annotations

import threading

import numpy as np

from ortserve.v1 import types_pb2
from worker_service.engine.session_turns import SessionKVTurns
from worker_service.runtime.kv_pool import HostBudget, KVPool
from worker_service.runtime.session_disk import SessionDisk
from worker_service.runtime.session_file import ModelIdentity
from worker_service.runtime.session_kv import HeldKV, SessionTable
from worker_service.session_lease_table import SessionLeaseTable
from worker_service.session_lifecycle import WorkerSessions

IDENTITY = ModelIdentity(name="toy", fingerprint="0" * 64, num_layers=1, kv_heads=1,
                         head_dim=1, kv_dtype="float32")


class _Layout:
    block_tokens = 4

    def bytes_for(self, n: int) -> int:
        return -(-n // 4) * 4 * 8


class _Engine:
    def __init__(self, folder) -> None:
        pool = KVPool(_Layout(), capacity_bytes=10_000, host=HostBudget(0))
        self.sessions = SessionTable(pool, disk=SessionDisk(folder, 2**20, IDENTITY))
        self.session_turns = SessionKVTurns(self.sessions, "arena", threading.Condition())

    def session_info(self, session_id):
        return self.session_turns.info(session_id)


class _Leases:
    def __init__(self, folder) -> None:
        self.engine = _Engine(folder)
        self.sessions = SessionLeaseTable(engine=self.engine, link=None)
        self.worker_id = "w1"

    def busy(self, lease_id: str) -> bool:
        return False


def _worker_with_a_parked_session(folder, sid: str, n: int) -> WorkerSessions:
    leases = _Leases(folder)
    rpcs = WorkerSessions(leases, "w1:1")
    rpcs.restore_from_disk()  # empty folder: attaches what files carry
    cap = types_pb2.BudgetCap(requested_max_new_tokens=50, admitted_max_new_tokens=9)
    leases.sessions.leases[sid] = types_pb2.Lease(lease_id=f"L-{sid}", worker_id="w1",
                                                  request_id="turn-1", tenant="acme",
                                                  reserved_bytes=_Layout().bytes_for(n),
                                                  budget_cap=cap)
    request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=list(range(n - 2))))
    rpcs.turn_ended(sid, request, list(range(n - 2)), "", [7, 8])
    table = leases.engine.sessions
    table.open(sid)
    start = table.begin_turn(sid, tuple(range(n)), n + 4, "")
    keys = np.arange(n, dtype=np.float32).reshape(1, n, 1)
    table.end_turn(sid, start.allocation, HeldKV(tuple(range(n)), [keys], [keys + 1]))
    assert table.to_disk(sid)[1] > 0
    return rpcs


def test_a_restarted_worker_registers_its_sessions_from_their_files(tmp_path):
    _worker_with_a_parked_session(tmp_path, "s1", 12)
    again = _Leases(tmp_path)  # a new process on the same folder
    rpcs = WorkerSessions(again, "w1:2")
    assert rpcs.restore_from_disk() == 1
    lease = again.sessions.leases["s1"]
    assert (lease.lease_id, lease.tenant, lease.reserved_bytes) == ("L-s1", "acme", 0)
    assert lease.disk_bytes == again.engine.sessions.disk_used_bytes > 0
    assert lease.budget_cap.admitted_max_new_tokens == 9  # the cap survives the round trip
    (live,) = rpcs.live_sessions()
    assert (live.session_id, live.lease_id, live.kind, live.turns) == ("s1", "L-s1",
                                                                        "token_ids", 1)
    assert list(live.token_ids) == [*range(10), 7, 8]
    info = rpcs.info_pb("s1")
    assert info.state == types_pb2.SESSION_ON_DISK and info.held_tokens == 12
    assert info.disk_bytes == lease.disk_bytes


def test_a_corrupt_file_comes_back_empty_with_its_history(tmp_path):
    _worker_with_a_parked_session(tmp_path, "s1", 12)
    (path,) = tmp_path.glob("*.session")
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x08
    path.write_bytes(bytes(data))
    again = _Leases(tmp_path)
    rpcs = WorkerSessions(again, "w1:2")
    assert rpcs.restore_from_disk() == 1
    assert rpcs.info_pb("s1").state == types_pb2.SESSION_EMPTY
    assert again.sessions.leases["s1"].disk_bytes == 0 and again.engine.sessions.disk_used_bytes == 0
    (live,) = rpcs.live_sessions()
    assert list(live.token_ids) == [*range(10), 7, 8]  # what the next turn re-prefills
    assert again.engine.sessions.disk.rejected == {"corrupt": 1}
    assert (tmp_path / (path.name + ".rejected")).exists()
