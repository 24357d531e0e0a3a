"""Sessions a registering worker reports rebuild the scheduler's registry (issue 30)."""

from __future__ import annotations

from ortserve.v1 import scheduler_pb2, types_pb2
from scheduler_service.ledger.ledger import Lease, Ledger, WorkerGeometry
from scheduler_service.sessions.registry import Session, SessionRegistry
from scheduler_service.sessions.restore import restore_sessions
from worker_service.session_lifecycle import Conversation

GEOMETRY = WorkerGeometry(worker_id="w1", address="w1:1", model="m", context_length=4_096,
                          bytes_per_token=1_000, capacity_bytes=100_000)


def registration(*sessions: scheduler_pb2.LiveSession) -> scheduler_pb2.RegisterWorkerRequest:
    return scheduler_pb2.RegisterWorkerRequest(worker_id="w1", address="w1:1",
                                               live_sessions=sessions)


def test_the_workers_conversation_matches_what_the_scheduler_remembers():
    request = types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(messages=[
        types_pb2.ChatMessage(role="user", content="Hi")]))
    mine = Conversation()
    mine.remember(request, [1, 2, 3], "Hello!", [7, 8])
    theirs = Session(session_id="s", worker_id="w1", address="w1:1", lease_id="l")
    theirs.remember_turn("chat", [("user", "Hi")], [1, 2, 3], "Hello!", [7, 8])
    assert (mine.kind, mine.messages, mine.turns, mine.history_tokens) == (
        theirs.kind, theirs.messages, theirs.turns, theirs.history_tokens)


def test_sessions_whose_lease_the_ledger_took_back_are_open_again_the_others_dropped():
    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    kept = Lease(lease_id="l1", worker_id="w1", request_id="r", prompt_tokens=0,
                 max_new_tokens=0, reserved_bytes=16_000)
    refused = ledger.register(GEOMETRY, [kept])
    assert refused == []
    registry = SessionRegistry()
    registry.add(Session(session_id="closed", worker_id="w1", address="w1:1", lease_id="l3"))
    registry.remove("closed")  # a client closed it while the worker was away
    dropped = restore_sessions(registry, ledger, registration(
        scheduler_pb2.LiveSession(session_id="s1", lease_id="l1", kind="token_ids",
                                  token_ids=[1, 2, 3], turns=2, history_tokens=3),
        scheduler_pb2.LiveSession(session_id="s2", lease_id="not-held"),
        scheduler_pb2.LiveSession(session_id="closed", lease_id="l1")))
    assert dropped == ["s2", "closed"]
    session = registry.get("s1")
    assert (session.lease_id, session.token_ids, session.turns) == ("l1", [1, 2, 3], 2)
    assert ledger.lease("l1").reserved_bytes == 16_000
