"""End to end through the gateway with the real openai client, on the tiny model: the
server's default ceiling for a request that sets none, and the request keys vLLM users
send through extra_body."""

from __future__ import annotations

import json
import re

import openai
import pytest
from ortserve_client import Client

from devtools.cluster import LocalCluster, model_cache, stop_service
from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway, wait_reserved_zero

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


# -- vLLM's extra_body keys ---------------------------------------------------------------

EOS = 2  # the tiny model's end-of-sequence token (its genai_config.json)
# A schema whose every output is short, so the random model completes it.
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


def create(gateway, **kw):
    return openai_client(gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, temperature=0, **kw)


@pytest.mark.parametrize("extra, check", [
    ({"guided_choice": ["alpha", "beta", "gamma"]}, lambda t: t in ("alpha", "beta", "gamma")),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, lambda t: t in ("yes", "no")),
    ({"guided_regex": "[0-9]{3}-[a-z]{2}"}, lambda t: re.fullmatch("[0-9]{3}-[a-z]{2}", t)),
    ({"structured_outputs": {"regex": "(ab)+c"}}, lambda t: re.fullmatch("(ab)+c", t)),
    ({"guided_grammar": 'start: "x" n "y"\nn: /[0-9]/'}, lambda t: re.fullmatch("x[0-9]y", t)),
    ({"guided_json": SCHEMA}, lambda t: isinstance(json.loads(t)["ok"], bool)),
    ({"structured_outputs": {"json": json.dumps(SCHEMA)}},
     lambda t: isinstance(json.loads(t)["ok"], bool)),
])
def test_structured_output_through_extra_body(gateway, extra, check):
    answer = create(gateway, max_tokens=60, extra_body=extra)
    text = answer.choices[0].message.content
    assert check(text), text
    assert answer.choices[0].finish_reason == "stop"
    assert answer.model_extra["ortserve"]["finished"]["constraint"]["satisfied"]


def test_structured_outputs_json_object_constrains_to_an_object(gateway):
    # Any object: the random model may not close it within max_tokens, and then says so.
    answer = create(gateway, max_tokens=12, extra_body={"structured_outputs": {"json_object": True}})
    assert answer.choices[0].message.content.startswith("{")
    constraint = answer.model_extra["ortserve"]["finished"]["constraint"]
    assert constraint["satisfied"] == (answer.choices[0].finish_reason == "stop")


def test_guided_choice_streams_one_of_the_choices(gateway):
    stream = create(gateway, max_tokens=20, stream=True,
                    extra_body={"guided_choice": ["left", "right"]})
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) in ("left", "right")


def test_ignore_eos_runs_past_an_end_of_sequence_token(gateway):
    forced = {str(EOS): 100}  # the random model picks EOS first
    ended = create(gateway, max_tokens=6, logit_bias=forced)
    assert ended.choices[0].finish_reason == "stop" and ended.usage.completion_tokens == 1
    ignored = create(gateway, max_tokens=6, logit_bias=forced, extra_body={"ignore_eos": True})
    assert ignored.choices[0].finish_reason == "length" and ignored.usage.completion_tokens == 6


def free_run(tiny) -> list[int]:
    with Client(tiny.address, timeout_s=120) as client:
        return list(client.generate(chat=[("user", MESSAGES[0]["content"])], max_new_tokens=8,
                                    min_new_tokens=8).token_ids)


def test_stop_token_ids_end_the_output_at_that_token(tiny, gateway):
    ids = free_run(tiny)
    stop_id = ids[3]
    answer = create(gateway, max_tokens=8, extra_body={"stop_token_ids": [stop_id]})
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens == ids.index(stop_id) + 1
    assert answer.model_extra["ortserve"]["finished"]["stop_token_id"] == stop_id
    assert answer.model_extra["ortserve"]["finished"]["finish_reason"] == "STOP_TOKEN"


def test_include_stop_str_in_output_keeps_the_stop_sequence(gateway):
    free = create(gateway, max_tokens=8, extra_body={"min_tokens": 8}).choices[0].message.content
    stop = free[len(free) // 2:len(free) // 2 + 2]
    assert stop
    without = create(gateway, max_tokens=8, stop=[stop]).choices[0].message.content
    kept = create(gateway, max_tokens=8, stop=[stop],
                  extra_body={"include_stop_str_in_output": True}).choices[0].message.content
    assert kept == without + stop and kept.endswith(stop) and free.startswith(kept)
    streamed = create(gateway, max_tokens=8, stop=[stop], stream=True,
                      extra_body={"include_stop_str_in_output": True})
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == kept


def test_continuous_usage_stats_put_usage_on_every_chunk(gateway):
    stream = create(gateway, max_tokens=6, stream=True, extra_body={"min_tokens": 6},
                    stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = list(stream)
    with_choices = [c for c in chunks if c.choices]
    counts = [c.usage.completion_tokens for c in with_choices]
    assert all(c.usage is not None for c in with_choices)
    assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 6
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices
    assert {c.usage.prompt_tokens for c in chunks} == {chunks[-1].usage.prompt_tokens}


@pytest.mark.parametrize("extra, param", [({"skip_special_tokens": False}, "skip_special_tokens"),
                                          ({"priority": 2**31}, "priority"),
                                          ({"guided_regex": "("}, "guided_regex")])
def test_what_ortserve_cannot_honour_is_a_400_naming_the_key(gateway, extra, param):
    with pytest.raises(openai.BadRequestError) as info:
        create(gateway, max_tokens=4, extra_body=extra)
    assert info.value.body["param"] == param


def test_their_no_op_values_and_a_priority_are_accepted(gateway):
    answer = create(gateway, max_tokens=3, extra_body={"skip_special_tokens": True, "priority": 3})
    assert answer.usage.completion_tokens >= 1


def test_reasoning_effort_is_refused_where_the_template_does_not_take_it(gateway):
    # The tiny model's template (SmolLM2's) reads no reasoning_effort: it would change nothing.
    with pytest.raises(openai.BadRequestError) as info:
        create(gateway, max_tokens=3, reasoning_effort="low")
    assert info.value.body["param"] == "reasoning_effort"
    assert "does not read 'reasoning_effort'" in info.value.body["message"]


def test_a_model_without_reasoning_tags_answers_in_content_alone(gateway):
    answer = create(gateway, max_tokens=4)
    assert answer.choices[0].message.model_extra.get("reasoning_content") is None
    assert answer.usage.completion_tokens_details is None
