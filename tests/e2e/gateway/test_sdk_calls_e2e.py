"""What the openai and anthropic SDKs call that a user meets on day one, end to end through
real processes and the real SmolLM2: each call either answers as the SDK expects or fails
with a status and a message naming the cause and the next step (docs/gateway.md)."""

from __future__ import annotations

import asyncio
import json

import anthropic
import openai
import pytest
from agents import (
    Agent,
    MaxTurnsExceeded,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from pydantic import BaseModel

from devtools.cluster import stop_service
from tests.e2e.gateway.test_gateway_e2e import MODEL, openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

set_tracing_disabled(True)  # the SDK's own traces go to OpenAI's platform; nothing to send there


@pytest.fixture(scope="module")
def gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address)
    yield service
    stop_service(service)


def anthropic_client(gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"http://{gateway.address}", api_key="unused",
                               timeout=120, max_retries=0)


def test_models_retrieve_answers_the_listed_model_object(gateway):
    client = openai_client(gateway, max_retries=0)
    listed = {m.id: m for m in client.models.list().data}
    model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.object == "model"
    assert model.model_dump() == listed[MODEL].model_dump()
    # Anthropic's SDK retrieves a model on the same path.
    assert anthropic_client(gateway).models.retrieve(MODEL).id == MODEL


def test_models_retrieve_of_an_unknown_model_is_a_404_naming_the_served_ones(gateway):
    with pytest.raises(openai.NotFoundError) as raised:
        openai_client(gateway, max_retries=0).models.retrieve("org/gpt-unknown")
    error = raised.value.body
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert "'org/gpt-unknown' is not served here" in error["message"]
    assert repr(MODEL) in error["message"]


def test_openais_replacements_for_user_are_accepted_by_the_sdk_as_labels(gateway):
    # OpenAI deprecates `user` for safety_identifier and prompt_cache_key; Codex sends
    # prompt_cache_key on every Responses call. Both were a 400 "not supported".
    client = openai_client(gateway, max_retries=0)
    labels = {"safety_identifier": "user-7f3a", "prompt_cache_key": "conversation-1"}
    answer = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=2,
                                     store=False, **labels)
    assert answer.usage.output_tokens >= 1
    chat = client.chat.completions.create(model=MODEL, max_tokens=2, **labels,
                                          messages=[{"role": "user", "content": "Say hi."}])
    assert chat.usage.completion_tokens >= 1


def test_responses_input_items_list_pages_the_stored_responses_own_input(gateway):
    client = openai_client(gateway, max_retries=0)
    first = client.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=2)
    follow = client.responses.create(model=MODEL, previous_response_id=first.id,
                                     max_output_tokens=2, input=[
                                         {"role": "developer", "content": "Be brief."},
                                         {"role": "user", "content": "What is my name?"}])
    [own] = client.responses.input_items.list(first.id).data
    assert own.type == "message" and own.role == "user"
    assert own.content[0].text == "My name is Ada."
    # Newest first, as OpenAI lists them; only this response's input, not the first's.
    listed = client.responses.input_items.list(follow.id)
    assert [item.content[0].text for item in listed.data] == ["What is my name?", "Be brief."]
    assert [item.content[0].text for item in client.responses.input_items.list(
        follow.id, order="asc", limit=1).data] == ["Be brief."]
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_never_stored")
    for response_id in (first.id, follow.id):
        client.responses.delete(response_id)  # their session is closed: the ledger drains


def test_responses_cancel_says_why_a_stored_response_cannot_be_cancelled(gateway):
    client = openai_client(gateway, max_retries=0)
    answer = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.cancel(answer.id)
    error = raised.value.body
    assert error["code"] == "not_background", error  # was a 404 "Invalid URL"
    assert "background: true" in error["message"] and "close its request" in error["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_never_stored")
    client.responses.delete(answer.id)


class City(BaseModel):
    city: str
    country: str


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_an_agent_with_a_tool_and_an_output_type_ends_with_that_type(gateway, api):
    # The Agents SDK sends the tools and the output type's schema together (response_format
    # / text.format): both APIs answered 400 "cannot be combined with tools". Under
    # tool_choice auto the model calls the tool or answers in the schema, as OpenAI's do.
    @function_tool
    def lookup(city: str) -> str:
        """Where a city is."""
        return f"{city} is in France"

    client = AsyncOpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused",
                         max_retries=0)
    model = (OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel)(
        MODEL, client)
    agent = Agent(name="cities", instructions="Use lookup if you need it, then answer.",
                  tools=[lookup], output_type=City, model=model,
                  model_settings=ModelSettings(max_tokens=120, temperature=0))
    try:
        result = asyncio.run(Runner.run(agent, "What is the capital of France?", max_turns=3))
    except MaxTurnsExceeded:
        return  # SmolLM2 may call the tool again each turn: every turn was served (no 400)
    assert isinstance(result.final_output, City) and result.final_output.city


def test_chat_with_tools_and_a_json_schema_answers_calls_or_that_json(gateway):
    schema = {"type": "object", "properties": {"city": {"type": "string"}},
              "required": ["city"], "additionalProperties": False}
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}, "required": ["city"]}}}]
    for question in ("What is the capital of France?", "What is the weather in Paris?"):
        answer = openai_client(gateway, max_retries=0).chat.completions.create(
            model=MODEL, max_tokens=120, temperature=0, tools=tools,
            messages=[{"role": "user", "content": question}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "c", "schema": schema}})
        message = answer.choices[0].message
        if message.tool_calls:
            assert answer.choices[0].finish_reason == "tool_calls" and not message.content
        else:
            assert answer.choices[0].finish_reason == "stop"
            assert set(json.loads(message.content)) == {"city"}
    with pytest.raises(openai.BadRequestError) as raised:  # calls only: no answer to shape
        openai_client(gateway, max_retries=0).chat.completions.create(
            model=MODEL, max_tokens=8, tools=tools, tool_choice="required",
            messages=[{"role": "user", "content": "Hi"}],
            response_format={"type": "json_object"})
    assert raised.value.body["param"] == "response_format"
