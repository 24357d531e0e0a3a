"""End to end: the real openai client -> ortserve-gateway -> scheduler -> worker, real processes."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import openai
import pytest
from ortserve_client import Client

from devtools.cluster import start_service, stop_service
from tests.e2e.conftest import BIN, reserved_bytes, start_cluster

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BPT = 46_080  # SmolLM2-135M fp32 KV bytes per token
MODEL = "smollm2-135m-instruct-fp32"
FRANCE = "What is the capital of France? Answer in one sentence."
ESSAY = "Write a long, detailed essay about the history of the Roman Empire."
TIGHT_BUDGET_TOKENS = 128  # a chat prompt of ~40 tokens leaves room for ~90: capped


def start_gateway(tmp_path_factory, scheduler_address: str, args: tuple[str, ...] = ()):
    log_dir = tmp_path_factory.mktemp("logs-gateway")
    service = start_service("gateway", [str(BIN / "ortserve-gateway"), "--port", "0",
                                        "--scheduler", scheduler_address, *args], log_dir)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # bound and announced; wait until uvicorn accepts
        try:
            with urllib.request.urlopen(f"http://{service.address}/health", timeout=2):
                return service
        except (urllib.error.URLError, ConnectionError):
            pass
        time.sleep(0.1)
    stop_service(service)
    pytest.fail(f"the gateway never answered /health; see {service.log_path}:\n{service.log_tail()}")


def openai_client(gateway, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused", timeout=120, **kw)


def wait_reserved_zero(address: str, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while (held := reserved_bytes(address)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return held


@pytest.fixture(scope="module")
def roomy_gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address)
    yield service
    stop_service(service)


@pytest.fixture(scope="module")
def tight(tmp_path_factory):
    """A worker whose budget holds one short chat and its answer, capped."""
    cluster = start_cluster(tmp_path_factory, "tight", kv_capacities=[str(TIGHT_BUDGET_TOKENS * BPT)])
    service = start_gateway(tmp_path_factory, cluster.address)
    yield cluster, service
    stop_service(service)
    cluster.stop()


def test_models_lists_the_workers_model(roomy_gateway):
    ids = [m.id for m in openai_client(roomy_gateway).models.list().data]
    assert ids == [MODEL]


def test_streamed_chat_concatenates_to_the_grpc_text_and_usage(roomy, roomy_gateway):
    with Client(roomy.address, timeout_s=120) as client:
        direct = client.generate(chat=[("user", FRANCE)], max_new_tokens=24)
    stream = openai_client(roomy_gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": FRANCE}], max_tokens=24,
        temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert direct.text and text == direct.text
    assert chunks[0].model_extra["ortserve"]["decision"] == "ADMITTED"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [{"EOS": "stop", "LENGTH": "length"}[direct.finish_reason]]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.prompt_tokens == direct.usage.prompt_tokens
    assert chunks[-1].usage.completion_tokens == direct.usage.generated_tokens

    raw = openai_client(roomy_gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": FRANCE}], max_tokens=24, temperature=0)
    whole = raw.parse()
    assert raw.headers["x-ortserve-decision"] == "ADMITTED" and "x-ortserve-budget-cap" not in raw.headers
    assert whole.choices[0].message.content == direct.text
    assert whole.usage.total_tokens == direct.usage.prompt_tokens + direct.usage.generated_tokens
    # The worker releases once its KV is freed, just after the last event: wait for it.
    assert wait_reserved_zero(roomy.address) == 0


def test_completions_with_min_tokens_stream_and_not(roomy_gateway):
    # NOTE: on a plain-text prompt the chat model often emits EOS at once;
    # min_tokens (through extra_body) makes it generate exactly max_tokens.
    client = openai_client(roomy_gateway)
    args = {"model": MODEL, "prompt": "The Roman Empire", "max_tokens": 6, "temperature": 0,
            "extra_body": {"min_tokens": 6}}
    whole = client.completions.create(**args)
    assert whole.usage.completion_tokens == 6 and whole.choices[0].finish_reason == "length"
    assert whole.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(**args, stream=True))
    assert streamed == whole.choices[0].text


def test_unsupported_and_conflicting_parameters_are_400_naming_them(roomy_gateway):
    client = openai_client(roomy_gateway, max_retries=0)
    messages = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=messages, n=0)
    assert err.value.param == "n" and err.value.code == "invalid_parameter"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=messages,
                                       functions=[{"name": "f"}])  # deprecated: use tools
    assert err.value.param == "functions" and err.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as err:  # the scheduler's check, renamed for HTTP
        client.chat.completions.create(model=MODEL, messages=messages, logprobs=True,
                                       top_logprobs=21)
    assert err.value.param == "top_logprobs"
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=messages)
    assert err.value.code == "model_not_found"


def test_an_over_long_prompt_is_400_context_length_exceeded(roomy_gateway):
    with pytest.raises(openai.BadRequestError) as err:
        openai_client(roomy_gateway, max_retries=0).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hello " * 9000}], max_tokens=5)
    assert err.value.code == "context_length_exceeded" and err.value.param == "messages"
    assert "8,192" in err.value.message
    assert err.value.body["ortserve"]["metadata"]["context_length"] == "8192"


def test_closing_the_stream_mid_way_frees_the_lease(roomy, roomy_gateway):
    stream = openai_client(roomy_gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ESSAY}], max_tokens=2000,
        temperature=0, extra_body={"min_tokens": 2000}, stream=True)
    for i, _chunk in enumerate(stream):
        if i == 3:
            break
    # 2,000 tokens take minutes here: a zero within seconds is the cancel, not the end.
    assert reserved_bytes(roomy.address) > 0
    stream.close()
    assert wait_reserved_zero(roomy.address) == 0


def test_a_non_streaming_client_that_gives_up_frees_the_lease(roomy, roomy_gateway):
    client = openai.OpenAI(base_url=f"http://{roomy_gateway.address}/v1", api_key="unused",
                           timeout=1.5, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": ESSAY}], max_tokens=2000,
            temperature=0, extra_body={"min_tokens": 2000})
    # The handler watches for the disconnect; without it the lease is held for minutes.
    assert wait_reserved_zero(roomy.address) == 0


def test_a_capped_request_shows_the_cap_in_headers_and_body_and_ends_length(tight):
    cluster, gateway = tight
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": ESSAY}], temperature=0,
        extra_body={"min_tokens": 16})
    body = raw.parse()
    cap = body.model_extra["ortserve"]["budget_cap"]
    assert raw.headers["x-ortserve-decision"] == "CAPPED"
    assert raw.headers["x-ortserve-budget-cap"] == (
        f"requested_max_tokens={cap['requested_max_new_tokens']}, "
        f"admitted_max_tokens={cap['admitted_max_new_tokens']}, "
        f"requested_bytes={cap['requested_bytes']}, admitted_bytes={cap['admitted_bytes']}")
    assert cap["requested_was_unset"] and cap["capacity_bytes"] == TIGHT_BUDGET_TOKENS * BPT
    assert cap["admitted_max_new_tokens"] < cap["requested_max_new_tokens"]
    assert body.choices[0].finish_reason == "length"
    assert body.usage.completion_tokens == cap["admitted_max_new_tokens"]
    assert wait_reserved_zero(cluster.address) == 0


def test_a_streamed_cap_is_in_the_first_chunk_and_a_busy_budget_is_429(tight):
    cluster, gateway = tight
    messages = [{"role": "user", "content": ESSAY}]
    with openai_client(gateway).chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, temperature=0, stream=True,
            extra_body={"min_tokens": 16}) as response:
        assert response.headers["x-ortserve-decision"] == "CAPPED"
        chunks = iter(response.parse())
        first = next(chunks)
        cap = first.model_extra["ortserve"]["budget_cap"]
        assert f"admitted_max_tokens={cap['admitted_max_new_tokens']}," in \
            response.headers["x-ortserve-budget-cap"]
        # The capped stream holds the whole budget: a second request that will not wait
        # in the admission queue is told to come back.
        with pytest.raises(openai.RateLimitError) as err:
            openai_client(gateway, max_retries=0).chat.completions.create(
                model=MODEL, messages=messages, max_tokens=8,
                extra_body={"max_queue_wait_ms": 0})
        assert int(err.value.response.headers["retry-after"]) >= 1
        assert err.value.code == "budget_busy"
        rest = list(chunks)
    assert [c.choices[0].finish_reason for c in rest][-1] == "length"
    assert wait_reserved_zero(cluster.address) == 0
