"""The scheduler's session registry: session -> worker, lease, conversation, last cap. Pure.

The scheduler keeps the conversation (chat messages or token ids) and
renders each turn's whole prompt; the worker keeps tokens and their K/V and
reuses the longest common token prefix (SGLang's split: the session
controller never touches memory). The ledger holds one lease per session
(ledger.py: open_session_lease / resize / shrink).

Who swaps out: the scheduler. When an admission on a worker is not ADMITTED
whole and an idle session holds bytes there, the scheduler asks that worker
to swap the least recently used idle session out (Worker.SwapOutSession: the
worker frees the KV, then shrinks the lease), and admits again. The ledger
knows every lease and the registry knows which are idle, so the decision
needs no guess about the worker's state; the worker still does the freeing
before the ledger lets go, as for every release.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ortserve.output import conversation
from ortserve.output.conversation import Message, ToolSpec
from ortserve.status.errors import DomainError, ErrorReason, quoted
from ortserve.status.units import tokens
from scheduler_service.ledger.types import NewTokensCap

LOST_KEPT = 10_000  # tombstones of sessions lost with their worker (oldest dropped first)
# Ids of sessions closed (by CloseSession or the idle TTL): a retried CloseSession answers
# closed=false, not NOT_FOUND. Bounded: ~100 bytes an id, oldest forgotten first.
CLOSED_KEPT = 10_000


@dataclass
class Session:
    session_id: str
    worker_id: str
    address: str
    lease_id: str
    kind: str = ""  # "" until the first turn, then "chat" or "token_ids" for its life
    # The chat so far, whole (tool calls and tool call ids too): the next turn renders it.
    messages: list[Message] = field(default_factory=list)
    tools: tuple[ToolSpec, ...] = ()  # the session's tools: its first chat turn's, for its life
    token_ids: list[int] = field(default_factory=list)  # the token-id conversation so far
    turns: int = 0
    history_tokens: int = 0  # the last turn's whole prompt + its output (for messages)
    turn_in_flight: bool = False
    last_budget_cap: NewTokensCap | None = None  # the last turn's cap: across swap and turns
    last_used: float = 0.0

    def remember_turn(self, kind: str, new_messages: list[Message], prompt_ids: list[int],
                      reply_text: str, reply_ids: list[int],
                      tools: tuple[ToolSpec, ...] = ()) -> None:
        """The conversation grows by the turn's input and its reply (what the next turn renders).

        `kind` is the turn's prompt ("chat" or "token_ids"), `prompt_ids` its whole prompt,
        `tools` the turn's (the session's, once set: SessionRPCs refuses a turn that changes
        them). With tools, the reply remembered carries the calls it made (conversation.reply:
        the worker's copy names them the same).
        """
        self.kind = kind
        if kind == "chat":
            self.messages += [*new_messages,
                              conversation.reply(reply_text, bool(tools), self.turns + 1)]
            self.tools = tools
        else:
            self.token_ids = [*prompt_ids, *reply_ids]
        self.history_tokens = len(prompt_ids) + len(reply_ids)
        self.turns += 1


def not_found(session_id: str) -> DomainError:
    return DomainError(ErrorReason.SESSION_NOT_FOUND,
                       f"session {quoted(session_id)} is not open (closed, expired after the idle "
                       "TTL, never opened, or opened by another tenant); open a new session and "
                       "send the conversation again",
                       metadata={"session_id": session_id})


def busy(session_id: str) -> DomainError:
    return DomainError(ErrorReason.SESSION_BUSY,
                       f"session {quoted(session_id)} is running a turn; turns of a session run "
                       "one at a time: wait for its Finished event (or cancel it)",
                       metadata={"session_id": session_id})


GONE = ("its KV is gone and the ledger holds nothing for it; open a new session and send the "
        "conversation again")


def worker_lost(session: Session, why: str, remedy: str = GONE) -> DomainError:
    """`remedy`: what became of its KV and the next step (a session its worker saved to disk
    at a clean stop comes back with that worker: a retry then serves it)."""
    return DomainError(ErrorReason.SESSION_WORKER_LOST,
                       f"session {quoted(session.session_id)} lived on worker {session.worker_id} "
                       f"at {session.address}, which {why}; {remedy}",
                       metadata={"session_id": session.session_id, "worker_id": session.worker_id})


def context_full(session: Session, held_tokens: int, prompt_tokens: int, new_label: str,
                 new_tokens: int, context_length: int) -> DomainError:
    """The whole session counts against the context window: an error with the numbers.

    `new_label` names what the turn asked to generate ("max_new_tokens" or
    "min_new_tokens") and `new_tokens` how many.
    """
    return DomainError(
        ErrorReason.CONTEXT_LENGTH_EXCEEDED,
        f"session {quoted(session.session_id)}: this turn's whole conversation is "
        f"{tokens(prompt_tokens)} ({tokens(max(prompt_tokens - held_tokens, 0))} added to the "
        f"{tokens(held_tokens)} of earlier turns) and {new_label} {new_tokens:,}, beyond "
        f"the model's context window of {tokens(context_length)}; a full context window is an "
        "error, not an empty turn: ask for fewer new tokens, or open a new session with a "
        "shorter history",
        field="request.prompt" if prompt_tokens >= context_length else f"request.{new_label}",
        metadata={"session_id": session.session_id, "prompt_tokens": prompt_tokens,
                  "history_tokens": held_tokens, new_label: new_tokens,
                  "context_length": context_length})


class SessionRegistry:
    """Open sessions. Thread-safe: one lock (the servicer runs on one loop; tests may not)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        # Sessions lost with their worker: later calls still say why, not just "not open".
        self._lost: dict[str, DomainError] = {}
        self._closed: dict[str, None] = {}  # insertion-ordered: the oldest goes first

    def mark_lost(self, session: Session, why: str, remedy: str = GONE) -> DomainError:
        """Forget a session whose worker died or stopped (the ledger already dropped its
        lease); a registration that brings it back reopens it (restore)."""
        error = worker_lost(session, why, remedy)
        with self._lock:
            self._sessions.pop(session.session_id, None)
            self._lost[session.session_id] = error
            while len(self._lost) > LOST_KEPT:
                del self._lost[next(iter(self._lost))]
        return error

    def restore(self, session: Session) -> bool:
        """A registering worker's session (a scheduler restart, or the worker came back
        after its leases expired, or restarted on its --session-dir): known already -> kept
        as is (its conversation is the registry's; the worker's address may be new);
        closed by a client -> not restored (False: the worker frees it); else it is open
        again, idle."""
        with self._lock:
            known = self._sessions.get(session.session_id)
            if known is not None:
                known.worker_id, known.address = session.worker_id, session.address
                return True
            if session.session_id in self._closed:
                return False
            self._lost.pop(session.session_id, None)
            session.last_used = self._clock()
            self._sessions[session.session_id] = session
            return True

    def _missing(self, session_id: str) -> DomainError:
        return self._lost.get(session_id) or not_found(session_id)

    def add(self, session: Session) -> None:
        with self._lock:
            session.last_used = self._clock()
            self._sessions[session.session_id] = session

    def get(self, session_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise self._missing(session_id)
        return session

    def remove(self, session_id: str) -> Session | None:
        """The session is closed: forget it, and remember that it was (see `ended`)."""
        with self._lock:
            self._closed[session_id] = None
            while len(self._closed) > CLOSED_KEPT:
                del self._closed[next(iter(self._closed))]
            return self._sessions.pop(session_id, None)

    def ended(self, session_id: str) -> bool:
        """True for a session that was open and is no more (closed, expired, lost with its
        worker), as far as the last CLOSED_KEPT closes and LOST_KEPT losses go."""
        with self._lock:
            return session_id not in self._sessions and (session_id in self._closed
                                                         or session_id in self._lost)

    def begin_turn(self, session_id: str) -> Session:
        """Mark a turn in flight; SESSION_BUSY when one already is (one at a time)."""
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise self._missing(session_id)
            if session.turn_in_flight:
                raise busy(session_id)
            session.turn_in_flight = True
            return session

    def end_turn(self, session: Session) -> None:
        with self._lock:
            session.turn_in_flight = False
            session.last_used = self._clock()

    def idle_on(self, worker_id: str, exclude: str = "") -> list[Session]:
        """Idle sessions on a worker, least recently used first (swap-out candidates)."""
        with self._lock:
            idle = [s for s in self._sessions.values() if s.worker_id == worker_id
                    and not s.turn_in_flight and s.session_id != exclude]
        return sorted(idle, key=lambda s: s.last_used)

    def idle_on_any(self) -> list[Session]:
        with self._lock:
            return [s for s in self._sessions.values() if not s.turn_in_flight]

    def expired(self, ttl_s: float) -> list[Session]:
        """Idle sessions unused for longer than ttl_s (the caller closes them)."""
        now = self._clock()
        with self._lock:
            return [s for s in self._sessions.values()
                    if not s.turn_in_flight and now - s.last_used > ttl_s]

    def idle_s(self, session: Session) -> float:
        return self._clock() - session.last_used

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)
