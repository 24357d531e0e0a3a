"""End to end through the stubs: log-probabilities in the token chunks, the new sampling
parameters honoured, bad values refused naming the field with the ledger untouched."""

from __future__ import annotations

import math

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import reserved_bytes, scheduler_stub

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

FRANCE = "What is the capital of France? Answer in one sentence."


def chat(**kw) -> types_pb2.GenerateRequest:
    req = types_pb2.GenerateRequest(max_new_tokens=kw.pop("max_new_tokens", 12), **kw)
    req.chat.messages.add(role="user", content=FRANCE)
    return req


def run(address: str, request: types_pb2.GenerateRequest):
    chunks, finished = [], None
    for event in scheduler_stub(address).Generate(request, timeout=120):
        kind = event.WhichOneof("event")
        if kind == "chunk":
            chunks.append(event.chunk)
        elif kind == "finished":
            finished = event.finished
    return chunks, finished


def ids_of(chunks) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def test_logprobs_arrive_with_each_token_and_the_greedy_token_is_the_top_one(roomy):
    plain, _ = run(roomy.address, chat())
    chunks, finished = run(roomy.address, chat(logprobs=types_pb2.LogprobsOptions(top_logprobs=5)))
    assert ids_of(chunks) == ids_of(plain)  # asking changes nothing it reports on
    assert all(not c.logprobs for c in plain)
    for chunk in chunks:
        assert [e.token_id for e in chunk.logprobs] == list(chunk.token_ids)
        for entry in chunk.logprobs:
            assert len(entry.top_logprobs) == 5
            assert entry.top_logprobs[0].token_id == entry.token_id  # greedy: the argmax
            assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
            assert sum(math.exp(t.logprob) for t in entry.top_logprobs) <= 1 + 1e-6
            assert entry.logprob <= 0 and entry.token_bytes.decode("utf-8", "replace") == entry.token
    text = b"".join(e.token_bytes for c in chunks for e in c.logprobs).decode("utf-8", "replace")
    assert "Paris" in text
    assert finished is not None and reserved_bytes(roomy.address) == 0


def test_top_logprobs_zero_gives_only_the_chosen_token(roomy):
    chunks, _ = run(roomy.address, chat(max_new_tokens=3,
                                        logprobs=types_pb2.LogprobsOptions(top_logprobs=0)))
    entries = [e for c in chunks for e in c.logprobs]
    assert len(entries) == 3 and all(not e.top_logprobs for e in entries)


def test_penalties_and_logit_bias_are_honoured_and_reported(roomy):
    plain, _ = run(roomy.address, chat())
    first = ids_of(plain)[0]
    sampling = types_pb2.SamplingParams(presence_penalty=0.5, frequency_penalty=0.5)
    sampling.logit_bias[first] = -100.0
    chunks, finished = run(roomy.address, chat(sampling=sampling))
    assert first not in ids_of(chunks)
    assert finished.sampling.presence_penalty == 0.5
    assert dict(finished.sampling.logit_bias) == {first: -100.0}


def test_min_p_with_a_seed_is_reproducible(roomy):
    sampling = types_pb2.SamplingParams(temperature=1.0, seed=7, min_p=0.2)
    a, fin = run(roomy.address, chat(sampling=sampling))
    b, _ = run(roomy.address, chat(sampling=sampling))
    assert ids_of(a) == ids_of(b) and fin.sampling.min_p == pytest.approx(0.2)


def _bias(token: int, value: float) -> types_pb2.SamplingParams:
    params = types_pb2.SamplingParams()
    params.logit_bias[token] = value
    return params


@pytest.mark.parametrize(
    ("request_kw", "field"),
    [
        ({"logprobs": types_pb2.LogprobsOptions(top_logprobs=21)}, "logprobs.top_logprobs"),
        ({"sampling": types_pb2.SamplingParams(presence_penalty=2.5)}, "sampling.presence_penalty"),
        ({"sampling": types_pb2.SamplingParams(frequency_penalty=-3)}, "sampling.frequency_penalty"),
        ({"sampling": types_pb2.SamplingParams(temperature=1, min_p=1.5)}, "sampling.min_p"),
        ({"sampling": types_pb2.SamplingParams(min_p=0.1)}, "sampling.min_p"),
        ({"sampling": _bias(5, 101.0)}, "sampling.logit_bias[5]"),
        ({"sampling": _bias(10**6, 1.0)}, "sampling.logit_bias[1000000]"),  # the model's rule
    ],
)
def test_bad_values_are_refused_naming_the_field_and_the_ledger_never_moves(
        roomy, request_kw, field):
    stub = scheduler_stub(roomy.address)
    before = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    with pytest.raises(grpc.RpcError) as info:
        run(roomy.address, chat(**request_kw))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in info.value.details()
    status = status_pb2.Status.FromString(dict(info.value.trailing_metadata())[
        "grpc-status-details-bin"])
    bad = [error_details_pb2.BadRequest.FromString(d.value) for d in status.details
           if d.type_url.endswith("BadRequest")]
    assert bad and bad[0].field_violations[0].field == field
    after = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)
    assert after.total_reserved_bytes == before.total_reserved_bytes == 0
    assert reserved_bytes(roomy.address) == 0


def test_tokenize_and_detokenize_through_the_scheduler(roomy):
    stub = scheduler_stub(roomy.address)
    counted = stub.Tokenize(types_pb2.GenerateRequest(text="Hello world"), timeout=30)
    assert counted.token_ids and counted.context_length == 8192 and counted.model
    text = stub.Detokenize(types_pb2.DetokenizeRequest(token_ids=counted.token_ids), timeout=30)
    assert text.text == "Hello world" and text.model == counted.model
    with pytest.raises(grpc.RpcError) as info:
        stub.Detokenize(types_pb2.DetokenizeRequest(token_ids=[1, 10**7]), timeout=30)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "token_ids[1]" in info.value.details()
    assert reserved_bytes(roomy.address) == 0


def test_the_docs_grpcurl_lines_answer(roomy):
    import subprocess

    from tests.e2e.conftest import grpcurl
    # docs/clients.md's lines, as written there.
    line = ('{"chat": {"messages": [{"role": "user", "content": "Hi!"}]}, "max_new_tokens": 4, '
            '"logprobs": {"top_logprobs": 5}, "sampling": {"presence_penalty": 0.5, '
            '"logit_bias": {"28": -100}}}')
    out = subprocess.run([grpcurl(), "-plaintext", "-d", line, roomy.address,
                          "ortserve.v1.Scheduler/Generate"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert '"top_logprobs"' in out.stdout and '"finished"' in out.stdout
    out = subprocess.run([grpcurl(), "-plaintext", "-d", '{"token_ids": [19556, 905]}',
                          roomy.address, "ortserve.v1.Scheduler/Detokenize"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and '"text": "Hello world"' in out.stdout, out.stdout + out.stderr
