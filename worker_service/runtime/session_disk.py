"""The disk tier of parked sessions: one file per session under --session-dir, counted
against --session-disk-bytes. Pure bookkeeping over session_file.py (no ORT, no grpc).

Disk bytes are neither device nor host bytes: a session on disk holds no KV charge and
no host copy, so any number of them leave the device's capacity untouched; they count
only against this budget (and the ledger shows them apart, per lease and tenant).
Refused files (truncated, corrupt, foreign, another format) are moved aside as
`<name>.rejected`, counted by reason, and said on stderr by the caller.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from worker_service.runtime import session_file
from worker_service.runtime.kv_pool import HostBudget
from worker_service.runtime.session_file import (
    ModelIdentity,
    SessionFileRejected,
    SessionRecord,
)


@dataclass(frozen=True)
class OnDisk:
    """A session's file: where, its size (what the disk budget counts) and its tokens."""

    path: Path
    file_bytes: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Found:
    """A file found at start-up: its session without K/V (the file keeps them), or, when
    the file was refused, why and (when its header held) the session's record anyway."""

    session_id: str
    record: SessionRecord | None  # header fields, no arrays; None: the header was refused
    on_disk: OnDisk | None  # None: refused (the file is set aside)
    rejected: SessionFileRejected | None = None


class SessionDisk:
    """Session files in one folder under a byte budget. Thread-safe (its budget's lock;
    file operations on one session are serialized by the caller, the engine's lock)."""

    def __init__(self, folder: Path, limit_bytes: int, identity: ModelIdentity) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.budget = HostBudget(limit_bytes)  # the same take/give counting, for disk bytes
        self.identity = identity
        self.rejected: Counter[str] = Counter()  # refused files by reason (a metric)
        self._lock = threading.Lock()

    @property
    def limit_bytes(self) -> int:
        return self.budget.limit_bytes

    @property
    def used_bytes(self) -> int:
        return self.budget.used_bytes

    def path_of(self, session_id: str) -> Path:
        return self.folder / session_file.file_name(session_id)

    def write(self, record: SessionRecord) -> OnDisk | None:
        """Write the session's file when it fits the budget (None: it does not, nothing
        written). The budget counts the whole file; a rewrite replaces the old file's."""
        path = self.path_of(record.session_id)
        # The file's size before writing it: header + payload; the header is small, so take
        # the payload plus a generous header allowance, then settle to the real size.
        estimate = session_file.payload_bytes_of(record) + 64 * 1024 + 8 * len(record.tokens)
        if not self.budget.take(estimate):
            return None
        try:
            size = session_file.write(path, record, self.identity)
        except BaseException:
            self.budget.give(estimate)
            raise
        self.budget.give(estimate)
        if not self.budget.take(size):  # cannot happen (size <= estimate); never over
            path.unlink(missing_ok=True)
            return None
        return OnDisk(path, size, tuple(record.tokens))

    def load(self, on_disk: OnDisk, session_id: str) -> SessionRecord:
        """The session's K/V back from its file (verified); raises SessionFileRejected
        after setting the file aside. The file stays until `delete`."""
        try:
            record = session_file.read(on_disk.path, self.identity)
        except SessionFileRejected as error:
            self._set_aside(error)
            raise
        if record.session_id != session_id or record.tokens != on_disk.tokens:
            error = SessionFileRejected(on_disk.path, "corrupt", "holds session "
                                        f"{record.session_id!r} of {len(record.tokens):,} tokens, "
                                        f"not {session_id!r} of {len(on_disk.tokens):,}")
            self._set_aside(error)
            raise error
        return record

    def delete(self, on_disk: OnDisk) -> None:
        """The session left the disk (loaded for a turn, or closed): its bytes go back."""
        on_disk.path.unlink(missing_ok=True)
        self.budget.give(on_disk.file_bytes)

    def forget_rejected(self, on_disk: OnDisk) -> None:
        """The file was set aside by `load`: its bytes leave the budget (the .rejected file
        stays for a person, outside the budget)."""
        self.budget.give(on_disk.file_bytes)

    def _set_aside(self, error: SessionFileRejected) -> None:
        with self._lock:
            self.rejected[error.why] += 1
        if error.path.exists():
            session_file.set_aside(error.path)

    def scan(self) -> list[Found]:
        """Every session file in the folder, verified whole (a start-up after a restart).
        Files that fit the budget are counted in it; a refused one is set aside."""
        for stray in self.folder.glob("*" + session_file.SUFFIX + ".tmp"):
            stray.unlink(missing_ok=True)  # a write a crash interrupted: the old file stands
        found = []
        for path in sorted(self.folder.glob("*" + session_file.SUFFIX)):
            session_id = session_file.session_id_of(path)
            try:
                record = session_file.read(path, self.identity, with_kv=False)
            except SessionFileRejected as error:
                self._set_aside(error)
                header = error.header
                record = None if header is None else session_file.record_of(header, [], [])
                found.append(Found(session_id, record, None, error))
                continue
            size = path.stat().st_size
            if record.session_id != session_id or not self.budget.take(size):
                why = ("corrupt" if record.session_id != session_id else "over_budget")
                error = SessionFileRejected(path, why, f"holds session {record.session_id!r}"
                                            if why == "corrupt" else f"{size:,} bytes beyond "
                                            f"--session-disk-bytes {self.limit_bytes:,}", None)
                self._set_aside(error)
                found.append(Found(session_id, record, None, error))
                continue
            found.append(Found(session_id, record, OnDisk(path, size, record.tokens)))
        return found
