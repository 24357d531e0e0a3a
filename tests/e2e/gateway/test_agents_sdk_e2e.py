"""End to end: the OpenAI Agents SDK (openai-agents, a client no one here wrote) -> gateway ->
scheduler -> worker (real processes, the real SmolLM2), through both model classes it ships:
/v1/responses (OpenAIResponsesModel) and /v1/chat/completions (OpenAIChatCompletionsModel).

An agent without tools sends `tools: []` on the Responses API (issue 52: that was a 400);
an agent with a function tool is made to call it (tool_choice "required", which the
gateway enforces with its grammar: the small model's own choice is not a test), and the
run must end: the tool ran with the arguments its schema asks for and a final output came
back after the tool's result went to the model."""

from __future__ import annotations

import asyncio
import time

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

from devtools.cluster import stop_service
from tests.e2e.conftest import reserved_bytes
from tests.e2e.gateway.test_gateway_e2e import MODEL, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

set_tracing_disabled(True)  # the SDK's own traces go to OpenAI's platform; nothing to send there

MODELS = {"responses": OpenAIResponsesModel, "chat": OpenAIChatCompletionsModel}


@pytest.fixture(scope="module")
def gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address)
    yield service
    stop_service(service)


def model(gateway, api: str):
    client = AsyncOpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused", timeout=120,
                         max_retries=0)
    return MODELS[api](MODEL, client)


def released(cluster, api: str, before_bytes: int) -> None:
    """Chat holds nothing after its answers: the ledger is back where it was. Responses are
    stored (store: true, OpenAI's default, which the SDK leaves unset): a follow-up's
    session keeps KV, charged, until deleted or idle past the TTL (docs/gateway.md), so the
    ledger is not read for them (nor, for chat, is zero: such sessions may still hold)."""
    if api == "chat":
        deadline = time.monotonic() + 10
        while reserved_bytes(cluster.address) != before_bytes and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reserved_bytes(cluster.address) == before_bytes


@pytest.mark.parametrize("api", sorted(MODELS))
def test_an_agent_without_tools_answers(roomy, gateway, api):
    before = reserved_bytes(roomy.address)
    agent = Agent(name="plain", instructions="Answer in one sentence.", model=model(gateway, api),
                  model_settings=ModelSettings(max_tokens=16, temperature=0))

    async def whole_then_streamed():  # one event loop: the client's connections live in it
        whole = await Runner.run(agent, "What is the capital of France?")
        run = Runner.run_streamed(agent, "What is the capital of France?")
        kinds = [event.type async for event in run.stream_events()]
        return whole, run.final_output, kinds

    result, text, kinds = asyncio.run(whole_then_streamed())
    assert isinstance(result.final_output, str) and result.final_output.strip()
    assert "Paris" in result.final_output  # SmolLM2 fp32 greedy knows it (docs: MODEL_NOTES)
    assert text == result.final_output and "raw_response_event" in kinds
    released(roomy, api, before)


@pytest.mark.parametrize("api", sorted(MODELS))
def test_an_agent_with_a_function_tool_calls_it_and_finishes(roomy, gateway, api):
    before = reserved_bytes(roomy.address)
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    # The SDK resets tool_choice after a tool call (reset_tool_choice), so the turn that
    # reads the tool's result is the model's own choice: the run ends within max_turns.
    agent = Agent(name="weather", instructions="Use the tool, then answer.",
                  model=model(gateway, api), tools=[get_weather],
                  model_settings=ModelSettings(max_tokens=64, temperature=0,
                                               tool_choice="required"))
    result = asyncio.run(Runner.run(agent, "What is the weather in Paris?", max_turns=6))
    assert calls and all(isinstance(city, str) and city for city in calls), calls
    kinds = [item.type for item in result.new_items]
    # The first turn is calls (parallel_tool_calls: one or more), each answered by its output.
    assert kinds[0] == "tool_call_item", kinds
    assert kinds.count("tool_call_item") == kinds.count("tool_call_output_item") == len(calls)
    assert kinds[-1] == "message_output_item" and isinstance(result.final_output, str)
    released(roomy, api, before)
