"""The Python client's request and result shapes, with no server: what build_request puts in
the GenerateRequest, and how a stream's chunks and Finished become typed results."""

from __future__ import annotations

import json
import math

import pytest
from ortserve_client import (
    ConstraintResult,
    GenerateResult,
    TextChunk,
    TokenLogprob,
    build_request,
    stats_lines,
)
from ortserve_client.client import GenerationStream

from ortserve.v1 import types_pb2

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_the_newer_sampling_fields_land_in_sampling_params():
    req = build_request("hi", presence_penalty=0.5, frequency_penalty=-0.25, min_p=0.125,
                        logit_bias={28: -100, 7: 2.5})
    s = req.sampling
    assert (s.presence_penalty, s.frequency_penalty, s.min_p) == (0.5, -0.25, 0.125)
    assert dict(s.logit_bias) == {28: -100.0, 7: 2.5}


def test_unset_fields_stay_unset_on_the_wire():
    req = build_request("hi")
    for name in ("presence_penalty", "frequency_penalty", "min_p", "temperature"):
        assert not req.sampling.HasField(name)
    assert not req.sampling.logit_bias
    assert not req.HasField("constraint") and not req.HasField("logprobs")


def test_a_zero_penalty_is_sent_not_dropped():
    # Presence, not truthiness: 0 is a value the caller chose (the server reports it as applied).
    req = build_request("hi", presence_penalty=0.0, min_p=0.0)
    assert req.sampling.HasField("presence_penalty") and req.sampling.HasField("min_p")


def test_a_json_schema_dict_is_sent_as_json_text_and_a_string_as_it_is():
    as_dict = build_request("hi", json_schema=SCHEMA).constraint
    assert as_dict.WhichOneof("kind") == "json_schema"
    assert json.loads(as_dict.json_schema) == SCHEMA
    text = '{"type": "object"}'
    assert build_request("hi", json_schema=text).constraint.json_schema == text


@pytest.mark.parametrize(("kw", "kind", "value"), [
    ({"json_object": True}, "json_object", True),
    ({"regex": "(yes|no)\\."}, "regex", "(yes|no)\\."),
    ({"grammar": 'start: "a"+'}, "grammar", 'start: "a"+'),
])
def test_each_constraint_kind_lands_in_the_oneof(kw, kind, value):
    constraint = build_request("hi", **kw).constraint
    assert constraint.WhichOneof("kind") == kind and getattr(constraint, kind) == value


def test_json_object_false_asks_for_no_constraint():
    assert not build_request("hi", json_object=False).HasField("constraint")


@pytest.mark.parametrize(("kw", "names"), [
    ({"json_schema": SCHEMA, "regex": "a+"}, ("json_schema", "regex")),
    ({"json_object": True, "grammar": 'start: "a"'}, ("json_object", "grammar")),
    ({"regex": "a", "grammar": 'start: "a"'}, ("regex", "grammar")),
    ({"json_schema": "{}", "json_object": True}, ("json_schema", "json_object")),
])
def test_two_constraints_are_refused_naming_both(kw, names):
    with pytest.raises(ValueError, match="exclude each other") as err:
        build_request("hi", **kw)
    assert all(name in str(err.value) for name in names)


@pytest.mark.parametrize("n", [0, 2, 20])
def test_logprobs_n_asks_for_n_alternatives_and_zero_is_still_asked(n):
    req = build_request("hi", logprobs=n)
    assert req.HasField("logprobs") and req.logprobs.top_logprobs == n


def test_out_of_range_values_are_the_servers_to_refuse():
    # The server names the field (INVALID_ARGUMENT); the client sends what it was given.
    req = build_request("hi", presence_penalty=9.0, min_p=3.0, logprobs=99, regex="")
    assert req.sampling.presence_penalty == 9.0 and req.logprobs.top_logprobs == 99
    assert req.constraint.WhichOneof("kind") == "regex"


def token_logprob(token_id: int, logprob: float, top: int) -> types_pb2.TokenLogprob:
    alternatives = [types_pb2.TopLogprob(token_id=token_id + i, token=f"t{i}",
                                         token_bytes=f"t{i}".encode(), logprob=logprob - i)
                    for i in range(top)]
    return types_pb2.TokenLogprob(token_id=token_id, token="é", token_bytes="é".encode(),
                                  logprob=logprob, top_logprobs=alternatives)


def stream_of(*events: types_pb2.GenerateEvent) -> GenerationStream:
    return GenerationStream(lambda timeout_s: iter(events))


ADMISSION = types_pb2.GenerateEvent(admission=types_pb2.Admission(decision=types_pb2.ADMITTED))


def test_chunk_logprobs_and_the_constraint_result_reach_the_typed_results():
    chunks = [types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(
        token_ids=[5, 6], text="ab", logprobs=[token_logprob(5, -0.5, 2), token_logprob(6, -1.5, 2)])),
        types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(
            token_ids=[7], text="c", logprobs=[token_logprob(7, -math.inf, 2)]))]
    finished = types_pb2.GenerateEvent(finished=types_pb2.Finished(
        finish_reason=types_pb2.LENGTH,
        constraint=types_pb2.ConstraintResult(satisfied=False, reason="max_new_tokens 3 ended it")))
    stream = stream_of(ADMISSION, *chunks, finished)
    got = list(stream)
    assert [len(c.logprobs) for c in got] == [2, 1]
    assert got[0].logprobs[0] == TokenLogprob.from_pb(token_logprob(5, -0.5, 2))
    result = stream.result
    assert [lp.token_id for lp in result.logprobs] == list(result.token_ids) == [5, 6, 7]
    assert all(len(lp.top_logprobs) == 2 for lp in result.logprobs)
    assert result.logprobs[0].token_bytes == "é".encode()
    assert result.constraint == ConstraintResult(False, "max_new_tokens 3 ended it")
    out = json.loads(json.dumps(result.to_dict()))  # -inf is JSON's -Infinity; bytes are ints
    assert out["constraint"] == {"satisfied": False, "reason": "max_new_tokens 3 ended it"}
    assert out["logprobs"][0]["token_bytes"] == list("é".encode())
    assert out["logprobs"][2]["logprob"] == -math.inf
    assert out["logprobs"][1]["top_logprobs"][1] == {"token_id": 7, "token": "t1",
                                                     "token_bytes": list(b"t1"), "logprob": -2.5}
    lines = stats_lines(result)
    assert "stats: constraint satisfied=false reason=max_new_tokens 3 ended it" in lines
    assert lines[-3].startswith("stats: logprob[0] token_id=5 ") and "top=[5 " in lines[-3]


def test_without_logprobs_or_a_constraint_the_results_keep_their_old_shape():
    stream = stream_of(ADMISSION, types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(
        token_ids=[5], text="a")), types_pb2.GenerateEvent(finished=types_pb2.Finished()))
    assert list(stream) == [TextChunk("a", (5,))]
    result: GenerateResult = stream.result
    assert result.logprobs == () and result.constraint is None
    assert result.to_dict()["logprobs"] == [] and result.to_dict()["constraint"] is None
    assert not any("constraint" in line or "logprob" in line for line in stats_lines(result))


def test_an_adapter_is_the_requests_adapter():
    from ortserve_client.request import build_request

    req = build_request([1, 2], model="base", adapter="fr")
    assert (req.model, req.adapter) == ("base", "fr")
    assert build_request([1, 2]).adapter == ""
