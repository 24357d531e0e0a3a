"""End to end through the gateway with the real openai client, on the tiny model: the
server's default ceiling for a request that sets none, and the request keys vLLM users
send through extra_body."""

from __future__ import annotations

import pytest

from devtools.cluster import LocalCluster, model_cache, stop_service
from tests.e2e.test_gateway_e2e import openai_client, start_gateway, wait_reserved_zero

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

MODEL = "tiny-llama"
DEFAULT = 24  # --default-max-new-tokens for the tiny model
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model_dir = model_cache() / "models" / MODEL
    if not (model_dir / "genai_config.json").exists():
        pytest.fail(f"the tiny model is not prepared at {model_dir}: run `make tiny-model`")
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=["16MiB"],
                           scheduler_args=["--default-max-new-tokens", "1000",
                                           "--default-max-new-tokens", f"{MODEL}={DEFAULT}"],
                           log_dir=tmp_path_factory.mktemp("logs-vllm-keys")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(tiny, tmp_path_factory):
    service = start_gateway(tmp_path_factory, tiny.address)
    yield service
    stop_service(service)


def test_a_chat_without_max_tokens_reserves_the_model_default_and_says_so(tiny, gateway):
    # min_tokens keeps the random model from ending early: it runs to the ceiling.
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, temperature=0, extra_body={"min_tokens": DEFAULT})
    answer = raw.parse()
    assert raw.headers["x-ortserve-max-tokens"] == f"max_tokens={DEFAULT}, source=server_default"
    extension = answer.model_extra["ortserve"]
    assert extension["max_new_tokens"] == DEFAULT
    assert extension["max_new_tokens_source"] == "server_default"
    assert answer.usage.completion_tokens == DEFAULT and answer.choices[0].finish_reason == "length"
    assert wait_reserved_zero(tiny.address) == 0


def test_a_chat_that_sets_max_tokens_is_unchanged_by_the_default(gateway):
    raw = openai_client(gateway).chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, temperature=0, max_tokens=40,
        extra_body={"min_tokens": 40})
    assert raw.headers["x-ortserve-max-tokens"] == "max_tokens=40, source=request"
    assert raw.parse().usage.completion_tokens == 40


def test_a_streamed_chat_says_the_default_in_its_first_chunk(gateway):
    stream = openai_client(gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, stream=True)
    first = next(iter(stream))
    assert first.model_extra["ortserve"]["max_new_tokens_source"] == "server_default"
    assert first.model_extra["ortserve"]["max_new_tokens"] == DEFAULT
    stream.close()
