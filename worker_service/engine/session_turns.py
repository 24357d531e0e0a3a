"""A session's turns on the engine: where a turn starts (the session's own K/V reused, the
rest charged) and where it ends (its K/V parked for the next turn, or dropped), and the
adapter each session's K/V was computed under.

The table of what each session holds is session_kv.py (bookkeeping only); this is the
part that touches a sequence and the runner. Every method takes the engine's lock
itself, except `begin`, which runs inside the engine's submit (which holds it).
"""

from __future__ import annotations

import threading

from worker_service.core.errors import InvalidWorkerField
from worker_service.core.sequence import Sequence
from worker_service.runtime.runner import Runner
from worker_service.runtime.session_kv import SessionInfo, SessionTable


class SessionKVTurns:
    """The engine's open sessions: their K/V (a SessionTable; None where the runtime keeps
    no rows to park) and their adapters."""

    def __init__(self, table: SessionTable | None, kv_layout: str,
                 lock: threading.Condition) -> None:
        self.table = table
        self._kv_layout = kv_layout
        self._lock = lock
        # A session's K/V was computed under one adapter: its turns keep it.
        self._adapters: dict[str, str] = {}

    def _table(self) -> SessionTable:
        if self.table is None:
            raise InvalidWorkerField("session", f"sessions keep K/V as rows of a row store; this "
                                 f"worker runs kv_layout {self._kv_layout!r}: use kv_layout "
                                 "auto to serve sessions")
        return self.table

    def open(self, session_id: str) -> SessionInfo:
        """Open an empty session (idempotent); its first turn prefills everything."""
        with self._lock:
            return self._table().open(session_id)

    def info(self, session_id: str) -> SessionInfo:
        with self._lock:
            return self._table().info(session_id)

    def held_kv(self, session_id: str):
        """A copy of the K/V an idle session keeps (None: none), for checks (cuda_check)."""
        with self._lock:
            return self._table().held_kv(session_id)

    def swap_out(self, session_id: str) -> int:
        """Move an idle session's K/V out of the KV capacity; returns the pool bytes freed."""
        with self._lock:
            return self._table().swap_out(session_id)

    def to_disk(self, session_id: str) -> tuple[int, int]:
        """Move an idle session's K/V to its file; (pool bytes freed, file bytes)."""
        with self._lock:
            return self._table().to_disk(session_id)

    def idle_in_memory(self, idle_s: float) -> list[str]:
        """Idle sessions holding K/V in memory for over `idle_s` (the disk tier's picks)."""
        with self._lock:
            return self.table.idle_in_memory(idle_s) if self.table is not None else []

    def adopt(self, found) -> SessionInfo:
        """A session found in the disk tier at start-up (session_disk.Found)."""
        with self._lock:
            info = self._table().adopt(found)
            self._adapters[found.session_id] = self._table().adapter_of(found.session_id)
            return info

    def tier_bytes(self) -> dict[str, tuple[int, int]]:
        """Each session's (host bytes, disk bytes) outside the KV capacity."""
        with self._lock:
            return self.table.tier_bytes() if self.table is not None else {}

    def close(self, session_id: str) -> int:
        """Forget an idle session; returns the pool bytes freed (SessionBusy during a turn)."""
        with self._lock:
            freed = self._table().close(session_id)
            self._adapters.pop(session_id, None)
            return freed

    def under(self, adapter: str) -> list[str]:
        """The sessions whose K/V was computed under `adapter` (the caller holds the lock)."""
        return sorted(sid for sid, held in self._adapters.items() if held == adapter)

    def charged_bytes(self) -> dict[str, int]:
        """Pool bytes charged to each idle session (the caller holds the lock)."""
        return self.table.charged_bytes_by_session() if self.table is not None else {}

    def begin(self, seq: Sequence, session_id: str, detail: str) -> int:
        """Start `seq` as a turn of `session_id`: charge it (prompt + max_new), reuse the
        longest token prefix the session holds and rewind the rest; returns the tokens
        reused. Raises, changing nothing, on an adapter switch, a busy session or a pool
        that cannot take the charge. The caller holds the lock."""
        req = seq.req
        held = self._adapters.get(session_id, req.adapter)
        if held != req.adapter:
            raise InvalidWorkerField("adapter", f"session {session_id!r} runs under adapter "
                                 f"{held or '(base)'!r}; a turn cannot switch to "
                                 f"{req.adapter or '(base)'!r}: open another session for it")
        start = self._table().begin_turn(session_id, req.prompt_ids, req.max_tokens, detail)
        seq.continue_session(session_id, start.allocation, start.reused_tokens, start.resume)
        self._adapters[session_id] = req.adapter
        self._table().set_adapter(session_id, req.adapter)
        return start.reused_tokens

    def end(self, seq: Sequence, failed: bool, runner: Runner) -> None:
        """The turn is over (on the engine thread): a failed turn's K/V may be partial and is
        dropped; a finished or cancelled one holds exactly its computed tokens and is kept,
        charged for them, for the next turn."""
        held = None
        if not failed:
            held = runner.park(seq)
            if held is None:  # it never got a row: what it holds is the reused prefix
                held = seq.take_unused_prefix()
        if held is None:
            runner.forget(seq)
        with self._lock:
            self._table().end_turn(seq.session_id, seq.kv, held)

    def drop_all(self) -> None:
        """The engine closes: every session's K/V goes."""
        if self.table is not None:
            with self._lock:
                self.table.drop_all()
