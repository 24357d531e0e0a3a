"""End to end: tools and tool_choice with the real openai client -> gateway -> scheduler ->
worker (real processes, the real SmolLM2), and the same through the gRPC stubs."""

from __future__ import annotations

import json

import grpc
import jsonschema
import openai
import pytest

from devtools.cluster import stop_service
from ortserve.output import tool_output
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import reserved_bytes, scheduler_stub
from tests.e2e.gateway.test_gateway_e2e import (
    MODEL,
    openai_client,
    start_gateway,
    wait_reserved_zero,
)
from tests.e2e.gateway.test_gateway_sampling_e2e import _post

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24},
    "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
FLIGHTS = {"type": "object", "properties": {
    "origin": {"type": "string", "maxLength": 24},
    "destination": {"type": "string", "maxLength": 24},
    "passengers": {"type": "integer", "minimum": 1, "maximum": 9}},
    "required": ["origin", "destination", "passengers"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "find_flights": FLIGHTS}
TOOLS = [{"type": "function", "function": {"name": name, "description": desc, "parameters": s}}
         for name, desc, s in (("get_weather", "The current weather in a city", WEATHER),
                               ("find_flights", "Flights between two cities", FLIGHTS))]
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address)
    yield service
    stop_service(service)


def assert_valid(calls) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


@pytest.mark.parametrize("parallel", [False, True])
def test_required_returns_a_call_whose_arguments_validate(gateway, parallel):
    client = openai_client(gateway)
    answer = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0, parallel_tool_calls=parallel)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert_valid(choice.message.tool_calls)
    if not parallel:
        assert len(choice.message.tool_calls) == 1


def test_required_streamed_sends_the_name_then_argument_fragments(gateway):
    client = openai_client(gateway)
    stream = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0.7, seed=3, stream=True, parallel_tool_calls=False)
    names, arguments, ids, finish = [], "", [], None
    for chunk in stream:
        delta = chunk.choices[0].delta
        for piece in delta.tool_calls or []:
            assert piece.index == 0
            if piece.id:
                ids.append(piece.id)
                names.append(piece.function.name)
                assert not arguments  # the name comes before any argument
            arguments += piece.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and len(ids) == 1 and ids[0].startswith("call_")
    jsonschema.validate(json.loads(arguments), SCHEMAS[names[0]])


def test_a_named_function_is_the_one_called(gateway):
    client = openai_client(gateway)
    answer = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=120, temperature=0,
        tool_choice={"type": "function", "function": {"name": "find_flights"}})
    calls = answer.choices[0].message.tool_calls
    assert [c.function.name for c in calls] == ["find_flights"]
    assert_valid(calls)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_auto_returns_text_or_a_valid_call(gateway, seed):
    client = openai_client(gateway)
    answer = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=TOOLS, max_tokens=80, temperature=1.0, seed=seed)
    choice = answer.choices[0]
    if choice.message.tool_calls:
        assert_valid(choice.message.tool_calls)
        assert choice.finish_reason in ("tool_calls", "length")
    else:
        assert choice.message.content and "<tool_call>" not in choice.message.content


def test_a_round_trip_ends_in_an_answer(gateway):
    client = openai_client(gateway)
    messages = list(ASK)
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=120,
        temperature=0, parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message)  # the SDK's own message object, sent back
    messages.append({"role": "tool", "tool_call_id": call.id,
                     "content": json.dumps({"temperature": 21, "sky": "sunny"})})
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=40,
        temperature=0)
    choice = final.choices[0]
    assert choice.message.content and not choice.message.tool_calls
    assert choice.finish_reason in ("stop", "length")
    # tool_choice "none" offers no tools, but the call and its result are in the prompt.
    status, body = _post(gateway, "/tokenize", {"model": MODEL, "messages": ASK})
    assert status == 200
    history = body["count"]
    assert final.usage.prompt_tokens > history + 20


def test_refusals_are_400s_naming_the_field_and_reserve_nothing(roomy, gateway):
    client = openai_client(gateway, max_retries=0)
    stub = scheduler_stub(roomy.address)
    before = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    bad_schema = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}}}}]
    cases = [
        ({"tools": bad_schema, "tool_choice": "required"}, "tools[0].function.parameters"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
         "tool_choice"),
        ({"functions": [{"name": "f", "parameters": WEATHER}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=ASK, max_tokens=8, **kwargs)
        assert err.value.param == param, err.value
        assert param.split("[")[0].split(".")[0] in err.value.message
    after = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert after.total_reserved_bytes == before.total_reserved_bytes == 0
    assert wait_reserved_zero(roomy.address) == 0


# -- gRPC -------------------------------------------------------------------------------


def grpc_request(**choice) -> types_pb2.GenerateRequest:
    return types_pb2.GenerateRequest(
        chat=types_pb2.ChatMessages(
            messages=[types_pb2.ChatMessage(role="user", content=ASK[0]["content"])],
            tools=[types_pb2.Tool(name=t["function"]["name"],
                                  description=t["function"]["description"],
                                  parameters_json=json.dumps(t["function"]["parameters"]))
                   for t in TOOLS]),
        max_new_tokens=120,
        constraint=types_pb2.Constraint(tool_call=types_pb2.ToolCallConstraint(**choice)))


def test_grpc_tool_call_constraint_output_parses_and_validates(roomy):
    text, finished = "", None
    for event in scheduler_stub(roomy.address).Generate(grpc_request(), timeout=300):
        if event.HasField("chunk"):
            text += event.chunk.text
        elif event.HasField("finished"):
            finished = event.finished
    assert finished.finish_reason == types_pb2.CONSTRAINT_COMPLETE
    assert finished.constraint.satisfied
    content, calls = tool_output.parse(text)
    assert content == "" and len(calls) == 1 and calls[0].complete
    jsonschema.validate(json.loads(calls[0].arguments), SCHEMAS[calls[0].name])


def test_grpc_unknown_function_is_invalid_argument_before_anything_is_reserved(roomy):
    with pytest.raises(grpc.RpcError) as err:
        list(scheduler_stub(roomy.address).Generate(grpc_request(function_name="nope"),
                                                    timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "constraint.tool_call.function_name" in err.value.details()
    assert reserved_bytes(roomy.address) == 0
