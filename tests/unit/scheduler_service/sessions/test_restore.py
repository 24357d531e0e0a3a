"""Sessions a registering worker reports rebuild the scheduler's registry."""

from __future__ import annotations

from ortserve.output import conversation
from ortserve.output.conversation import Call, Message, ToolSpec
from ortserve.v1 import scheduler_pb2, types_pb2
from scheduler_service.ledger.ledger import Lease, Ledger, WorkerGeometry
from scheduler_service.sessions.registry import Session, SessionRegistry
from scheduler_service.sessions.restore import restore_sessions
from worker_service.session_lease_table import SessionLeaseTable
from worker_service.session_lifecycle import Conversation, WorkerSessions


class LeaseLifecycleStub:
    """What WorkerSessions.live_sessions reads of the worker's leases."""

    def __init__(self) -> None:
        self.sessions = SessionLeaseTable(engine=None, link=None)
        self.sessions.leases["s1"] = types_pb2.Lease(lease_id="l1")

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
    theirs.remember_turn("chat", [Message("user", "Hi")], [1, 2, 3], "Hello!", [7, 8])
    assert (mine.kind, mine.messages, mine.turns, mine.history_tokens) == (
        theirs.kind, theirs.messages, theirs.turns, theirs.history_tokens)


WEATHER = types_pb2.Tool(name="get_weather", description="The weather in a city",
                         parameters_json='{"type":"object","properties":{"city":{"type":"string"}}}')
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris"}}\n</tool_call>'


def tool_turns() -> list[types_pb2.GenerateRequest]:
    """Three turns of a session with tools, each the whole request the scheduler sends."""
    first = types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(
        messages=[types_pb2.ChatMessage(role="user", content="Weather in Paris?")],
        tools=[WEATHER]))
    second = types_pb2.GenerateRequest()
    second.CopyFrom(first)
    second.chat.messages.add(role="assistant", content="Let me look.", tool_calls=[
        types_pb2.ToolCall(id="call_1_0", name="get_weather", arguments_json='{"city":"Paris"}')])
    second.chat.messages.add(role="tool", content='{"temp": 21}', tool_call_id="call_1_0")
    return [first, second]


def test_tool_calls_ids_and_tools_survive_both_copies_and_agree():
    first, second = tool_turns()
    mine = Conversation()
    theirs = Session(session_id="s", worker_id="w1", address="w1:1", lease_id="l")
    tools = (ToolSpec("get_weather", WEATHER.description, WEATHER.parameters_json),)
    mine.remember(first, [1, 2, 3], "Let me look.\n" + CALL_TEXT, [7, 8])
    theirs.remember_turn("chat", [Message("user", "Weather in Paris?")], [1, 2, 3],
                         "Let me look.\n" + CALL_TEXT, [7, 8], tools)
    mine.remember(second, [1, 2, 3, 7, 8, 9], "It is 21 degrees.", [10])
    theirs.remember_turn("chat", [Message("tool", '{"temp": 21}', tool_call_id="call_1_0")],
                         [1, 2, 3, 7, 8, 9], "It is 21 degrees.", [10], tools)
    expected = [Message("user", "Weather in Paris?"),
                Message("assistant", "Let me look.",
                        (Call("call_1_0", "get_weather", '{"city":"Paris"}'),)),
                Message("tool", '{"temp": 21}', tool_call_id="call_1_0"),
                Message("assistant", "It is 21 degrees.")]
    assert mine.messages == theirs.messages == expected
    assert mine.tools == theirs.tools == tools
    # What the scheduler's registry renders into the next request is what the worker saw.
    rendered = types_pb2.ChatMessages()
    for message in theirs.messages[:3]:
        conversation.add_message(rendered.messages, message)
    assert list(rendered.messages) == list(second.chat.messages)


def test_a_call_cut_short_is_remembered_as_the_text_the_model_wrote():
    first, _ = tool_turns()
    mine = Conversation()
    mine.remember(first, [1, 2, 3], CALL_TEXT[:30], [7])
    assert mine.messages[-1] == Message("assistant", CALL_TEXT[:30])


def test_without_tools_a_reply_is_text_even_when_it_reads_like_a_call():
    session = Session(session_id="s", worker_id="w1", address="w1:1", lease_id="l")
    session.remember_turn("chat", [Message("user", "Hi")], [1], CALL_TEXT, [2])
    assert session.messages[-1] == Message("assistant", CALL_TEXT)


def test_a_restored_session_keeps_tool_calls_ids_and_tools():
    first, second = tool_turns()
    leases = LeaseLifecycleStub()
    sessions = WorkerSessions(leases, "w1:1")
    sessions.turn_ended("s1", first, [1, 2, 3], "Let me look.\n" + CALL_TEXT, [7, 8])
    sessions.turn_ended("s1", second, [1, 2, 3, 7, 8, 9], "21 degrees.", [10])
    [live] = sessions.live_sessions()
    assert list(live.tools) == [WEATHER]
    assert list(live.messages) == [*second.chat.messages,
                                   types_pb2.ChatMessage(role="assistant", content="21 degrees.")]

    ledger = Ledger(lease_ttl_s=1e9, claim_ttl_s=1e9)
    ledger.register(GEOMETRY, [Lease(lease_id="l1", worker_id="w1", request_id="r",
                                     prompt_tokens=0, max_new_tokens=0, reserved_bytes=16_000)])
    registry = SessionRegistry()
    assert restore_sessions(registry, ledger, registration(live)) == []
    restored = registry.get("s1")
    assert restored.messages == sessions._conversations["s1"].messages
    assert restored.tools == (ToolSpec("get_weather", WEATHER.description,
                                       WEATHER.parameters_json),)
    assert restored.messages[1].tool_calls[0].id == "call_1_0"
    assert restored.messages[2].tool_call_id == "call_1_0"


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


def test_a_later_turn_takes_the_sessions_tools_and_may_not_change_them():
    import pytest

    from ortserve.status.errors import InvalidField
    from scheduler_service.sessions.turn import SessionTurnRelay

    session = Session(session_id="s", worker_id="w1", address="w1:1", lease_id="l", kind="chat",
                      tools=(conversation.tool_of(WEATHER),))
    later = types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(messages=[
        types_pb2.ChatMessage(role="tool", content="21", tool_call_id="call_1_0")]))
    SessionTurnRelay._session_tools(session, later)
    assert list(later.chat.tools) == [WEATHER]  # none sent: the session's apply
    SessionTurnRelay._session_tools(session, later)  # the same list again: accepted as is
    assert list(later.chat.tools) == [WEATHER]
    later.chat.tools.add(name="get_time")
    with pytest.raises(InvalidField) as info:
        SessionTurnRelay._session_tools(session, later)
    assert info.value.field == "request.chat.tools"


def test_a_registrations_session_leases_are_marked_and_take_no_batch_row():
    from scheduler_service import convert
    from scheduler_service.ledger import placement

    request = scheduler_pb2.RegisterWorkerRequest(
        worker_id="w1", address="w1:1", model="m", context_length=4_096, bytes_per_token=1_000,
        capacity_bytes=100_000, max_batch_rows=1,
        live_leases=[types_pb2.Lease(lease_id="l1", worker_id="w1", reserved_bytes=5_000),
                     types_pb2.Lease(lease_id="l2", worker_id="w1", reserved_bytes=5_000)],
        live_sessions=[scheduler_pb2.LiveSession(session_id="s1", lease_id="l1")])
    leases = convert.live_leases_from_pb(request, now=100.0)
    assert [(lease.lease_id, lease.session) for lease in leases] == [("l1", True), ("l2", False)]
    geometry = convert.geometry_from_pb(request)
    assert geometry.max_batch_rows == 1
    ledger = Ledger()
    assert ledger.register(geometry, leases) == []
    [worker] = ledger._workers.values()
    assert not placement.has_free_row(worker)  # l2 runs; the session's l1 holds no row
    ledger.release("l2", worker_id="w1")
    assert placement.has_free_row(worker)


def test_a_clean_stop_loses_its_sessions_until_it_registers_them_again_saying_where_the_kv_is():
    from ortserve.status.errors import DomainError, ErrorReason
    from scheduler_service.sessions.restore import sessions_left_with

    ledger, registry = Ledger(), SessionRegistry()
    ledger.register(GEOMETRY)
    saved, memory = (ledger.open_session_lease(name) for name in ("saved", "memory"))
    ledger.shrink(saved.lease_id, "w1", held_tokens=0, disk_bytes=4_096)  # parked at the stop
    for sid, lease in (("s-disk", saved), ("s-mem", memory)):
        registry.add(Session(session_id=sid, worker_id="w1", address="w1:1",
                             lease_id=lease.lease_id))
    dropped = ledger.forget_worker("w1", "w1:1")
    assert sessions_left_with(registry, "w1", dropped) == (1, 1)
    errors = {}
    for sid in ("s-disk", "s-mem"):
        try:
            registry.get(sid)
        except DomainError as error:
            errors[sid] = error
    assert {e.reason for e in errors.values()} == {ErrorReason.SESSION_WORKER_LOST}
    assert "--session-dir" in errors["s-disk"].message and "retry then" in errors["s-disk"].message
    assert "its KV is gone" in errors["s-mem"].message
    # The worker comes back on its folder: the session saved there is open again.
    back = registration(scheduler_pb2.LiveSession(session_id="s-disk", lease_id=saved.lease_id))
    ledger.register(GEOMETRY, [Lease(lease_id=saved.lease_id, worker_id="w1", request_id="saved",
                                     prompt_tokens=0, max_new_tokens=0, reserved_bytes=0,
                                     session=True, disk_bytes=4_096)])
    assert restore_sessions(registry, ledger, back) == []
    assert registry.get("s-disk").lease_id == saved.lease_id
