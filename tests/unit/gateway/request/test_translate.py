"""The gateway's OpenAI -> GenerateRequest mapping, with no server."""

from __future__ import annotations

import json

import pytest

from gateway.request.translate import OPENAI_DEFAULT_TEMPERATURE, ParamError, parse_request
from ortserve.v1 import types_pb2

MODEL = "smollm2-135m-instruct-fp32"


def chat(**kw):
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], **kw}


def test_chat_messages_become_chat_turns_with_developer_as_system():
    parsed = parse_request("chat", chat(messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]},
        {"role": "assistant", "content": "Hi"}]))
    turns = [(m.role, m.content) for m in parsed.generate.chat.messages]
    assert turns == [("system", "Be brief."), ("user", "Hello"), ("assistant", "Hi")]
    assert parsed.model == MODEL and parsed.kind == "chat" and not parsed.stream
    assert parsed.generate.model == MODEL  # passed through: the scheduler resolves and places it


def test_sampling_parameters_are_carried_exactly():
    req = parse_request("chat", chat(temperature=0.7, top_p=0.9, seed=2**63, stop="\n",
                                     max_tokens=12, min_tokens=3, top_k=40,
                                     repetition_penalty=1.1)).generate
    assert req.sampling.temperature == pytest.approx(0.7)
    assert req.sampling.top_p == pytest.approx(0.9)
    assert req.sampling.seed == 2**63 and req.sampling.top_k == 40
    assert req.sampling.repetition_penalty == pytest.approx(1.1)
    assert list(req.stop) == ["\n"] and req.max_new_tokens == 12 and req.min_new_tokens == 3


def test_omitted_temperature_is_openai_default_and_top_p_one_is_unset():
    req = parse_request("chat", chat(top_p=1)).generate
    assert req.sampling.temperature == OPENAI_DEFAULT_TEMPERATURE
    assert not req.sampling.HasField("top_p")


def test_unset_max_tokens_stays_unset_so_the_scheduler_can_cap_it():
    req = parse_request("chat", chat()).generate
    assert not req.HasField("max_new_tokens")
    assert req.cap_policy == types_pb2.CAP_POLICY_ALLOW


def test_max_completion_tokens_is_max_tokens_and_a_conflict_is_refused():
    assert parse_request("chat", chat(max_completion_tokens=9)).generate.max_new_tokens == 9
    assert parse_request("chat", chat(max_tokens=9, max_completion_tokens=9)).generate.max_new_tokens == 9
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(max_tokens=8, max_completion_tokens=9))
    assert err.value.param == "max_completion_tokens"


@pytest.mark.parametrize("key,value", [
    ("functions", []), ("function_call", "auto"), ("audio", {}),
])
def test_unsupported_parameters_are_refused_naming_them(key, value):
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(**{key: value}))
    assert err.value.param == key and err.value.code == "unsupported_parameter"
    assert key in err.value.message


def test_a_key_openai_does_not_define_is_refused_as_a_likely_typo():
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(temprature=0.5))
    assert err.value.param == "temprature" and err.value.code == "unknown_parameter"
    assert "spelling" in err.value.message
    with pytest.raises(ParamError) as err:  # a chat-only key on completions
        parse_request("completion", {"model": MODEL, "prompt": "x", "top_logprobs": 2})
    assert err.value.param == "top_logprobs" and err.value.code == "unsupported_parameter"


def test_no_op_values_of_openai_parameters_are_accepted():
    parsed = parse_request("chat", chat(n=1, presence_penalty=0, frequency_penalty=0.0,
                                        logprobs=False, user="u1", seed=None))
    assert not parsed.generate.sampling.HasField("seed")
    assert not parsed.generate.HasField("logprobs") and parsed.n == 1


def test_labels_that_do_not_affect_generation_are_accepted():
    parsed = parse_request("chat", chat(
        store=False, metadata={"team": "a"}, service_tier="auto", user="u1",
        parallel_tool_calls=True,
        messages=[{"role": "user", "content": "Hi", "name": "bob"}]))
    assert [m.content for m in parsed.generate.chat.messages] == ["Hi"]
    for key, value in (("store", "no"), ("metadata", [1]), ("user", 3)):
        with pytest.raises(ParamError) as err:
            parse_request("chat", chat(**{key: value}))
        assert err.value.param == key


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_openais_replacements_for_user_are_labels_too(kind):
    # OpenAI deprecates `user` for these two; a client that moved (Codex sends
    # prompt_cache_key on every call) met a 400 "not supported" before.
    body = (chat() if kind == "chat" else {"model": MODEL, "prompt": "Hi"})
    plain = parse_request(kind, body)
    labelled = parse_request(kind, {**body, "safety_identifier": "user-7f3a",
                                    "prompt_cache_key": "conversation-1"})
    assert labelled.generate == plain.generate  # nothing about the generation changed
    for key in ("safety_identifier", "prompt_cache_key"):
        with pytest.raises(ParamError) as err:
            parse_request(kind, {**body, key: 7})
        assert err.value.param == key and "7 is not a string" in err.value.message


def test_penalties_logit_bias_and_min_p_are_carried_to_the_sampler():
    req = parse_request("chat", chat(presence_penalty=0.5, frequency_penalty=-1,
                                     logit_bias={"15339": -100, "7": 2.5}, min_p=0.1)).generate
    assert req.sampling.presence_penalty == 0.5 and req.sampling.frequency_penalty == -1
    assert dict(req.sampling.logit_bias) == {15339: -100.0, 7: 2.5}
    assert req.sampling.min_p == pytest.approx(0.1)
    for bias, param in (({"x": 1}, "logit_bias[x]"), ({"5": "a"}, "logit_bias[5]"),
                        ([1], "logit_bias")):
        with pytest.raises(ParamError) as err:
            parse_request("chat", chat(logit_bias=bias))
        assert err.value.param == param


def test_logprobs_chat_and_completion_shapes():
    req = parse_request("chat", chat(logprobs=True, top_logprobs=5)).generate
    assert req.logprobs.top_logprobs == 5
    assert parse_request("chat", chat(logprobs=True)).generate.HasField("logprobs")
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(top_logprobs=5))
    assert err.value.param == "top_logprobs"
    # 21 is the scheduler's rule (one source of truth): carried, refused there.
    assert parse_request("chat", chat(logprobs=True, top_logprobs=21)).generate \
        .logprobs.top_logprobs == 21
    completion = parse_request("completion", {"model": MODEL, "prompt": "x", "logprobs": 3})
    assert completion.generate.logprobs.top_logprobs == 3


@pytest.mark.parametrize("n", [0, 17, True, 2.0])
def test_n_outside_one_to_sixteen_is_refused_naming_n(n):
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(n=n))
    assert err.value.param == "n"


def test_n_choices_get_seed_plus_index_and_their_own_request_ids():
    parsed = parse_request("chat", chat(n=3, seed=41, temperature=0.8))
    assert parsed.n == 3
    reqs = [parsed.choice_request(i, f"r-{i}") for i in range(3)]
    assert [r.sampling.seed for r in reqs] == [41, 42, 43]
    assert [r.request_id for r in reqs] == ["r-0", "r-1", "r-2"]
    top = parse_request("chat", chat(n=2, seed=2**64 - 1)).choice_request(1, "x")
    assert top.sampling.seed == 0  # wraps, never overflows uint64
    assert parse_request("completion", {"model": MODEL, "prompt": "x", "n": 2,
                                        "best_of": 2}).n == 2
    with pytest.raises(ParamError) as err:
        parse_request("completion", {"model": MODEL, "prompt": "x", "best_of": 2})
    assert err.value.param == "best_of"
    # Not "an integer from 1 to 1": what is supported, and what to do instead.
    assert "best_of 2 with n 1 is not supported" in str(err.value)
    assert "only best_of equal to n (1)" in str(err.value) and "ask for n 2" in str(err.value)


def test_greedy_drops_what_cannot_change_the_argmax_and_says_so():
    parsed = parse_request("chat", chat(temperature=0, seed=3, top_p=0.5, top_k=4, min_p=0.2))
    sampling = parsed.generate.sampling
    assert not any(sampling.HasField(k) for k in ("seed", "top_p", "top_k", "min_p"))
    assert set(parsed.resolved) == {"seed", "top_p", "top_k", "min_p"}
    assert "greedy" in parsed.resolved["seed"]
    sampled = parse_request("chat", chat(temperature=0.5, seed=3))
    assert sampled.generate.sampling.seed == 3 and sampled.resolved is None


@pytest.mark.parametrize("key,value", [
    ("max_tokens", 0), ("max_tokens", 2**32), ("max_tokens", "5"), ("max_tokens", 1.5),
    ("seed", -1), ("temperature", -0.1), ("temperature", "hot"), ("top_k", -1),
    ("stop", [1]), ("stream", "yes"), ("cap_policy", "sometimes"),
])
def test_malformed_values_are_refused_naming_the_field(key, value):
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(**{key: value}))
    assert err.value.param == key


@pytest.mark.parametrize("messages,param", [
    ([], "messages"), ("hi", "messages"),
    ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
    ([{"role": "function", "content": "x"}], "messages[0].role"),
    ([{"role": "user", "content": "x", "tool_calls": []}], "messages[0].tool_calls"),
    ([{"role": "user", "content": "x", "name": 5}], "messages[0].name"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "messages[0].content[0]"),
    ([{"role": "user", "content": None}], "messages[0].content"),
])
def test_bad_messages_are_refused_naming_the_path(messages, param):
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(messages=messages))
    assert err.value.param == param


def test_completion_prompt_text_or_token_ids_and_no_batches():
    assert parse_request("completion", {"model": MODEL, "prompt": "Once"}).generate.text == "Once"
    assert parse_request("completion", {"model": MODEL, "prompt": ["Once"]}).generate.text == "Once"
    ids = parse_request("completion", {"model": MODEL, "prompt": [1, 2, 3]}).generate.token_ids.ids
    assert list(ids) == [1, 2, 3]
    for batch in (["a", "b"], [[1], [2]], [], 5):
        with pytest.raises(ParamError) as err:
            parse_request("completion", {"model": MODEL, "prompt": batch})
        assert err.value.param == "prompt"


def test_completion_refuses_echo_and_chat_only_keys():
    with pytest.raises(ParamError) as err:
        parse_request("completion", {"model": MODEL, "prompt": "x", "echo": True})
    assert err.value.param == "echo"
    with pytest.raises(ParamError) as err:
        parse_request("completion", {"model": MODEL, "prompt": "x", "max_completion_tokens": 3})
    assert err.value.param == "max_completion_tokens"


def test_stream_options_include_usage_needs_stream():
    parsed = parse_request("chat", chat(stream=True, stream_options={"include_usage": True}))
    assert parsed.stream and parsed.include_usage
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(stream_options={"include_usage": True}))
    assert err.value.param == "stream_options"
    with pytest.raises(ParamError):
        parse_request("chat", chat(stream=True, stream_options={"include_obfuscation": True}))


def test_strict_cap_policy_and_a_missing_model():
    assert parse_request("chat", chat(cap_policy="strict")).generate.cap_policy == types_pb2.CAP_POLICY_STRICT
    with pytest.raises(ParamError) as err:
        parse_request("chat", {"messages": [{"role": "user", "content": "x"}]})
    assert err.value.param == "model"
    with pytest.raises(ParamError):
        parse_request("chat", ["not", "an", "object"])


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_a_model_of_the_wrong_type_is_told_what_was_sent_not_that_it_is_missing(kind):
    body = chat() if kind == "chat" else {"model": MODEL, "prompt": "x"}
    for model, said in ((5, "model: 5 is not a string"), (["m"], "model: ['m'] is not a string"),
                        ("", "model: required"), (None, "model: required")):
        with pytest.raises(ParamError) as err:
            parse_request(kind, {**body, "model": model})
        assert err.value.param == "model" and err.value.message.startswith(said), model


def test_response_format_json_schema_becomes_the_constraint():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "A", "schema": schema, "strict": True}}
    req = parse_request("chat", chat(response_format=fmt)).generate
    assert req.constraint.WhichOneof("kind") == "json_schema"
    assert json.loads(req.constraint.json_schema) == schema


def test_response_format_json_object_and_text():
    assert parse_request("chat", chat(response_format={"type": "json_object"})).generate \
        .constraint.json_object is True
    assert not parse_request("chat", chat(response_format={"type": "text"})).generate \
        .HasField("constraint")


@pytest.mark.parametrize("fmt,param", [
    ({"type": "yaml"}, "response_format.type"),
    ("json", "response_format"),
    ({"type": "json_object", "schema": {}}, "response_format.schema"),
    ({"type": "json_schema"}, "response_format.json_schema"),
    ({"type": "json_schema", "json_schema": {"schema": {}}}, "response_format.json_schema.name"),
    ({"type": "json_schema", "json_schema": {"name": "x"}}, "response_format.json_schema.schema"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "strict": "yes"}},
     "response_format.json_schema.strict"),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}},
     "response_format.json_schema.extra"),
])
def test_a_malformed_response_format_is_refused_naming_the_key(fmt, param):
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(response_format=fmt))
    assert err.value.param == param


def test_response_format_is_a_chat_parameter_only():
    with pytest.raises(ParamError) as err:
        parse_request("completion", {"model": "m", "prompt": "p",
                                     "response_format": {"type": "json_object"}})
    assert err.value.param == "response_format"


def test_a_request_may_set_its_own_stream_interval_within_the_bound():
    assert parse_request("chat", chat()).stream_interval_ms is None  # the gateway's default
    assert parse_request("chat", chat(stream_interval_ms=0)).stream_interval_ms == 0
    assert parse_request("completion", {"model": "m", "prompt": "x",
                                        "stream_interval_ms": 20}).stream_interval_ms == 20
    with pytest.raises(ParamError) as err:
        parse_request("chat", chat(stream_interval_ms=10_001))
    assert err.value.param == "stream_interval_ms"
