"""ortserve.rules.request_rules: each rule once, with one wording, whichever edge calls it."""

from __future__ import annotations

import pytest

from ortserve.rules import request_rules
from ortserve.status.errors import ContextWindowFull, ErrorReason, InvalidField, LeaseMismatch
from ortserve.v1 import types_pb2
from worker_service.core import sequence
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import SequenceRequest


def refusal(fn, *args, **kwargs) -> InvalidField:
    with pytest.raises(InvalidField) as info:
        fn(*args, **kwargs)
    return info.value


def test_the_stop_limit_is_defined_once():
    assert not hasattr(sequence, "MAX_STOP_SEQUENCES")
    stop = ("x",) * (request_rules.MAX_STOP_SEQUENCES + 1)
    pb = types_pb2.GenerateRequest(text="a", stop=list(stop))
    # The scheduler's check and the worker's core say the same sentence.
    assert str(refusal(request_rules.generate_request, pb)) == \
        str(refusal(SequenceRequest, "s", (1,), 4, stop=stop))


def test_a_chat_role_is_refused_with_one_wording_under_the_callers_prefix():
    pb = types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(messages=[
        types_pb2.ChatMessage(role="user", content="a"), types_pb2.ChatMessage(role="wizard")]))
    error = refusal(request_rules.generate_request, pb, "request.")
    assert error.field == "request.chat.messages[1].role"
    assert str(error) == "request.chat.messages[1].role: 'wizard' is not a role: use one of " \
        "system, user, assistant, tool"


def test_sampling_ranges_are_the_workers_rule():
    pb = types_pb2.GenerateRequest(text="a", sampling=types_pb2.SamplingParams(
        temperature=1.0, top_p=1.5))
    assert str(refusal(request_rules.generate_request, pb)) == \
        str(refusal(SamplingConfig(temperature=1.0, top_p=1.5).validate))


def test_a_token_id_outside_the_vocabulary_is_named():
    error = refusal(request_rules.token_ids_in_vocab, [3, 7, 1_000], 1_000)
    assert error.field == "token_ids.ids[2]" and "[0, 1,000)" in str(error)
    assert refusal(request_rules.token_ids_in_vocab, [-1], 10).field == "token_ids.ids[0]"
    request_rules.token_ids_in_vocab([0, 9], 10)


@pytest.mark.parametrize(("prompt", "max_new", "min_new", "field", "says"), [
    (100, 1, 0, "prompt", "a full context window is an error, not an empty turn"),
    (100, 1, 20, "prompt", "shorten the prompt to at most 80 tokens or lower min_new_tokens"),
    # The floor overflows with a prompt that fits alone: the caller's min_new_tokens is named.
    (90, 30, 20, "min_new_tokens", "lower min_new_tokens to at most 10 or shorten the prompt "
                                   "to at most 80 tokens"),
    (50, 80, 0, "max_new_tokens", "lower max_new_tokens to 50"),
])
def test_the_context_window_has_one_sentence(prompt, max_new, min_new, field, says):
    error = ContextWindowFull(prompt, max_new, 100, min_new)
    assert error.reason is ErrorReason.CONTEXT_LENGTH_EXCEEDED and error.field == field
    assert says in error.message and error.message == f"{error.cause}; {error.remedy}"
    assert "context window of 100 tokens" in error.cause


def test_an_unset_ceiling_raised_to_min_new_tokens_names_min_new_tokens():
    # {"text": "Hi", "min_new_tokens": 8197} on an 8,192-token window. The
    # worker resolves the unset max_new_tokens to max(window - prompt, min_new_tokens).
    with pytest.raises(ContextWindowFull) as info:
        request_rules.context_window(1, 8_197, 8_192, min_new_tokens=8_197)
    error = info.value
    assert error.field == "min_new_tokens" and "max_new_tokens" not in error.message
    assert error.cause == ("the prompt is 1 token and min_new_tokens 8,197 need 8,198 tokens, "
                           "beyond the model's context window of 8,192 tokens")
    assert error.remedy == "lower min_new_tokens to at most 8,191"
    request_rules.context_window(1, 8_191, 8_192, min_new_tokens=8_191)


def test_the_lease_match_names_the_field_and_keeps_the_lease_usable():
    with pytest.raises(LeaseMismatch) as info:
        request_rules.lease_match("L1", 5, 0, 6, 10)
    assert info.value.field == "prompt" and "still usable" in info.value.message
    with pytest.raises(LeaseMismatch) as info:
        request_rules.lease_match("L1", 6, 11, 6, 10)
    assert info.value.field == "max_new_tokens"
    request_rules.lease_match("L1", 0, 10, 6, 10)  # 0: the prompt length is not checked


def test_the_leases_ceiling_is_set_without_validating_the_request_again(monkeypatch):
    req = SequenceRequest("s", (1, 2), 4, stop=("x",))
    calls = []
    monkeypatch.setattr(request_rules, "stop_sequences", lambda *a, **k: calls.append(a))
    lowered = req.with_max_new_tokens(2)
    assert lowered.max_new_tokens == 2 and lowered.stop == ("x",) and calls == []
    with pytest.raises(InvalidField):
        SequenceRequest("s", (1, 2), 4, min_new_tokens=3).with_max_new_tokens(2)


def test_top_logprobs_beyond_twenty_is_refused_naming_the_field():
    request_rules.top_logprobs(20)
    request = types_pb2.GenerateRequest(text="hi", logprobs=types_pb2.LogprobsOptions(
        top_logprobs=21))
    with pytest.raises(InvalidField) as info:
        request_rules.generate_request(request, prefix="request.")
    assert info.value.field == "request.logprobs.top_logprobs"
    assert "21" in str(info.value) and "20" in str(info.value)


def test_a_logit_bias_id_outside_the_vocabulary_is_named():
    request_rules.logit_bias_in_vocab([0, 99], 100)
    with pytest.raises(InvalidField) as info:
        request_rules.logit_bias_in_vocab([3, 100], 100)
    assert info.value.field == "sampling.logit_bias[100]"


def test_a_stream_interval_is_bounded_and_named_under_the_callers_prefix():
    ok = types_pb2.GenerateRequest(text="a", stream_interval_ms=request_rules.MAX_STREAM_INTERVAL_MS)
    request_rules.generate_request(ok)
    request_rules.request_shape(ok)  # the worker's check
    long = types_pb2.GenerateRequest(text="a",
                                     stream_interval_ms=request_rules.MAX_STREAM_INTERVAL_MS + 1)
    error = refusal(request_rules.generate_request, long, "request.")
    assert error.field == "request.stream_interval_ms" and "10,000 ms" in str(error)
    assert error.metadata["stream_interval_ms"] == 10_001
    assert str(refusal(request_rules.request_shape, long)) == \
        str(refusal(request_rules.generate_request, long))
