"""TokenLogprob -> OpenAI's logprobs JSON, n choices' headers and usage, with no server."""

from __future__ import annotations

import math

from gateway.apis.chat import reply as responses
from gateway.app import unrouted
from gateway.reply.logprobs_json import LOGPROB_FLOOR, ChoiceLogprobs
from ortserve.v1 import types_pb2


def entry(token_id: int, raw: bytes, logprob: float, top=()) -> types_pb2.TokenLogprob:
    pb = types_pb2.TokenLogprob(token_id=token_id, token=raw.decode("utf-8", "replace"),
                                token_bytes=raw, logprob=logprob)
    for t, r, lp in top:
        pb.top_logprobs.add(token_id=t, token=r.decode("utf-8", "replace"), token_bytes=r,
                            logprob=lp)
    return pb


ENTRIES = [entry(1, b"Hi", -0.125, [(1, b"Hi", -0.125), (2, b"Yo", -2.5)]),
           entry(3, b" \xc3", -0.25, [(3, b" \xc3", -0.25), (4, b"!", -math.inf)]),
           entry(5, b"\xa9!", -0.375, [(5, b"\xa9!", -0.375), (6, b".", -3.0)])]


def test_chat_logprobs_have_token_bytes_and_alternatives_with_finite_numbers():
    lp = ChoiceLogprobs("chat")
    lp.add(ENTRIES)
    content = lp.whole()["content"]
    assert [c["token"] for c in content] == ["Hi", " \ufffd", "\ufffd!"]
    assert bytes(sum((c["bytes"] for c in content), [])).decode() == "Hi é!"
    assert content[1]["top_logprobs"][1] == {"token": "!", "logprob": LOGPROB_FLOOR,
                                             "bytes": [33]}


def test_completion_logprobs_use_the_legacy_shape_with_character_offsets():
    lp = ChoiceLogprobs("completion")
    lp.add(ENTRIES[:1])
    first = lp.take()
    assert first == {"tokens": ["Hi"], "token_logprobs": [-0.125],
                     "top_logprobs": [{"Hi": -0.125, "Yo": -2.5}], "text_offset": [0]}
    assert lp.take() is None  # nothing pending
    lp.add(ENTRIES[1:])
    rest = lp.take()
    # "Hi" is 2 characters: " \xc3" starts at 2; "\xa9!" finishes the é that starts at 3,
    # so it starts where that character does.
    assert rest["text_offset"] == [2, 3]
    assert lp.whole()["text_offset"] == [0, 2, 3]


def test_n_choices_headers_list_each_decision_and_usage_counts_the_prompt_once():
    adms = [types_pb2.Admission(decision=types_pb2.ADMITTED),
            types_pb2.Admission(decision=types_pb2.CAPPED, budget_cap=types_pb2.BudgetCap(
                requested_max_new_tokens=9, admitted_max_new_tokens=4))]
    headers = responses.choices_headers(adms)
    assert headers[responses.DECISION_HEADER] == "ADMITTED, CAPPED"
    assert headers[responses.CAP_HEADER].startswith("choice=1, requested_max_tokens=9")
    usages = [types_pb2.Usage(prompt_tokens=10, generated_tokens=4),
              types_pb2.Usage(prompt_tokens=10, generated_tokens=6)]
    assert responses.usage_dict(usages) == {"prompt_tokens": 10, "completion_tokens": 10,
                                            "total_tokens": 20,
                                            "prompt_tokens_details": {"cached_tokens": 0}}


def test_choices_response_indexes_every_choice_and_lists_their_admissions():
    meta = responses.ChatReplyMeta.new("chat", "m")
    fin = types_pb2.Finished(finish_reason=types_pb2.EOS, usage=types_pb2.Usage(
        prompt_tokens=3, generated_tokens=2))
    adm = types_pb2.Admission(decision=types_pb2.ADMITTED)
    body = responses.choices_response(meta, [responses.Choice("a", adm, fin),
                                             responses.Choice("b", adm, fin)],
                                      {"seed": "not applied"})
    assert [(c["index"], c["message"]["content"]) for c in body["choices"]] == [(0, "a"), (1, "b")]
    assert len(body["ortserve"]["choices"]) == 2 and body["ortserve"]["resolved"]
    assert body["usage"]["completion_tokens"] == 4


def test_unknown_routes_and_methods_answer_in_openais_error_shape():
    from starlette.exceptions import HTTPException
    body = unrouted("GET", "/v1/nope", HTTPException(404)).body()["error"]
    assert body["type"] == "invalid_request_error" and "/v1/nope" in body["message"]
    err = unrouted("GET", "/v1/completions", HTTPException(405, headers={"allow": "POST"}))
    assert err.status == 405 and "allowed: POST" in err.message
