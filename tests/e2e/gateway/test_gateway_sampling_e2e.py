"""End to end with the real openai client: logprobs, n choices, penalties, greedy no-ops,
/tokenize and /detokenize, and OpenAI's error body for unknown routes."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import openai
import pytest
from ortserve_client import Client

from devtools.cluster import stop_service
from tests.e2e.conftest import reserved_bytes
from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway, wait_reserved_zero

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

MODEL = "smollm2-135m-instruct-fp32"
FRANCE = "What is the capital of France? Answer in one sentence."
MESSAGES = [{"role": "user", "content": FRANCE}]


@pytest.fixture(scope="module")
def gateway(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address)
    yield service
    stop_service(service)


def test_chat_logprobs_give_five_alternatives_and_the_greedy_token_first(roomy, gateway):
    with Client(roomy.address, timeout_s=120) as client:
        direct = client.generate(chat=[("user", FRANCE)], max_new_tokens=10)
    answer = openai_client(gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True,
        top_logprobs=5)
    content = answer.choices[0].logprobs.content
    assert len(content) == len(direct.token_ids)
    for token in content:
        assert len(token.top_logprobs) == 5
        assert token.top_logprobs[0].token == token.token  # greedy: the chosen is the argmax
        assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)
        assert sum(math.exp(t.logprob) for t in token.top_logprobs) <= 1 + 1e-6
    joined = bytes(b for token in content for b in token.bytes).decode("utf-8", "replace")
    assert joined.startswith(answer.choices[0].message.content)

    streamed = list(openai_client(gateway).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=10, temperature=0, logprobs=True,
        top_logprobs=5, stream=True))
    tokens = [t.token for c in streamed if c.choices and c.choices[0].logprobs
              for t in c.choices[0].logprobs.content]
    assert tokens == [t.token for t in content]
    assert wait_reserved_zero(roomy.address) == 0


def test_completion_logprobs_use_the_legacy_shape(gateway):
    client = openai_client(gateway)
    args = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 5,
            "temperature": 0, "logprobs": 3, "extra_body": {"min_tokens": 5}}
    whole = client.completions.create(**args)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(len(alts) >= 3 for alts in lp.top_logprobs)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    streamed = [t for c in client.completions.create(**args, stream=True)
                if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == lp.tokens


def test_n_three_with_a_seed_gives_three_reproducible_choices(roomy, gateway):
    client = openai_client(gateway)
    args = {"model": MODEL, "messages": MESSAGES, "max_tokens": 12, "temperature": 1.0,
            "seed": 11, "n": 3}
    first = client.chat.completions.create(**args)
    second = client.chat.completions.create(**args)
    assert [c.index for c in first.choices] == [0, 1, 2]
    texts = [c.message.content for c in first.choices]
    assert texts == [c.message.content for c in second.choices]
    seeds = [c["finished"]["sampling"]["seed"] for c in first.model_extra["ortserve"]["choices"]]
    assert seeds == [11, 12, 13]
    assert first.usage.completion_tokens >= 3  # every choice's tokens, summed

    chunks = list(client.chat.completions.create(**args, stream=True))
    streamed = ["".join(c.choices[0].delta.content or "" for c in chunks
                        if c.choices and c.choices[0].index == i) for i in range(3)]
    assert streamed == texts
    finishes = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finishes) == [0, 1, 2]
    assert wait_reserved_zero(roomy.address) == 0


def test_bad_n_and_top_logprobs_are_400s_naming_the_field_and_nothing_is_reserved(roomy, gateway):
    client = openai_client(gateway, max_retries=0)
    for kw, param in (({"n": 0}, "n"), ({"n": 17}, "n"),
                      ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                      ({"presence_penalty": 2.5}, "presence_penalty"),
                      ({"logit_bias": {"999999": 1}}, "logit_bias")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, **kw)
        assert err.value.param == param, kw
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="x", max_tokens=4, logprobs=21)
    assert err.value.param == "logprobs"
    assert reserved_bytes(roomy.address) == 0


def test_penalties_and_logit_bias_change_the_greedy_answer(gateway):
    client = openai_client(gateway)
    base = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8,
                                          temperature=0, logprobs=True)
    first = base.choices[0].logprobs.content[0].token
    tok = _tokenize(gateway, first)
    banned = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, logprobs=True,
        logit_bias={str(tok): -100}, presence_penalty=1.0, frequency_penalty=0.5)
    assert banned.choices[0].logprobs.content[0].token != first
    sampling = banned.model_extra["ortserve"]["finished"]["sampling"]
    assert sampling["presence_penalty"] == 1.0 and sampling["logit_bias"] == {str(tok): -100.0}


def test_greedy_no_ops_and_labels_are_accepted_and_reported(gateway):
    answer = openai_client(gateway).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": FRANCE, "name": "ann"}], max_tokens=4,
        temperature=0, seed=5, top_p=0.5, store=False, metadata={"k": "v"}, user="u",
        service_tier="auto", extra_body={"top_k": 3})
    resolved = answer.model_extra["ortserve"]["resolved"]
    assert set(resolved) == {"seed", "top_p", "top_k"}
    assert answer.model_extra["ortserve"]["finished"]["sampling"] == {"temperature": 0.0}


def _post(gateway, path: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{gateway.address}{path}", method="POST",
                                     data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _tokenize(gateway, text: str) -> int:
    status, body = _post(gateway, "/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200 and body["count"] == 1, body
    return body["tokens"][0]


def test_unknown_routes_and_methods_are_openai_errors(gateway):
    status, body = _post(gateway, "/v1/nothing", {})
    assert status == 404 and body["error"]["type"] == "invalid_request_error"
    assert "/v1/nothing" in body["error"]["message"]
    try:
        urllib.request.urlopen(f"http://{gateway.address}/v1/chat/completions", timeout=10)
    except urllib.error.HTTPError as error:
        assert error.code == 405
        assert json.loads(error.read())["error"]["code"] == "method_not_allowed"
    else:
        pytest.fail("GET on a POST route answered 200")


def test_tokenize_and_detokenize_in_vllms_shapes_round_trip(roomy, gateway):
    status, body = _post(gateway, "/tokenize", {"model": MODEL, "prompt": FRANCE})
    assert status == 200 and body["count"] == len(body["tokens"]) > 5
    assert body["max_model_len"] == 8192
    status, back = _post(gateway, "/detokenize", {"model": MODEL, "tokens": body["tokens"]})
    assert status == 200 and back == {"prompt": FRANCE}
    # A chat prompt counts exactly as Generate admits it.
    status, chat = _post(gateway, "/tokenize", {"model": MODEL, "messages": MESSAGES})
    with Client(roomy.address, timeout_s=120) as client:
        direct = client.generate(chat=[("user", FRANCE)], max_new_tokens=1)
    assert status == 200 and chat["count"] == direct.usage.prompt_tokens
    status, err = _post(gateway, "/detokenize", {"model": MODEL, "tokens": [1, 10**7]})
    assert status == 400 and err["error"]["param"] == "tokens"
    status, err = _post(gateway, "/tokenize", {"model": MODEL, "prompt": "x", "bogus": 1})
    assert status == 400 and err["error"]["param"] == "bogus"
    status, err = _post(gateway, "/tokenize", {"model": "nope", "prompt": "x"})
    assert status == 404 and err["error"]["code"] == "model_not_found"
    assert reserved_bytes(roomy.address) == 0
