"""The gateway's event -> OpenAI JSON shaping and the cap's headers, with no server."""

from __future__ import annotations

import json

from gateway.apis.chat import reply as responses
from gateway.apis.chat.reply import ChatReplyMeta
from gateway.reply.ortserve_numbers import CAP_HEADER, DECISION_HEADER
from ortserve.v1 import types_pb2

CAP = types_pb2.BudgetCap(requested_max_new_tokens=8155, admitted_max_new_tokens=91,
                          requested_was_unset=True, requested_bytes=377_487_360,
                          admitted_bytes=5_898_240, available_bytes=5_898_240,
                          capacity_bytes=5_898_240, bytes_per_token=46_080, prompt_tokens=37,
                          worker_id="worker-0", reason="the budget holds 91 new tokens")


def capped_admission() -> types_pb2.Admission:
    return types_pb2.Admission(decision=types_pb2.CAPPED, request_id="r1", lease_id="l1",
                               worker_id="worker-0", prompt_tokens=37, max_new_tokens=91,
                               reserved_bytes=5_898_240, budget_cap=CAP)


def finished(reason=types_pb2.LENGTH) -> types_pb2.Finished:
    return types_pb2.Finished(finish_reason=reason, budget_cap=CAP,
                              usage=types_pb2.Usage(prompt_tokens=37, generated_tokens=91,
                                                    max_new_tokens=91),
                              sampling=types_pb2.SamplingParams(temperature=0.0, seed=7),
                              worker_id="worker-0", execution_provider="CPUExecutionProvider")


def test_a_cap_is_in_the_headers_with_tokens_and_bytes():
    headers = responses.admission_headers(capped_admission())
    assert headers[DECISION_HEADER] == "CAPPED"
    assert headers[CAP_HEADER] == ("requested_max_tokens=8155, admitted_max_tokens=91, "
                                   "requested_bytes=377487360, admitted_bytes=5898240")


def test_an_admitted_request_has_no_cap_header():
    adm = types_pb2.Admission(decision=types_pb2.ADMITTED, max_new_tokens=5)
    assert responses.admission_headers(adm) == {DECISION_HEADER: "ADMITTED"}
    assert responses.admission_extension(adm)["budget_cap"] is None


def test_the_full_chat_response_carries_the_whole_cap_and_length():
    meta = ChatReplyMeta.new("chat", "m")
    body = responses.full_response(meta, "Paris", capped_admission(), finished())
    assert meta.id.startswith("chatcmpl-") and body["object"] == "chat.completion"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Paris"}
    assert choice["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 37, "completion_tokens": 91, "total_tokens": 128,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    cap = body["ortserve"]["budget_cap"]
    assert cap["admitted_max_new_tokens"] == 91 and cap["requested_bytes"] == 377_487_360
    assert set(cap) == {f.name for f in types_pb2.BudgetCap.DESCRIPTOR.fields}
    assert body["ortserve"]["decision"] == "CAPPED"
    assert body["ortserve"]["finished"]["sampling"] == {"temperature": 0.0, "seed": 7}


def test_eos_and_stop_sequences_finish_as_stop():
    meta = ChatReplyMeta.new("completion", "m")
    for reason in (types_pb2.EOS, types_pb2.STOP_SEQUENCE):
        body = responses.full_response(meta, "x", capped_admission(), finished(reason))
        assert body["choices"][0]["finish_reason"] == "stop"
        assert body["object"] == "text_completion" and body["choices"][0]["text"] == "x"


def test_stream_chunks_first_has_role_and_cap_last_has_usage_only():
    meta = ChatReplyMeta.new("chat", "m")
    first = responses.first_chunk(meta, capped_admission(), include_usage=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["ortserve"]["budget_cap"]["admitted_max_new_tokens"] == 91
    assert first["usage"] is None and first["object"] == "chat.completion.chunk"
    text = responses.text_chunk(meta, "Hi", include_usage=False)
    assert text["choices"][0]["delta"] == {"content": "Hi"} and "usage" not in text
    last = responses.final_chunk(meta, finished(), include_usage=True)
    assert last["choices"][0]["finish_reason"] == "length" and last["choices"][0]["delta"] == {}
    usage = responses.usage_chunk(meta, finished())
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 91
    assert {c["id"] for c in (first, text, last, usage)} == {meta.id}


def test_completion_chunks_carry_text_not_delta():
    meta = ChatReplyMeta.new("completion", "m")
    chunk = responses.text_chunk(meta, "Once", include_usage=False)
    assert chunk["choices"][0]["text"] == "Once" and "delta" not in chunk["choices"][0]
    assert chunk["object"] == "text_completion"


def test_the_text_chunk_template_writes_what_json_dumps_writes():
    for kind in ("chat", "completion"):
        meta = responses.ChatReplyMeta.new(kind, 'm"odel\u00e9')
        for usage in (False, True):
            encode = responses.text_chunk_encoder(meta, usage)
            for text in ("", "plain", 'q"uote\\ \n\u00e9\u4e2d\U0001f600', "\x00"):
                assert encode(text) == json.dumps(responses.text_chunk(meta, text, usage),
                                                  separators=(",", ":"))


def test_a_text_chunk_sent_as_bytes_is_the_sse_event_sse_starlette_writes():
    from sse_starlette.event import ensure_bytes

    meta = responses.ChatReplyMeta.new("chat", "m")
    encode = responses.text_chunk_encoder(meta, False)
    for text in ("hi", "two\nlines", "\r"):
        line = b"data: " + encode(text).encode() + b"\n\n"
        assert line == ensure_bytes({"data": encode(text)}, "\n")
