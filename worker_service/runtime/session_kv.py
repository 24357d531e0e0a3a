"""Sessions on the worker: the tokens a session holds between turns, where their K/V lives,
and what the KV pool charges for them. Pure bookkeeping over numpy arrays (no ORT, no grpc).

Shaped like SGLang's session controller: a session is token history plus
KV; a turn reuses the longest common TOKEN prefix of what is held and its
newly rendered prompt (never text: a chat template need not reproduce the
generated tokens) and rewinds the rest.

A session is in one state:

- EMPTY: nothing held (before its first turn, or after its copy was dropped):
  the next turn prefills everything, which is always correct;
- BUSY: a turn runs; its K/V is in the turn's arena row, charged as the
  turn's allocation (history + new prompt + max_new_tokens);
- RESIDENT: between turns the row's written K/V is copied to host arrays and
  the row freed, so idle sessions never sit in the batched decode; the pool
  keeps charging exactly bytes_for(held tokens), which is what the
  scheduler's lease shrinks to (the next turn's room on the device). On CPU
  the arena is host memory too, so this moves bytes without adding any; on
  CUDA (`pool.parks_on_host`) the copy is host memory beside the device
  budget and counts against the pool's host budget as well (a copy that does
  not fit it is dropped: EMPTY).
- SWAPPED: reclaimed: the copy stays in host memory, counted against the host
  budget (--session-swap-bytes), and the pool charge is gone, so the
  scheduler can release the lease's bytes. A copy that does not fit the host
  budget goes to disk when a disk tier is configured and it fits there, else
  it is dropped (EMPTY): the next turn recomputes.
- ON_DISK: the copy is a file under --session-dir (session_disk.py), counted
  against --session-disk-bytes only: no pool charge, no host bytes. Written
  when idle past a bound, when the host budget has no room, or found there at
  start-up (a restarted worker). The next turn charges the pool first (its
  admission), then reads the file back; a file refused then (truncated,
  corrupt) is set aside and the turn re-prefills the history instead.

Every method runs under the engine's lock; the pool has its own.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import structlog

from ortserve.status.errors import ErrorReason, quoted
from worker_service.core.errors import EngineError
from worker_service.runtime.kv_pool import HostBudget, KVAllocation, KVPool
from worker_service.runtime.session_disk import Found, OnDisk, SessionDisk
from worker_service.runtime.session_file import SessionFileRejected, SessionRecord

log = structlog.get_logger("worker")


class SessionState(enum.Enum):
    EMPTY = "empty"
    BUSY = "busy"
    RESIDENT = "resident"
    SWAPPED = "swapped"
    ON_DISK = "on_disk"


class SessionNotFound(EngineError):
    """No session of that id on this worker (NOT_FOUND)."""

    reason = ErrorReason.SESSION_NOT_FOUND

    def __init__(self, session_id: str) -> None:
        super().__init__(f"session {quoted(session_id)} is not open on this worker (closed, "
                         "expired or never opened); open a new session", session_id=session_id)


class SessionBusy(EngineError):
    """A second turn while one runs (FAILED_PRECONDITION): turns of a session go one at a time."""

    reason = ErrorReason.SESSION_BUSY

    def __init__(self, session_id: str, doing: str = "a turn") -> None:
        super().__init__(f"session {quoted(session_id)} is running a turn; {doing} must wait "
                         "until it finishes (turns of a session run one at a time)",
                         session_id=session_id)


@dataclass
class HeldKV:
    """K/V of `tokens`, per layer [kv_heads, n, head_dim], in host memory."""

    tokens: tuple[int, ...]
    keys: list[np.ndarray]
    values: list[np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys) + sum(a.nbytes for a in self.values)


@dataclass(frozen=True)
class SessionInfo:
    """A session's state as reported (GetSession)."""

    session_id: str
    state: SessionState
    held_tokens: int
    charged_bytes: int  # what the KV pool charges for it now (0 when swapped or empty)
    swapped_bytes: int  # host bytes in the swap store
    turns: int
    disk_bytes: int = 0  # the session's file's bytes (ON_DISK)


@dataclass(frozen=True)
class TurnStart:
    """What a turn begins with: its charge, how much it reuses and the K/V to restore."""

    allocation: KVAllocation
    reused_tokens: int
    resume: HeldKV | None  # the reused prefix's K/V (None: nothing reused)
    # The session's file was refused as it was read back: the turn re-prefills instead.
    rejected: SessionFileRejected | None = None


@dataclass(frozen=True)
class DiskMeta:
    """What the edge stores with a session's file besides its K/V: the tenant, and opaque
    bytes (its lease and conversation) it needs to serve the session after a restart."""

    tenant: str = ""
    extras: dict[str, bytes] = field(default_factory=dict)


@dataclass
class _Session:
    session_id: str
    state: SessionState = SessionState.EMPTY
    held: HeldKV | None = None
    kv: KVAllocation | None = None  # the pool charge while RESIDENT
    disk: OnDisk | None = None  # its file while ON_DISK
    adapter: str = ""  # what its K/V was computed under (kept in its file)
    turns: int = 0
    last_used: float = field(default_factory=time.monotonic)


def common_prefix(held: Sequence[int], prompt: Sequence[int]) -> int:
    """Length of the longest common token prefix."""
    n = min(len(held), len(prompt))
    if n == 0:
        return 0
    a = np.asarray(held[:n], dtype=np.int64)
    b = np.asarray(prompt[:n], dtype=np.int64)
    diff = np.flatnonzero(a != b)
    return int(diff[0]) if diff.size else n


class SessionTable:
    """Every session on this worker and the swap store's bytes."""

    def __init__(self, pool: KVPool, swap_limit_bytes: int | None = None,
                 disk: SessionDisk | None = None) -> None:
        """`swap_limit_bytes`: a host budget of its own; None: the pool's (`pool.host`).
        `disk`: the disk tier (--session-dir); None: none, a copy without host room drops."""
        self.pool = pool
        self.host = pool.host if swap_limit_bytes is None else HostBudget(swap_limit_bytes)
        self.disk = disk
        # What the edge stores with a session's file (set by the edge; the table is pure).
        self.disk_meta: Callable[[str], DiskMeta] = lambda _sid: DiskMeta()
        self._sessions: dict[str, _Session] = {}

    @property
    def swap_limit_bytes(self) -> int:
        return self.host.limit_bytes

    @property
    def swap_used_bytes(self) -> int:
        """Host bytes the sessions' copies count against the host budget."""
        return self.host.used_bytes

    def _on_host_budget(self, s: _Session) -> bool:
        """Whether the session's copy counts against the host budget now."""
        return s.held is not None and (s.state is SessionState.SWAPPED or (
            s.state is SessionState.RESIDENT and self.pool.parks_on_host))

    def charged_bytes_by_session(self) -> dict[str, int]:
        """The pool bytes each idle session is charged now (a busy one's charge is its
        turn's sequence's)."""
        return {s.session_id: s.kv.nbytes for s in self._sessions.values()
                if s.kv is not None and not s.kv.freed}

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def open(self, session_id: str) -> SessionInfo:
        """Open an empty session; opening an open one is a no-op (a retried call)."""
        self._sessions.setdefault(session_id, _Session(session_id))
        return self.info(session_id)

    def _get(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(session_id)
        return session

    @property
    def disk_used_bytes(self) -> int:
        return self.disk.used_bytes if self.disk is not None else 0

    def tier_bytes(self) -> dict[str, tuple[int, int]]:
        """Each session's (host bytes, disk bytes) outside the pool's charge (the ledger's
        host and disk tiers; a session resident on CUDA counts its host copy too)."""
        return {sid: (s.held.nbytes if self._on_host_budget(s) else 0,
                      s.disk.file_bytes if s.disk is not None else 0)
                for sid, s in self._sessions.items()}

    def info(self, session_id: str) -> SessionInfo:
        s = self._get(session_id)
        held = len(s.held.tokens) if s.held is not None else (
            len(s.disk.tokens) if s.disk is not None else 0)
        return SessionInfo(
            session_id=s.session_id, state=s.state, held_tokens=held,
            charged_bytes=s.kv.nbytes if s.kv is not None else 0,
            swapped_bytes=s.held.nbytes if s.state is SessionState.SWAPPED and s.held else 0,
            turns=s.turns, disk_bytes=s.disk.file_bytes if s.disk is not None else 0)

    def _load(self, s: _Session) -> SessionFileRejected | None:
        """Bring an ON_DISK session's K/V back into host memory (the caller has charged the
        pool for it already); its file goes. A refused file leaves the session empty."""
        assert self.disk is not None and s.disk is not None
        on_disk, s.disk = s.disk, None
        try:
            record = self.disk.load(on_disk, s.session_id)
        except SessionFileRejected as error:
            self.disk.forget_rejected(on_disk)
            log.error("session file refused; the turn re-prefills its history",
                      session_id=s.session_id, file=str(error.path), why=error.why,
                      detail=error.detail)
            s.held = None
            return error
        self.disk.delete(on_disk)
        s.held = HeldKV(record.tokens, record.keys, record.values)
        return None

    def held_kv(self, session_id: str) -> HeldKV | None:
        """A copy of the K/V the session keeps between turns (None: it holds none), for
        checks that the bytes survive a swap and a turn (cuda_check)."""
        held = self._get(session_id).held
        if held is None:
            return None
        return HeldKV(held.tokens, [k.copy() for k in held.keys], [v.copy() for v in held.values])

    def begin_turn(self, session_id: str, prompt_ids: Sequence[int], max_tokens: int,
                   detail: str) -> TurnStart:
        """Charge the turn (prompt + max_new) and pick the reused prefix; raises, changing
        nothing, when the session is busy or the pool cannot take the charge."""
        s = self._get(session_id)
        if s.state is SessionState.BUSY:
            raise SessionBusy(session_id)
        if s.kv is not None:
            self.pool.resize(s.kv, max_tokens, detail=detail)  # raises: nothing changed
            allocation = s.kv
        else:
            allocation = self.pool.allocate(max_tokens, detail=detail)
        # From disk only after the pool took the turn's charge (its admission): the file's
        # K/V then lands in bytes the ledger already counts.
        rejected = self._load(s) if s.state is SessionState.ON_DISK else None
        held = s.held
        # At least the last prompt token is computed: its logits give the first new token.
        reused = min(common_prefix(held.tokens, prompt_ids), len(prompt_ids) - 1) if held else 0
        if self._on_host_budget(s):
            self.host.give(held.nbytes)  # swapped in: the turn's charge covers it now
        resume = None
        if held is not None and reused == len(held.tokens):
            resume = held  # the common case: the turn appends to everything held
        elif held is not None and reused > 0:
            # Rewound: copy the prefix so the rest's memory goes now, not at the import
            # (a view would keep all of it alive under a charge sized for the new turn).
            resume = HeldKV(tuple(prompt_ids[:reused]), [k[:, :reused].copy() for k in held.keys],
                            [v[:, :reused].copy() for v in held.values])
        s.state, s.held, s.kv = SessionState.BUSY, None, None
        s.last_used = time.monotonic()
        return TurnStart(allocation, reused, resume, rejected)

    def end_turn(self, session_id: str, allocation: KVAllocation, held: HeldKV | None) -> None:
        """The turn is over: keep `held` RESIDENT, charged for exactly its tokens; None (a
        failed turn, whose K/V may be partial) drops everything."""
        s = self._sessions.get(session_id)
        if s is None:  # closed while the turn ran: nothing may stay charged
            self.pool.free(allocation)
            return
        s.turns += 1
        s.last_used = time.monotonic()
        if held is None or not held.tokens:
            self.pool.free(allocation)
            s.state, s.held, s.kv = SessionState.EMPTY, None, None
            return
        if self.pool.parks_on_host and not self.host.take(held.nbytes):
            self.pool.free(allocation)  # no host room for the copy: the next turn recomputes
            s.state, s.held, s.kv = SessionState.EMPTY, None, None
            return
        # The copy exists before the charge shrinks: never held above charged.
        self.pool.resize(allocation, len(held.tokens))
        s.state, s.held, s.kv = SessionState.RESIDENT, held, allocation

    def swap_out(self, session_id: str) -> int:
        """Move a RESIDENT session's K/V out of the pool's charge; returns the bytes freed.

        Into the swap store when it fits its limit, else dropped (the next turn
        recomputes). A no-op (0) for EMPTY or SWAPPED sessions.
        """
        s = self._get(session_id)
        if s.state is SessionState.BUSY:
            raise SessionBusy(session_id, "swapping it out")
        if s.state is not SessionState.RESIDENT:
            return 0
        assert s.kv is not None and s.held is not None
        freed = s.kv.nbytes
        if self.pool.parks_on_host or self.host.take(s.held.nbytes):
            s.state = SessionState.SWAPPED  # (parked on the host: already counted there)
        elif self._write(s) is not None:
            pass  # no host room: on disk instead (ON_DISK)
        else:
            s.state, s.held = SessionState.EMPTY, None
        self.pool.free(s.kv)
        s.kv = None
        return freed

    def _write(self, s: _Session) -> OnDisk | None:
        """Write the session's held K/V to its file; None (nothing changed) without a disk
        tier or room in its budget. The caller frees the pool charge; the host copy goes."""
        if self.disk is None or s.held is None:
            return None
        meta = self.disk_meta(s.session_id)
        on_disk = self.disk.write(SessionRecord(
            session_id=s.session_id, tokens=s.held.tokens, keys=s.held.keys,
            values=s.held.values, adapter=s.adapter, tenant=meta.tenant, turns=s.turns,
            extras=meta.extras))
        if on_disk is None:
            return None
        if self._on_host_budget(s):
            self.host.give(s.held.nbytes)
        s.state, s.held, s.disk = SessionState.ON_DISK, None, on_disk
        return on_disk

    def to_disk(self, session_id: str) -> tuple[int, int]:
        """Move an idle session (RESIDENT or SWAPPED) to its file; returns (pool bytes
        freed, file bytes). (0, 0) when nothing moved: no disk tier, no room there, or the
        session holds nothing to write."""
        s = self._get(session_id)
        if s.state not in (SessionState.RESIDENT, SessionState.SWAPPED):
            return 0, 0
        on_disk = self._write(s)
        if on_disk is None:
            return 0, 0
        freed = 0
        if s.kv is not None:
            freed = s.kv.nbytes
            self.pool.free(s.kv)
            s.kv = None
        return freed, on_disk.file_bytes

    def idle_in_memory(self, idle_s: float, now: float | None = None) -> list[str]:
        """Sessions holding K/V in memory (RESIDENT, SWAPPED) unused for over `idle_s`,
        least recently used first: what the disk tier takes when idle past its bound."""
        now = time.monotonic() if now is None else now
        idle = [s for s in self._sessions.values() if s.held is not None
                and s.state in (SessionState.RESIDENT, SessionState.SWAPPED)
                and now - s.last_used > idle_s]
        return [s.session_id for s in sorted(idle, key=lambda s: s.last_used)]

    def adopt(self, found: Found) -> SessionInfo:
        """A session found in the disk tier at start-up: ON_DISK with its file, or, when
        its file was refused but its header held, EMPTY (its next turn re-prefills)."""
        record = found.record
        s = _Session(found.session_id, turns=record.turns if record else 0,
                     adapter=record.adapter if record else "")
        if found.on_disk is not None:
            s.state, s.disk = SessionState.ON_DISK, found.on_disk
        self._sessions[found.session_id] = s
        return self.info(found.session_id)

    def adapter_of(self, session_id: str) -> str:
        return self._get(session_id).adapter

    def set_adapter(self, session_id: str, adapter: str) -> None:
        self._get(session_id).adapter = adapter

    def close(self, session_id: str) -> int:
        """Forget the session and free what it holds; returns the pool bytes freed.

        Refused while a turn runs: the turn's row is the engine's to free.
        """
        s = self._get(session_id)
        if s.state is SessionState.BUSY:
            raise SessionBusy(session_id, "closing it")
        del self._sessions[session_id]
        if self._on_host_budget(s):
            self.host.give(s.held.nbytes)
        if s.disk is not None and self.disk is not None:
            self.disk.delete(s.disk)  # closed: its file and its disk bytes go
        freed = 0
        if s.kv is not None:
            freed = s.kv.nbytes
            self.pool.free(s.kv)
        return freed

    def drop_all(self) -> None:
        """The engine closes: every session's charge goes back. Files stay on disk: a
        worker started again on the same folder serves those sessions."""
        for session_id, s in list(self._sessions.items()):
            if self._on_host_budget(s):
                self.host.give(s.held.nbytes)
            if s.kv is not None:
                self.pool.free(s.kv)
            del self._sessions[session_id]
