"""Stored responses (`store: true`) and the sessions that keep their KV: the gateway's
record and its store, which the scheduler keeps (Scheduler.PutStoredResponse and its
siblings; scheduler_service/sessions/stored_responses.py has the rules).

A stored response holds what a follow-up needs to continue it: the
conversation so far as chat messages (the input items and the output, the
instructions apart: a follow-up's own replace them), its tools, and the
ortserve session whose KV holds that conversation, with the response object
itself for GET. It lives `ttl_s` after it was made, or until `max_responses`
newer ones push it out, whichever comes first. The scheduler keeps it beside its
session registry, so every gateway process (`--processes`) and every gateway replica
behind a load balancer finds it; a scheduler restart forgets them.

A session is linear and a response chain may fork, so only a session's
latest response (its head) continues it, one turn at a time; a follow-up of
any other response, or one while the head's turn runs, opens a new session
with the whole conversation. When the store forgets a session's head nothing
can continue the session: the store hands its id back to be closed, so its
lease is released rather than held until the scheduler's idle TTL.

Every method takes `via`, the request's Target (the scheduler's stub and the caller's
key); a scheduler's refusal or absence raises its grpc.RpcError.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from ortserve.v1 import scheduler_pb2

DEFAULT_MAX_RESPONSES = 1_000
DEFAULT_TTL_S = 3_600.0
_TIMEOUT_S = 10.0


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
    # This response's own input as OpenAI lists it (input_items.py); a record from before
    # this field has none.
    input_items: list[dict] = field(default_factory=list)


def _record(stored: Stored) -> bytes:
    fields = asdict(stored)
    del fields["id"], fields["session_id"]  # the scheduler's own fields
    return json.dumps(fields, separators=(",", ":")).encode()


def _stored(pb: scheduler_pb2.StoredResponse) -> Stored:
    return Stored(id=pb.id, session_id=pb.session_id, **json.loads(pb.record))


class ResponseStore:
    def __init__(self, max_responses: int = DEFAULT_MAX_RESPONSES,
                 ttl_s: float = DEFAULT_TTL_S) -> None:
        self.max_responses = max_responses
        self.ttl_s = ttl_s

    async def get(self, response_id: str, via) -> Stored | None:
        answer = await via.upstream.stub.GetStoredResponse(
            scheduler_pb2.StoredResponseRequest(id=response_id), timeout=_TIMEOUT_S,
            metadata=via.metadata)
        return _stored(answer.response) if answer.found else None

    async def put(self, stored: Stored, via) -> list[str]:
        """Store a response (its session's new head, when it has one); returns the sessions
        nothing continues any more (to close)."""
        change = await via.upstream.stub.PutStoredResponse(scheduler_pb2.StoredResponse(
            id=stored.id, session_id=stored.session_id, record=_record(stored),
            ttl_s=self.ttl_s, max_responses=self.max_responses),
            timeout=_TIMEOUT_S, metadata=via.metadata)
        return list(change.closing_session_ids)

    async def delete(self, response_id: str, via) -> tuple[bool, list[str]]:
        """(found, sessions to close)."""
        change = await via.upstream.stub.DeleteStoredResponse(
            scheduler_pb2.StoredResponseRequest(id=response_id), timeout=_TIMEOUT_S,
            metadata=via.metadata)
        return change.found, list(change.closing_session_ids)

    async def claim(self, stored: Stored, via) -> str:
        """The session to continue `stored` in ("" when none: not its head, or busy); the
        session is busy until `turn_ended`."""
        claim = await via.upstream.stub.ClaimStoredResponse(
            scheduler_pb2.StoredResponseRequest(id=stored.id), timeout=_TIMEOUT_S,
            metadata=via.metadata)
        return claim.session_id

    async def turn_ended(self, session_id: str, kept: bool, via) -> list[str]:
        """A claimed session's turn ended; `kept`: the session still holds the head's
        conversation (its turn failed before it ran, or it ended and the new head is put
        next). Not kept: forgotten, and returned to close."""
        change = await via.upstream.stub.EndStoredTurn(
            scheduler_pb2.EndStoredTurnRequest(session_id=session_id, kept=kept),
            timeout=_TIMEOUT_S, metadata=via.metadata)
        return list(change.closing_session_ids)
