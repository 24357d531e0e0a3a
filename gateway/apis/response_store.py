"""Stored responses (`store: true`) and the sessions that keep their KV (pure).

A stored response holds what a follow-up needs to continue it: the
conversation so far as chat messages (the input items and the output, the
instructions apart: a follow-up's own replace them), its tools, and the
ortserve session whose KV holds that conversation, with the response object
itself for GET. It lives `ttl_s` after it was made, or until `max_responses`
newer ones push it out, whichever comes first; the gateway's memory, not the
scheduler's (a gateway restart forgets them).

A session is linear and a response chain may fork, so only a session's
latest response (its head) continues it, one turn at a time; a follow-up of
any other response, or one while the head's turn runs, opens a new session
with the whole conversation. When the store forgets a session's head nothing
can continue the session: the store hands its id back to be closed, so its
lease is released rather than held until the scheduler's idle TTL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_MAX_RESPONSES = 1_000
DEFAULT_TTL_S = 3_600.0


@dataclass
class Stored:
    id: str
    model: str  # as resolved
    instructions: str | None
    tools_key: str  # the tools offered, as ResponsesRequest.tools_key
    conversation: list[dict]  # chat messages: every input and output so far, no instructions
    body: dict  # the response object (GET /v1/responses/{id})
    session_id: str = ""  # "": no session keeps its KV
    turns: int = 0  # the session's finished turns, this response's included
    stored_at_s: float = field(default=0.0)


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES,
                 ttl_s: float = DEFAULT_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_responses = max_responses
        self.ttl_s = ttl_s
        self._clock = clock
        self._responses: dict[str, Stored] = {}  # insertion-ordered: the oldest first
        self._heads: dict[str, str] = {}  # session id -> its latest response's id
        self._busy: set[str] = set()  # sessions with a turn running

    def __len__(self) -> int:
        return len(self._responses)

    def get(self, response_id: str) -> Stored | None:
        self.expire()
        return self._responses.get(response_id)

    def put(self, stored: Stored) -> list[str]:
        """Store a response (its session's new head, when it has one); returns the sessions
        nothing continues any more (to close)."""
        stored.stored_at_s = self._clock()
        self._responses[stored.id] = stored
        if stored.session_id:
            self._heads[stored.session_id] = stored.id
        return self.expire()

    def delete(self, response_id: str) -> tuple[bool, list[str]]:
        """(found, sessions to close)."""
        stored = self._responses.pop(response_id, None)
        return stored is not None, self._orphaned(stored)

    def claim(self, stored: Stored) -> str:
        """The session to continue `stored` in ("" when none: not its head, or busy); the
        session is busy until `turn_ended`."""
        session = stored.session_id
        if not session or self._heads.get(session) != stored.id or session in self._busy:
            return ""
        self._busy.add(session)
        return session

    def turn_ended(self, session_id: str, kept: bool) -> list[str]:
        """A claimed session's turn ended; `kept`: the session still holds the head's
        conversation (its turn failed before it ran, or it ended and the new head is put
        next). Not kept: forgotten here, and returned to close."""
        self._busy.discard(session_id)
        if kept and self._heads.get(session_id) in self._responses:
            return []
        self._heads.pop(session_id, None)
        return [session_id]

    def expire(self) -> list[str]:
        """Forget responses past their time or beyond the count; sessions to close."""
        now = self._clock()
        closing: list[str] = []
        while self._responses:
            oldest = next(iter(self._responses.values()))
            if len(self._responses) <= self.max_responses and now - oldest.stored_at_s < self.ttl_s:
                break
            del self._responses[oldest.id]
            closing += self._orphaned(oldest)
        return closing

    def _orphaned(self, stored: Stored | None) -> list[str]:
        # A running turn's session is the turn's to settle (turn_ended).
        if stored is None or not stored.session_id or stored.session_id in self._busy \
                or self._heads.get(stored.session_id) != stored.id:
            return []
        del self._heads[stored.session_id]
        return [stored.session_id]
