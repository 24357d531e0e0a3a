"""End to end: constrained decoding (structured output) through the gRPC stubs, grpcurl and
the real openai client -> gateway -> scheduler -> worker, real processes, the real model."""

from __future__ import annotations

import json
import subprocess

import grpc
import jsonschema
import openai
import pydantic
import pytest

from devtools.cluster import stop_service
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import grpcurl, reserved_bytes, scheduler_stub
from tests.e2e.gateway.test_gateway_e2e import (
    MODEL,
    openai_client,
    start_gateway,
    wait_reserved_zero,
)

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "role": {"enum": ["admin", "user", "guest"]},
        "address": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 24},
            "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
    },
    "required": ["name", "age", "role", "address", "tags"],
    "additionalProperties": False,
}
PROMPTS = ["Describe a fictional person as JSON.",
           "Give me a user record for a librarian in Paris."]
FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON,
                                                 "strict": True}}


class Address(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=24)
    age: int
    address: Address
    hobbies: list[str] = pydantic.Field(max_length=3)


@pytest.fixture(scope="module")
def gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address)
    yield service
    stop_service(service)


def generate(address: str, request: types_pb2.GenerateRequest) -> tuple[str, types_pb2.Finished]:
    text, finished = "", None
    for event in scheduler_stub(address).Generate(request, timeout=300):
        if event.HasField("chunk"):
            text += event.chunk.text
        elif event.HasField("finished"):
            finished = event.finished
    assert finished is not None
    return text, finished


# -- gRPC -------------------------------------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("seed", [None, 7])
def test_grpc_json_schema_output_validates(roomy, prompt, seed):
    request = types_pb2.GenerateRequest(
        chat=types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(role="user", content=prompt)]),
        max_new_tokens=160, constraint=types_pb2.Constraint(json_schema=json.dumps(PERSON)))
    if seed is not None:
        request.sampling.temperature = 0.8
        request.sampling.seed = seed
    text, finished = generate(roomy.address, request)
    assert finished.finish_reason == types_pb2.CONSTRAINT_COMPLETE, text
    assert finished.HasField("constraint") and finished.constraint.satisfied
    jsonschema.validate(json.loads(text), PERSON)
    if seed is not None:  # the same seed, the same output
        assert generate(roomy.address, request)[0] == text


def test_grpc_ceiling_before_completion_is_reported_unsatisfied(roomy):
    request = types_pb2.GenerateRequest(
        text="A person:", max_new_tokens=4,
        constraint=types_pb2.Constraint(json_schema=json.dumps(PERSON)))
    _, finished = generate(roomy.address, request)
    assert finished.finish_reason == types_pb2.LENGTH
    assert not finished.constraint.satisfied and "max_new_tokens (4)" in finished.constraint.reason


@pytest.mark.parametrize("constraint,field", [
    (types_pb2.Constraint(json_schema='{"type": "object", "properties": {"a": {"type": "nope"}}}'),
     "constraint.json_schema"),
    (types_pb2.Constraint(regex="(unclosed"), "constraint.regex"),
    (types_pb2.Constraint(grammar="start: nowhere"), "constraint.grammar"),
])
def test_grpc_uncompilable_constraint_is_invalid_argument_and_the_ledger_never_moves(
        roomy, constraint, field):
    stub = scheduler_stub(roomy.address)
    before = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    request = types_pb2.GenerateRequest(text="hello", max_new_tokens=8, constraint=constraint)
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(request, timeout=60))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details() and "llguidance" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.Admit(scheduler_pb2.AdmitRequest(request=request), timeout=60)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "request." + field in err.value.details()
    after = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert after.total_reserved_bytes == before.total_reserved_bytes == 0
    assert [w.reserved_bytes for w in after.workers] == [w.reserved_bytes for w in before.workers]


def test_grpcurl_regex_constraint_as_in_the_docs(roomy):
    body = json.dumps({"text": "Is the sky blue? Answer:", "max_new_tokens": 16,
                       "constraint": {"regex": "(yes|no)\\."}})
    result = subprocess.run([grpcurl(), "-plaintext", "-d", body, roomy.address,
                             "ortserve.v1.Scheduler/Generate"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert '"finish_reason": "CONSTRAINT_COMPLETE"' in result.stdout
    assert '"satisfied": true' in result.stdout


# -- the gateway, with the real openai client ------------------------------------------------


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("seed", [None, 3])
def test_openai_response_format_json_schema_validates(gateway, prompt, seed):
    client = openai_client(gateway)
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=160,
        temperature=0 if seed is None else 0.8, seed=seed, response_format=FORMAT)
    choice = answer.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), PERSON)
    assert answer.model_extra["ortserve"]["finished"]["constraint"] == {"satisfied": True,
                                                                        "reason": ""}


def test_openai_streamed_response_format_validates(gateway):
    stream = openai_client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=160,
        temperature=0, response_format=FORMAT, stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)


def test_openai_json_object_is_one_json_object(gateway):
    answer = openai_client(gateway).chat.completions.create(
        model=MODEL, max_tokens=120, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Reply with the JSON {"ok": true} and nothing else.'}])
    choice = answer.choices[0]
    constraint = answer.model_extra["ortserve"]["finished"]["constraint"]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content), dict) and constraint["satisfied"]
    else:  # a small model may ramble past max_tokens: then it says so
        assert choice.finish_reason == "length" and not constraint["satisfied"]


def test_openai_parse_helper_with_a_pydantic_model(gateway):
    client = openai_client(gateway)
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    messages = [{"role": "user", "content": "Describe a fictional person with two hobbies."}]
    answer = parse(model=MODEL, messages=messages, max_tokens=200, temperature=0,
                   response_format=Person)
    person = answer.choices[0].message.parsed
    assert isinstance(person, Person) and isinstance(person.address, Address)
    with client.beta.chat.completions.stream(model=MODEL, messages=messages, max_tokens=200,
                                             temperature=0, response_format=Person) as stream:
        streamed = stream.get_final_completion().choices[0].message.parsed
    assert streamed == person


def test_openai_uncompilable_schema_is_a_400_naming_it_and_the_ledger_never_moves(roomy, gateway):
    bad = {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "nope"}}}
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(gateway, max_retries=0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=8,
            response_format=bad)
    body = err.value.body
    assert body["param"] == "response_format.json_schema.schema"
    # the message names the caller's field, not the internal proto path (constraint.json_schema)
    assert body["message"].startswith("response_format.json_schema.schema: ")
    assert "constraint.json_schema" not in body["message"] and "Invalid type" in body["message"]
    assert wait_reserved_zero(roomy.address) == 0 and reserved_bytes(roomy.address) == 0
