"""The Responses API's translation (gateway/apis/responses/request.py, its reply in
gateway/apis/responses/reply.py), the output pipeline
(gateway/reply/output_parts.py) and the stored responses (gateway/apis/responses/store.py,
through the scheduler's own store held in process): no processes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gateway.apis.responses import reply as orr_reply
from gateway.apis.responses import request as orr
from gateway.apis.responses.store import ResponseStore, Stored
from gateway.reply.output_parts import (
    CallArgumentsPiece,
    CallStartPiece,
    OutputParser,
    Reasoning,
    Text,
)
from gateway.request.param_error import ParamError
from ortserve.v1 import types_pb2
from scheduler_service.sessions.stored_rpcs import StoredResponseRPCs

TOOL = {"type": "function", "name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def chat(body: dict, history=()):
    return orr.parse({"model": "m", **body}).chat(list(history))


def test_a_string_input_and_instructions_are_a_system_and_a_user_turn():
    parsed = chat({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 7})
    turns = [(m.role, m.content) for m in parsed.generate.chat.messages]
    assert turns == [("system", "Be brief."), ("user", "Hi")]
    assert parsed.generate.max_new_tokens == 7


def test_items_become_chat_turns_calls_joining_the_assistant_turn_before_them():
    parsed = chat({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Let me look.", "annotations": []}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ], "tools": [TOOL]})
    messages = parsed.generate.chat.messages
    assert [m.role for m in messages] == ["user", "assistant", "tool"]
    assert messages[1].content == "Let me look."
    assert [c.id for c in messages[1].tool_calls] == ["c1", "c2"]
    assert messages[2].tool_call_id == "c1" and messages[2].content == "sunny"
    assert [t.name for t in parsed.generate.chat.tools] == ["get_weather"]
    assert parsed.tool_calls


def test_a_follow_up_renders_the_stored_history_between_instructions_and_input():
    history = [{"role": "user", "content": "A"}, {"role": "assistant", "content": "B"}]
    parsed = chat({"input": "C", "instructions": "S"}, history)
    assert [m.content for m in parsed.generate.chat.messages] == ["S", "A", "B", "C"]


def test_text_format_json_schema_is_chats_response_format():
    parsed = chat({"input": "x", "text": {"format": {"type": "json_schema", "name": "n",
                                                     "schema": {"type": "object"}}}})
    assert parsed.generate.constraint.json_schema == '{"type": "object"}'


@pytest.mark.parametrize(("body", "param"), [
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "max_tokens": 5}, "max_tokens"),
    ({"input": "x", "messages": []}, "messages"),
    ({"input": [{"type": "input_image"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]},
     "input[1].role"),
    ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": "x", "tools": [{"type": "file_search"}]}, "tools[0].type"),
    ({"input": "x", "tools": [dict(TOOL, parameters=[1])]}, "tools[0].parameters"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}},
     "text.format.name"),
    ({"input": "x", "text": {"verbosity": "low"}}, "text.verbosity"),
    ({"input": "x", "truncation": "auto"}, "truncation"),
    ({"input": "x", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "x", "store": "yes"}, "store"),
    ({"input": "x", "temprature": 1}, "temprature"),
    ({"input": []}, "input"),
    ({}, "input"),
    ({"model": 5, "input": "x"}, "model"),
])
def test_refusals_name_the_responses_field(body, param):
    with pytest.raises(ParamError) as err:
        chat(body)
    assert err.value.param == param
    assert err.value.message.startswith(param + ":")


def test_safety_identifier_and_prompt_cache_key_are_labels_as_user_is():
    plain = chat({"input": "x"})
    labelled = chat({"input": "x", "safety_identifier": "u1", "prompt_cache_key": "c1",
                     "user": "u1"})
    assert labelled.generate == plain.generate
    with pytest.raises(ParamError) as err:
        chat({"input": "x", "prompt_cache_retention": "24h"})  # a promise it cannot keep
    assert err.value.param == "prompt_cache_retention"


def test_chat_params_in_responses_words():
    assert orr.chat_param("response_format.json_schema.schema") == "text.format.schema"
    assert orr.chat_param("tools[2].function.parameters") == "tools[2].parameters"
    assert orr.chat_param("messages[1].content", ["instructions", "input[3]"]) == "input[3]"
    assert orr.chat_param("messages") == "input"
    assert orr.chat_param("reasoning_effort") == "reasoning.effort"


def test_items_stream_the_events_and_end_as_the_whole_output():
    items = orr_reply.OutputItems()
    events = items.add([Reasoning("hmm"), Text("Hel"), Text("lo"),
                        CallStartPiece(0, "call_x", "get_weather"), CallArgumentsPiece(0, '{"city"'),
                        CallArgumentsPiece(0, ': "Paris"}')])
    events += items.close()
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    reasoning, message, call = items.items
    assert reasoning["content"][0]["text"] == "hmm"
    assert message["content"][0]["text"] == "Hello" and message["status"] == "completed"
    assert call == {"id": call["id"], "type": "function_call", "status": "completed",
                    "call_id": "call_x", "name": "get_weather",
                    "arguments": '{"city": "Paris"}'}
    assert events[-1]["item"] == call


def test_an_empty_output_is_one_empty_message_and_a_cut_one_is_incomplete():
    items = orr_reply.OutputItems()
    items.close("incomplete")
    assert [(i["type"], i["status"], i["content"][0]["text"]) for i in items.items] == [
        ("message", "incomplete", "")]
    fin = types_pb2.Finished(finish_reason=types_pb2.LENGTH)
    assert orr_reply.status_of(fin) == ("incomplete", {"reason": "max_output_tokens"})
    assert orr_reply.status_of(types_pb2.Finished(finish_reason=types_pb2.EOS)) == ("completed", None)


def test_usage_counts_session_and_prefix_cache_reuse_as_cached():
    usage = orr_reply.usage_dict(types_pb2.Usage(prompt_tokens=100, generated_tokens=5,
                                           reused_prompt_tokens=60, cached_tokens=16), 2)
    assert usage == {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 76},
                     "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 2},
                     "total_tokens": 105}


def test_the_admission_picks_the_reasoning_split_and_the_tool_format():
    parsed = chat({"input": "Hi", "tools": [TOOL]})
    adm = types_pb2.Admission(reasoning_format="think", prompt_opens_reasoning=True,
                              tool_call_format="hermes")
    parser = OutputParser.for_stream(parsed, adm, call_id=lambda i: f"id{i}")
    pieces = parser.push("plan</thi", 2)
    pieces += parser.push("nk>\n\nSure. ", 2)
    pieces += parser.push('<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>', 9)
    pieces += parser.push("", final=True)
    assert pieces[0] == Reasoning("plan")
    assert Text("Sure. ") in pieces
    assert CallStartPiece(0, "id0", "f") in pieces
    assert "".join(p.fragment for p in pieces if isinstance(p, CallArgumentsPiece)) == '{"a": 1}'
    assert parser.called and parser.reasoning_text == "plan"
    assert parser.reasoning_tokens == 4  # chat's rule: the chunk that closes counts
    # --reasoning-parser none, or a model whose template writes no reasoning: all text.
    for mode, fmt in (("none", "think"), ("auto", "")):
        plain = OutputParser.for_stream(replace(parsed, reasoning_mode=mode),
                                        types_pb2.Admission(reasoning_format=fmt,
                                                            prompt_opens_reasoning=True))
        assert plain.push("plan</think>x", 3) == [Text("plan</think>x")]
        assert not plain.splits_reasoning and plain.reasoning_tokens == 0


def test_the_tool_call_format_is_the_admissions():
    parsed = chat({"input": "Hi", "tools": [TOOL]})
    parser = OutputParser.for_stream(parsed, types_pb2.Admission(tool_call_format="mistral"))
    pieces = parser.push('[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}]', 9)
    pieces += parser.push("", final=True)
    assert [p.name for p in pieces if isinstance(p, CallStartPiece)] == ["f"]


class _Stub:
    """The scheduler's stub as the Responses handler calls it; records the calls."""

    def __init__(self, open_session_error=None, turn_error=None) -> None:
        self.calls: list[str] = []
        self.opened: list = []  # the GenerateRequests of plain Generates
        self._open_error = open_session_error
        self._turn_error = turn_error
        self.stored = StoredResponseRPCs()  # the scheduler's own, in process

    def __getattr__(self, name: str):
        # PutStoredResponse, GetStoredResponse, ...: the scheduler's stored-response RPCs.
        method = getattr(self.stored, name)
        return lambda request, **_kw: method(request, None)

    async def OpenSession(self, request, **_kw):  # noqa: N802 (gRPC's method name)
        self.calls.append("OpenSession")
        if self._open_error is not None:
            raise self._open_error
        return types_pb2.SessionInfo(session_id="s-new")

    async def CloseSession(self, request, **_kw):  # noqa: N802
        self.calls.append(f"CloseSession {request.session_id}")

    def SessionTurn(self, request, **_kw):  # noqa: N802
        self.calls.append(f"SessionTurn {request.session_id} {len(request.request.chat.messages)}")
        return _Call(self._turn_error)


class _Call:
    def __init__(self, error) -> None:
        self._error = error

    async def read(self):
        if self._error is not None:
            raise self._error
        return types_pb2.GenerateEvent(admission=types_pb2.Admission(lease_id="l1"))

    def cancel(self) -> None:
        pass


class _Upstream:
    timeout_s = 5.0

    def __init__(self, stub: _Stub) -> None:
        self.stub = stub

    async def open(self, request, metadata=()):
        self.stub.calls.append(f"Generate {len(request.chat.messages)}")
        self.stub.opened.append(request)
        return types_pb2.Admission(lease_id="g1")

    async def resolve_adapter(self, request, metadata=()):
        pass  # no LoRA adapters here: the model is the base


def _rpc_error(code, reason: str = "", details: str = "no"):
    import grpc
    from google.rpc import error_details_pb2, status_pb2

    trailing = grpc.aio.Metadata()
    if reason:
        status = status_pb2.Status(code=code.value[0], message=details)
        status.details.add().Pack(error_details_pb2.ErrorInfo(reason=reason))
        trailing.add("grpc-status-details-bin", status.SerializeToString())
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), trailing, details)


def _target(stub: _Stub):
    from gateway.generation import Target

    return Target(_Upstream(stub), None, ())


def _put(stub: _Stub, stored: Stored) -> None:
    import asyncio

    asyncio.run(ResponseStore().put(stored, _target(stub)))


def _open(stub: _Stub, body: dict, prior=None):
    import asyncio

    from gateway.apis.responses import route as responses_route

    rr = orr.parse({"model": "m", **body})
    parsed = rr.chat(prior.conversation if prior else [])
    store = ResponseStore()

    async def main():
        run = await responses_route._open(_target(stub), store, rr, parsed, prior, "resp_1")
        await asyncio.sleep(0)  # let a close started in the background run
        return run

    return asyncio.run(main())


def test_a_first_stored_response_is_a_plain_generate_that_keeps_its_prefix():
    stub = _Stub()
    run = _open(stub, {"input": "Hi"})
    assert stub.calls == ["Generate 1"]  # no session opened: nothing charged once it ends
    assert run.session_id == "" and run.session_note["kept"] is False
    assert run.session_note["prefix_kept_s"] == ResponseStore().ttl_s
    assert stub.opened[-1].keep_prefix_s == ResponseStore().ttl_s
    plain = _Stub()
    _open(plain, {"input": "Hi", "store": False})
    assert plain.opened[-1].keep_prefix_s == 0
    assert not stub.opened[-1].continues_kept_answer


def test_a_worker_without_sessions_answers_as_store_false_and_says_why():
    import grpc

    stub = _Stub(open_session_error=_rpc_error(grpc.StatusCode.INVALID_ARGUMENT,
                                               details="sessions keep K/V as arena rows"))
    prior = Stored("r1", "m", None, "", [{"role": "user", "content": "Hi"},
                                         {"role": "assistant", "content": "Hello"}], {})
    _put(stub, prior)
    run = _open(stub, {"input": "And?"}, prior)  # the follow-up would open the session
    assert stub.calls == ["OpenSession", "Generate 3"]
    assert stub.opened[-1].continues_kept_answer  # it may read the first's kept answer
    assert run.session_id == "" and run.session_note == {
        "kept": False, "reason": "sessions keep K/V as arena rows"}


def test_a_follow_up_of_the_head_sends_only_its_input_with_the_sessions_call_ids():
    from gateway.apis.responses.route import call_prefix

    history = [{"role": "user", "content": "Weather?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": call_prefix("s1") + "1_0", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}]}]
    prior = Stored("r1", "m", None, "", history, {}, "s1", 1)
    stub = _Stub()
    _put(stub, prior)
    run = _open(stub, {"input": [{"type": "function_call_output",
                                  "call_id": call_prefix("s1") + "1_0", "output": "sunny"}]},
                prior)
    assert stub.calls == ["SessionTurn s1 1"]
    assert (run.session_id, run.turn, run.new_session) == ("s1", 2, False)


def test_a_follow_up_whose_session_expired_opens_a_new_one_with_the_whole_conversation():
    import grpc

    prior = Stored("r1", "m", None, "", [{"role": "user", "content": "A"},
                                         {"role": "assistant", "content": "B"}], {}, "s1", 1)

    class Expired(_Stub):
        def SessionTurn(self, request, **kw):  # noqa: N802
            error = (_rpc_error(grpc.StatusCode.NOT_FOUND, "SESSION_NOT_FOUND")
                     if request.session_id == "s1" else None)
            self._turn_error = error
            return super().SessionTurn(request, **kw)

    stub = Expired()
    _put(stub, prior)
    run = _open(stub, {"input": "C"}, prior)
    assert stub.calls[:3] == ["SessionTurn s1 1", "OpenSession", "SessionTurn s-new 3"]
    assert (run.session_id, run.turn, run.new_session) == ("s-new", 1, True)
    assert stub.stored.store.claim("r1") == ""  # s1 is no session's to continue any more
