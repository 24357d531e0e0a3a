"""Stored responses (the gateway's Responses API, `store: true`) and the sessions that keep
their KV (pure). The scheduler keeps them beside its session registry, so every gateway
process and replica finds each one; a gateway's memory did, and with `--processes 2` a
GET or a previous_response_id found its response in about half the calls.

A record is the gateway's (its conversation and response object), opaque here. It lives
its `ttl_s` after its put, or until `max_responses` newer ones push it out, whichever
comes first; a scheduler restart forgets them (the sessions come back from the workers,
the records do not: a follow-up then sends the whole conversation).

A session is linear and a response chain may fork, so only a session's latest response
(its head) continues it, one turn at a time; a follow-up of any other response, or one
while the head's turn runs, opens a new session with the whole conversation. When the
store forgets a session's head nothing can continue the session: its id is handed back
to be closed by the caller that opened it (its owner), rather than held until the idle TTL.

A record is its tenant's (the caller's, docs/features/tenants.md): for a caller of another
tenant it is absent, whether read, deleted, continued or written over. Without tenants
every caller is "" and every record everyone's, as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_MAX_RESPONSES = 1_000


@dataclass
class Record:
    id: str
    session_id: str  # "": no session keeps its KV
    record: bytes  # the gateway's, opaque
    ttl_s: float
    stored_at_s: float = 0.0
    tenant: str = ""  # whose it is: no other tenant's caller sees it


class StoredResponses:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_responses = DEFAULT_MAX_RESPONSES
        self._clock = clock
        self._records: dict[str, Record] = {}  # insertion-ordered: the oldest first
        self._heads: dict[str, str] = {}  # session id -> its latest response's id
        self._busy: set[str] = set()  # sessions with a turn running

    def __len__(self) -> int:
        return len(self._records)

    def get(self, response_id: str, tenant: str = "") -> Record | None:
        """The record, when it is `tenant`'s (another tenant's is absent)."""
        self.expire()
        record = self._records.get(response_id)
        return record if record is not None and record.tenant == tenant else None

    def put(self, record: Record, max_responses: int = 0) -> list[str] | None:
        """Store a record (its session's new head, when it has one); returns the sessions
        nothing continues any more (to close), or None when the id is another tenant's
        (nothing stored). `max_responses` (0: unchanged) bounds the count from now on."""
        held = self._records.get(record.id)
        if held is not None and held.tenant != record.tenant:
            return None
        if max_responses:
            self.max_responses = max_responses
        record.stored_at_s = self._clock()
        self._records.pop(record.id, None)  # a put again moves it to the newest
        self._records[record.id] = record
        if record.session_id:
            self._heads[record.session_id] = record.id
        return self.expire()

    def delete(self, response_id: str, tenant: str = "") -> tuple[bool, list[str]]:
        """(found, sessions to close); another tenant's record is not found."""
        if self.get(response_id, tenant) is None:
            return False, []
        record = self._records.pop(response_id)
        return True, self._orphaned(record)

    def claim(self, response_id: str, tenant: str = "") -> str:
        """The session to continue the response in ("" when none: not its head, or busy,
        or another tenant's); the session is busy until `turn_ended`."""
        record = self.get(response_id, tenant)
        session = record.session_id if record else ""
        if not session or self._heads.get(session) != record.id or session in self._busy:
            return ""
        self._busy.add(session)
        return session

    def turn_ended(self, session_id: str, kept: bool, tenant: str = "") -> list[str]:
        """A claimed session's turn ended; `kept`: the session still holds the head's
        conversation (its turn failed before it ran, or it ended and the new head was put).
        Not kept: forgotten here, and returned to close. A session whose head is another
        tenant's is left as it is (nothing returned)."""
        head = self._records.get(self._heads.get(session_id, ""))
        if head is not None and head.tenant != tenant:
            return []
        self._busy.discard(session_id)
        if kept and self._heads.get(session_id) in self._records:
            return []
        self._heads.pop(session_id, None)
        return [session_id] if session_id else []

    def expire(self) -> list[str]:
        """Forget records past their time or beyond the count; sessions to close."""
        now = self._clock()
        closing: list[str] = []
        while self._records:
            oldest = next(iter(self._records.values()))
            if len(self._records) <= self.max_responses and now - oldest.stored_at_s < oldest.ttl_s:
                break
            del self._records[oldest.id]
            closing += self._orphaned(oldest)
        return closing

    def _orphaned(self, record: Record | None) -> list[str]:
        # A running turn's session is the turn's to settle (turn_ended).
        if record is None or not record.session_id or record.session_id in self._busy \
                or self._heads.get(record.session_id) != record.id:
            return []
        del self._heads[record.session_id]
        return [record.session_id]
