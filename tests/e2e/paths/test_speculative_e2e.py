"""Speculative decoding through real processes: a worker with --speculative ngram answers
greedy requests token for token as one with --speculative off, through the gRPC client
and the gateway, with a stop string, a JSON schema, a cap and a session's later turn."""

from __future__ import annotations

import json

import pytest
from ortserve_client import Client

from devtools.cluster import stop_service
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import reserved_bytes, scheduler_stub, start_cluster
from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

PASSAGE = (
    "The committee met on Tuesday to review the budget for the new library. After a long "
    "discussion, the members agreed that the reading room would open in March, that the "
    "children's section would move to the ground floor, and that the archive would stay "
    "closed until the roof is repaired. The chair thanked the volunteers for their work.")
COPY = f"Repeat this passage exactly, word for word:\n\n{PASSAGE}"
SCHEMA = {"type": "object", "properties": {"summary": {"type": "string"}},
          "required": ["summary"], "additionalProperties": False}
# 16 MiB at 46,080 bytes/token: 364 tokens, so the copy prompt with 400 new tokens is capped.
CAPACITY = "16MiB"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    started = {}
    try:
        for mode in ("off", "ngram"):
            started[mode] = start_cluster(tmp_path_factory, f"speculative-{mode}",
                                          kv_capacities=[CAPACITY],
                                          worker_args=["--speculative", mode])
        yield started
    finally:
        for cluster in started.values():
            cluster.stop()


def both(clusters, **request):
    results = {}
    for mode, cluster in clusters.items():
        with Client(cluster.address, timeout_s=300) as client:
            results[mode] = client.generate(chat=[("user", COPY)], **request)
        assert reserved_bytes(cluster.address) == 0
    off, on = results["off"], results["ngram"]
    assert on.token_ids == off.token_ids and on.text == off.text
    assert (on.finish_reason, on.budget_cap) == (off.finish_reason, off.budget_cap)
    assert off.speculation["mode"] == "off" and on.speculation["mode"] == "ngram"
    return off, on


def test_greedy_copy_equals_speculation_off_and_reports_its_counts(clusters):
    off, on = both(clusters, max_new_tokens=90)
    assert on.speculation["accepted_tokens"] > 20
    assert on.speculation["proposed_tokens"] >= on.speculation["accepted_tokens"]
    assert off.speculation["proposed_tokens"] == 0


def test_a_stop_string_and_a_json_schema_end_the_same(clusters):
    off, _ = both(clusters, max_new_tokens=90, stop=["reading room"])
    assert off.finish_reason == "STOP_SEQUENCE"
    off, _ = both(clusters, max_new_tokens=120, json_schema=SCHEMA)
    assert off.constraint is not None


def test_a_capped_request_is_capped_alike_and_ends_at_its_ceiling(clusters):
    off, on = both(clusters, max_new_tokens=400)
    assert on.budget_cap is not None and on.capped
    assert on.usage.generated_tokens <= on.budget_cap.admitted_max_new_tokens


def test_a_request_may_opt_out(clusters):
    with Client(clusters["ngram"].address, timeout_s=300) as client:
        result = client.generate(chat=[("user", COPY)], max_new_tokens=30, speculative=False)
    assert result.speculation == {"mode": "off", "proposed_tokens": 0, "accepted_tokens": 0}


def test_a_sessions_later_turn_equals_speculation_off(clusters):
    texts = {}
    for mode, cluster in clusters.items():
        stub = scheduler_stub(cluster.address)
        session = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
        turns = []
        for question in (COPY, "Now repeat it once more."):
            events = list(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
                session_id=session, request=types_pb2.GenerateRequest(
                    chat=types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(
                        role="user", content=question)]), max_new_tokens=60)), timeout=300))
            finished = events[-1].finished
            turns.append(([t for e in events if e.WhichOneof("event") == "chunk"
                           for t in e.chunk.token_ids], finished))
        stub.CloseSession(scheduler_pb2.SessionRequest(session_id=session), timeout=30)
        texts[mode] = turns
    (off1, off2), (on1, on2) = texts["off"], texts["ngram"]
    assert on1[0] == off1[0] and on2[0] == off2[0]
    assert on2[1].usage.reused_prompt_tokens == off2[1].usage.reused_prompt_tokens > 0
    assert on2[1].speculation.mode == "ngram"


def test_the_gateway_answers_alike(clusters, tmp_path_factory):
    answers = {}
    for mode, cluster in clusters.items():
        gateway = start_gateway(tmp_path_factory, cluster.address)
        try:
            reply = openai_client(gateway).chat.completions.create(
                model="smollm2-135m-instruct-fp32", temperature=0, max_tokens=80,
                messages=[{"role": "user", "content": COPY}])
            answers[mode] = reply.choices[0].message.content
        finally:
            stop_service(gateway)
    assert answers["ngram"] == answers["off"] and len(answers["off"]) > 50
    json.dumps(answers)  # plain strings
