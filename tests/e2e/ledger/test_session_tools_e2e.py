"""A session whose turns use tools, through real processes on the default model.

A turn offers a tool and the model calls it, the next turn answers the call (a tool
turn with its tool_call_id), a third asks on. Each turn's prompt must be the whole
conversation as a fresh request would render it (the call, its id and the tools kept),
or the session's KV would no longer match what its history renders; and so after a
scheduler restart, from the conversation the worker kept.
"""

from __future__ import annotations

import socket

import grpc
import pytest

from ortserve.output import tool_output
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import (
    drained_roomy,
    kill_and_restart_scheduler,
    scheduler_stub,
    start_cluster,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

WEATHER = types_pb2.Tool(
    name="get_weather", description="The current weather in a city",
    parameters_json='{"type":"object","properties":{"city":{"type":"string"}},'
                    '"required":["city"]}')
CALL = types_pb2.Constraint(tool_call=types_pb2.ToolCallConstraint())  # one call, any tool
Q1 = types_pb2.ChatMessage(role="user", content="What is the weather in Paris?")
ANSWER = types_pb2.ChatMessage(role="tool", content='{"temp_c": 21, "sky": "clear"}',
                               tool_call_id="call_1_0")  # the first turn's first call
Q3 = types_pb2.ChatMessage(role="user", content="Thanks. Should I take a coat?")


def turn(stub, session_id: str, messages, tools=(), **fields):
    events = list(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
        session_id=session_id, request=types_pb2.GenerateRequest(
            chat=types_pb2.ChatMessages(messages=messages, tools=tools), **fields)), timeout=120))
    assert events[-1].WhichOneof("event") == "finished"
    ids = [t for e in events if e.WhichOneof("event") == "chunk" for t in e.chunk.token_ids]
    text = "".join(e.chunk.text for e in events if e.WhichOneof("event") == "chunk")
    return events[-1].finished, ids, text


def fresh(stub, messages, **fields):
    """The same conversation as one plain request: what the session's turn must equal."""
    request = types_pb2.GenerateRequest(
        chat=types_pb2.ChatMessages(messages=messages, tools=[WEATHER]), **fields)
    events = list(stub.Generate(request, timeout=120))
    ids = [t for e in events if e.WhichOneof("event") == "chunk" for t in e.chunk.token_ids]
    return events[-1].finished, ids


def called(text: str) -> types_pb2.ChatMessage:
    """The assistant turn an application hands back for a reply that made calls."""
    content, calls = tool_output.parse(text)
    assert calls and all(c.complete for c in calls), text
    return types_pb2.ChatMessage(role="assistant", content=content.rstrip("\n"), tool_calls=[
        types_pb2.ToolCall(id=f"call_1_{i}", name=c.name, arguments_json=c.arguments)
        for i, c in enumerate(calls)])


def first_turn(stub, session_id: str):
    f1, _, text1 = turn(stub, session_id, [Q1], tools=[WEATHER], constraint=CALL,
                        max_new_tokens=64)
    return f1, called(text1)


def assert_tool_turn_renders_the_whole_history(stub, session_id: str, f1, reply1):
    """The tool turn (no tools sent: the session's apply) reuses the first turn's KV and
    equals a fresh run of the whole conversation, call and id included."""
    f2, ids2, text2 = turn(stub, session_id, [ANSWER], max_new_tokens=24)
    assert f2.usage.reused_prompt_tokens >= f1.usage.prompt_tokens
    fresh2, fresh_ids2 = fresh(stub, [Q1, reply1, ANSWER], max_new_tokens=24)
    assert f2.usage.prompt_tokens == fresh2.usage.prompt_tokens
    assert ids2 == fresh_ids2
    return f2, text2


@pytest.fixture()
def cluster(shared_roomy):
    """The run's shared roomy cluster (512 MiB, the default model), drained before and after."""
    yield from drained_roomy(shared_roomy)


def test_a_tool_call_its_answer_and_the_next_turn_render_the_history_they_were_given(cluster):
    stub = scheduler_stub(cluster.address)
    sid = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
    f1, reply1 = first_turn(stub, sid)
    f2, text2 = assert_tool_turn_renders_the_whole_history(stub, sid, f1, reply1)
    # The same tools again are the session's: accepted.
    f3, ids3, _ = turn(stub, sid, [Q3], tools=[WEATHER], max_new_tokens=24)
    assert f3.usage.reused_prompt_tokens >= f2.usage.prompt_tokens
    history = [Q1, reply1, ANSWER, types_pb2.ChatMessage(role="assistant", content=text2), Q3]
    fresh3, fresh_ids3 = fresh(stub, history, max_new_tokens=24)
    assert f3.usage.prompt_tokens == fresh3.usage.prompt_tokens
    assert ids3 == fresh_ids3
    # Other tools: refused, naming the field; the session is unchanged.
    other = types_pb2.Tool(name="get_time", parameters_json="")
    with pytest.raises(grpc.RpcError) as info:
        turn(stub, sid, [Q3], tools=[WEATHER, other], max_new_tokens=8)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request.chat.tools" in info.value.details()
    info = stub.GetSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=10)
    assert info.turns == 3
    stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)


def test_tool_calls_ids_and_tools_survive_a_scheduler_restart(tmp_path_factory):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = start_cluster(tmp_path_factory, "session-tools-restart", scheduler_port=port,
                            scheduler_args=["--heartbeat-interval-s", "0.5"])
    try:
        stub = scheduler_stub(cluster.address)
        sid = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
        f1, reply1 = first_turn(stub, sid)
        kill_and_restart_scheduler(cluster, port)
        stub = scheduler_stub(cluster.address)
        assert stub.GetSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=10).turns == 1
        assert_tool_turn_renders_the_whole_history(stub, sid, f1, reply1)
        stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
    finally:
        cluster.stop()
