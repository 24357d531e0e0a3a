"""A session's life on the worker: open (claim its lease) -> turns -> swap out -> close (release).

One lease per session, claimed once at open and reported live in every
heartbeat while the session is open. The order of every step keeps the
ledger honest (DESIGN.md, "The budget"): the worker frees KV first and only
then shrinks or releases the lease, so the scheduler never offers bytes this
worker still holds. Turns go through LeaseLifecycle.open (lease_lifecycle.py)
with the session's id.

The worker also keeps a copy of each session's conversation as of its last
finished turn (what the scheduler's registry keeps): after a scheduler restart
it registers its sessions with their leases, and the new scheduler rebuilds its
registry from them, so clients continue their sessions on the KV kept here.

With a disk tier (--session-dir), each session's file also holds its lease and
that conversation (session_file.py's extras), so a worker restarted on the same
folder re-registers the sessions found there exactly as after a scheduler
restart: their leases hold 0 KV bytes and their files' disk bytes, charged to
their tenants. A file refused at start-up (corrupt, truncated, foreign) is set
aside and said here; when its header held, the session comes back empty and its
next turn re-prefills the history the scheduler renders (the worker's copy of
the conversation is in the header: it survives a scheduler restart too). A file
whose header is unreadable names only its session (the file name): that session
is lost, said on stderr, never served with wrong K/V.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import grpc
import structlog

from ortserve.output import conversation
from ortserve.output.conversation import Message, ToolSpec
from ortserve.status.errors import quoted
from ortserve.v1 import scheduler_pb2, types_pb2
from worker_service.core.errors import InvalidWorkerField, NoLiveLease, SchedulerUnreachable
from worker_service.lease_lifecycle import LeaseLifecycle
from worker_service.runtime.session_kv import (
    DiskMeta,
    SessionBusy,
    SessionInfo,
    SessionNotFound,
    SessionState,
)

log = structlog.get_logger("worker")

_STATE = {
    SessionState.EMPTY: types_pb2.SESSION_EMPTY,
    SessionState.BUSY: types_pb2.SESSION_BUSY,
    SessionState.RESIDENT: types_pb2.SESSION_RESIDENT,
    SessionState.SWAPPED: types_pb2.SESSION_SWAPPED,
    SessionState.ON_DISK: types_pb2.SESSION_ON_DISK,
}
_LEASE, _CONVERSATION = "lease", "conversation"  # the extras a session file carries


@dataclass
class Conversation:
    """A session's conversation as of its last finished turn (the scheduler's copy's twin)."""

    kind: str = ""  # "chat" or "token_ids" after the first turn
    messages: list[Message] = field(default_factory=list)  # whole: tool calls and ids too
    tools: tuple[ToolSpec, ...] = ()
    token_ids: list[int] = field(default_factory=list)
    turns: int = 0
    history_tokens: int = 0

    def remember(self, request: types_pb2.GenerateRequest, prompt_ids: Sequence[int],
                 reply_text: str, reply_ids: Sequence[int]) -> None:
        """The turn's whole request (the scheduler sends the whole conversation and the
        session's tools) + its reply, with the calls it made (named as the scheduler does)."""
        self.kind = request.WhichOneof("prompt") or ""
        if self.kind == "chat":
            self.tools = tuple(conversation.tool_of(t) for t in request.chat.tools)
            self.messages = [*(conversation.message_of(m) for m in request.chat.messages),
                             conversation.reply(reply_text, bool(self.tools), self.turns + 1)]
        else:
            self.token_ids = [*prompt_ids, *reply_ids]
        self.history_tokens = len(prompt_ids) + len(reply_ids)
        self.turns += 1

    def to_pb(self, session_id: str, lease_id: str) -> scheduler_pb2.LiveSession:
        pb = scheduler_pb2.LiveSession(
            session_id=session_id, lease_id=lease_id, kind=self.kind, token_ids=self.token_ids,
            turns=self.turns, history_tokens=self.history_tokens)
        for message in self.messages:
            conversation.add_message(pb.messages, message)
        for tool in self.tools:
            conversation.add_tool(pb.tools, tool)
        return pb

    @classmethod
    def from_pb(cls, pb: scheduler_pb2.LiveSession) -> Conversation:
        return cls(kind=pb.kind, messages=[conversation.message_of(m) for m in pb.messages],
                   tools=tuple(conversation.tool_of(t) for t in pb.tools),
                   token_ids=list(pb.token_ids), turns=pb.turns,
                   history_tokens=pb.history_tokens)


class WorkerSessions:
    """The worker's session RPCs, over the engine's session table and the scheduler link."""

    def __init__(self, leases: LeaseLifecycle, address: str) -> None:
        self.leases = leases
        self.sessions = leases.sessions  # the open sessions' leases (session_lease_table.py)
        self.address = address
        self._opened_at: dict[str, float] = {}
        self._conversations: dict[str, Conversation] = {}

    def _lease(self, session_id: str) -> types_pb2.Lease:
        if not session_id:
            raise InvalidWorkerField("session_id", "session_id is empty: use the id OpenSession gave")
        lease = self.sessions.leases.get(session_id)
        if lease is None:
            raise SessionNotFound(session_id)
        return lease

    def _idle(self, session_id: str, doing: str) -> types_pb2.Lease:
        lease = self._lease(session_id)
        if self.leases.busy(lease.lease_id):
            raise SessionBusy(session_id, doing)  # a turn is opening, running or shrinking
        return lease

    def info_pb(self, session_id: str, info: SessionInfo | None = None) -> types_pb2.SessionInfo:
        lease = self._lease(session_id)
        info = info or self.leases.engine.session_info(session_id)
        pb = types_pb2.SessionInfo(
            session_id=session_id, worker_id=self.leases.worker_id, worker_address=self.address,
            state=_STATE[info.state], held_tokens=info.held_tokens, held_bytes=info.charged_bytes,
            swapped_bytes=info.swapped_bytes, turns=info.turns, lease_id=lease.lease_id,
            turn_in_flight=self.leases.busy(lease.lease_id), disk_bytes=info.disk_bytes,
            idle_s=time.monotonic() - self._opened_at.get(session_id, time.monotonic()))
        if lease.HasField("budget_cap"):
            pb.last_budget_cap.CopyFrom(lease.budget_cap)
        return pb

    async def open(self, session_id: str, lease_id: str) -> types_pb2.SessionInfo:
        """Claim the session's (0-byte) lease and open an empty session in the engine."""
        if not session_id or not lease_id:
            raise InvalidWorkerField("session_id" if not session_id else "lease_id",
                                 "OpenSession needs the session id and its lease id")
        if session_id in self.sessions.leases:
            return self.info_pb(session_id)  # a retried open
        # The engine first (it refuses a layout without sessions): a claimed lease must
        # never be left behind by a failed open.
        self.leases.engine.open_session(session_id)
        try:
            lease = await self.leases.link.claim(lease_id)
        except grpc.aio.AioRpcError as error:
            self.leases.engine.close_session(session_id)
            if error.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise NoLiveLease(lease_id, self.leases.worker_id, error.details() or "") from error
            raise SchedulerUnreachable(f"worker {self.leases.worker_id} could not claim session "
                                       f"lease {quoted(lease_id)}: {error.details()}") from error
        self.sessions.leases[session_id] = lease
        self._opened_at[session_id] = time.monotonic()
        log.info("session opened", session_id=session_id, lease_id=lease_id,
                 worker_id=self.leases.worker_id)
        return self.info_pb(session_id)

    def turn_ended(self, session_id: str, request: types_pb2.GenerateRequest | None = None,
                   prompt_ids: Sequence[int] = (), reply_text: str = "",
                   reply_ids: Sequence[int] = ()) -> None:
        """A turn finished (its Finished goes out next): remember its conversation."""
        self._opened_at[session_id] = time.monotonic()  # idle_s counts from here
        if request is not None:
            self._conversations.setdefault(session_id, Conversation()).remember(
                request, prompt_ids, reply_text, reply_ids)

    async def swap_out(self, session_id: str) -> types_pb2.SessionInfo:
        """Free the session's KV charge (copy kept in host memory or dropped), then shrink."""
        lease = self._idle(session_id, "swapping it out")
        freed = self.leases.engine.swap_out_session(session_id)
        host_bytes, disk_bytes = self._tiers(session_id)
        shrunk = await self.leases.link.shrink(lease.lease_id, 0, host_bytes, disk_bytes)
        if shrunk is not None:
            self.sessions.leases[session_id] = shrunk  # what a re-registration reports
        info = self.leases.engine.session_info(session_id)
        log.info("session swapped out", session_id=session_id, lease_id=lease.lease_id,
                 freed_bytes=freed, state=info.state.value, swapped_bytes=info.swapped_bytes)
        return self.info_pb(session_id, info)

    def live_sessions(self) -> list[scheduler_pb2.LiveSession]:
        """Every session held here, for a registration: the scheduler rebuilds its registry
        from them (their leases go in live_leases). A turn in flight is reported as of its
        last finished turn; its lease shrinks at its end, as always."""
        for gone in [sid for sid in self._conversations if sid not in self.sessions.leases]:
            del self._conversations[gone]  # dropped after its turn (LeaseStream.close)
        live = []
        for session_id, lease in self.sessions.leases.items():
            if session_id in self.sessions.orphaned:
                continue
            talk = self._conversations.get(session_id, Conversation())
            live.append(talk.to_pb(session_id, lease.lease_id))
        return live

    # --- the disk tier (--session-dir) ----------------------------------------

    def _tiers(self, session_id: str) -> tuple[int, int]:
        """The session's (host bytes, disk bytes) outside the KV capacity, for the ledger."""
        return self.leases.engine.session_turns.tier_bytes().get(session_id, (0, 0))

    def _disk_meta(self, session_id: str) -> DiskMeta:
        """What a session's file carries besides its K/V: its lease (cap and tenant in it)
        and its conversation, so a restarted worker can register it again. Runs under the
        engine's lock: reads only this object's dicts."""
        lease = self.sessions.leases.get(session_id, types_pb2.Lease())
        talk = self._conversations.get(session_id, Conversation())
        return DiskMeta(tenant=lease.tenant, extras={
            _LEASE: lease.SerializeToString(),
            _CONVERSATION: talk.to_pb(session_id, lease.lease_id).SerializeToString()})

    def restore_from_disk(self) -> int:
        """At start-up, before the first registration (server.py): adopt the sessions found
        in the disk tier (their leases and conversations from their files); returns how
        many. A refused file is said here by name (the table set it aside and counted it).
        From here on every file this worker writes carries its session's lease and
        conversation."""
        table = self.leases.engine.sessions
        if table is None or table.disk is None:
            return 0
        table.disk_meta = self._disk_meta  # what each session's file carries from now on
        restored = 0
        for found in table.disk.scan():
            rejected = found.rejected
            if rejected is not None:
                log.error("session file refused at start-up", file=str(rejected.path),
                          why=rejected.why, detail=rejected.detail, session_id=found.session_id,
                          set_aside=rejected.path.name + ".rejected",
                          next_step="re-prefilled from its history at its next turn"
                          if found.record is not None else
                          "its header is unreadable: the session is lost; open a new one")
            if found.record is None:
                continue
            lease = types_pb2.Lease.FromString(found.record.extras.get(_LEASE, b""))
            talk = Conversation.from_pb(scheduler_pb2.LiveSession.FromString(
                found.record.extras.get(_CONVERSATION, b"")))
            if not lease.lease_id:
                # No lease to register it under (not this edge's file): nothing can reach
                # it, so its bytes must not stay counted.
                if found.on_disk is not None:
                    table.disk.delete(found.on_disk)
                log.warning("session file without a lease deleted", session_id=found.session_id,
                            file=str(found.on_disk.path) if found.on_disk else "")
                continue
            info = self.leases.engine.session_turns.adopt(found)
            # No KV bytes on the device; the file's bytes apart (the ledger's disk tier).
            lease.reserved_bytes, lease.host_bytes, lease.disk_bytes = 0, 0, info.disk_bytes
            lease.worker_id = self.leases.worker_id
            self.sessions.leases[found.session_id] = lease
            self._conversations[found.session_id] = talk
            self._opened_at[found.session_id] = time.monotonic()
            restored += 1
            log.info("session restored from the disk tier", session_id=found.session_id,
                     lease_id=lease.lease_id, state=info.state.value, held_tokens=info.held_tokens,
                     disk_bytes=info.disk_bytes, turns=talk.turns)
        return restored

    async def park_idle(self, idle_s: float) -> int:
        """Move sessions idle in memory for over `idle_s` to the disk tier, then shrink each
        lease to 0 KV bytes with its file's disk bytes (freed first, as every shrink)."""
        moved = 0
        for session_id in self.leases.engine.session_turns.idle_in_memory(idle_s):
            lease = self.sessions.leases.get(session_id)
            if lease is None or self.leases.busy(lease.lease_id):
                continue
            try:
                freed, file_bytes = await asyncio.to_thread(
                    self.leases.engine.session_turns.to_disk, session_id)
            except (SessionBusy, SessionNotFound):
                continue  # a turn began or it closed meanwhile: nothing moved
            if not file_bytes:
                continue  # no room in the disk budget: it stays where it is
            host_bytes, disk_bytes = self._tiers(session_id)
            # Only if no turn was admitted since the last one this worker saw (its request
            # id): that turn's reservation is its own, and its end shrinks the lease.
            shrunk = await self.leases.link.shrink(lease.lease_id, 0, host_bytes, disk_bytes,
                                                   if_request_id=lease.request_id or "-")
            if shrunk is not None and shrunk.request_id == lease.request_id \
                    and session_id in self.sessions.leases:
                self.sessions.leases[session_id] = shrunk
            moved += 1
            log.info("idle session moved to the disk tier", session_id=session_id,
                     lease_id=lease.lease_id, freed_bytes=freed, disk_bytes=file_bytes)
        return moved

    async def park_idle_forever(self, idle_s: float) -> None:
        """The disk tier's sweep: a task of the server's while it runs."""
        while True:
            await asyncio.sleep(min(max(idle_s / 4, 0.05), 1.0))
            try:
                await self.park_idle(idle_s)
            except OSError as error:  # a full or failing disk: say it, keep serving
                log.error("could not write a session to the disk tier", error=str(error))

    async def drop(self, session_ids: list[str], refused_lease_ids: list[str]) -> None:
        """After a registration: the scheduler will not restore these sessions (a client
        closed one while this worker was unreachable, or the ledger refused its lease).
        Free them, then release the leases the ledger took back; a session mid-turn goes
        when its turn ends."""
        refused = set(refused_lease_ids)
        for session_id in session_ids:
            lease = self.sessions.leases.get(session_id)
            if lease is None:
                continue
            if self.leases.busy(lease.lease_id):
                self.sessions.orphaned.add(session_id)
                continue
            freed = self.leases.engine.close_session(session_id)
            del self.sessions.leases[session_id]
            self._opened_at.pop(session_id, None)
            self._conversations.pop(session_id, None)
            released = 0 if lease.lease_id in refused else await self.leases.link.release(
                lease.lease_id)
            log.warning("session dropped: the scheduler did not restore it", session_id=session_id,
                        lease_id=lease.lease_id, freed_bytes=freed, released_bytes=released)

    async def close(self, session_id: str) -> types_pb2.SessionInfo:
        """Free everything the session holds, then release its lease once."""
        lease = self._idle(session_id, "closing it")
        pb = self.info_pb(session_id)
        freed = self.leases.engine.close_session(session_id)
        del self.sessions.leases[session_id]
        self._opened_at.pop(session_id, None)
        self._conversations.pop(session_id, None)
        released = await self.leases.link.release(lease.lease_id)
        log.info("session closed", session_id=session_id, lease_id=lease.lease_id,
                 freed_bytes=freed, released_bytes=released)
        pb.state, pb.held_tokens, pb.held_bytes, pb.swapped_bytes = types_pb2.SESSION_EMPTY, 0, 0, 0
        return pb
