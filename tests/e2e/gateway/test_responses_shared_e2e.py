"""Stored responses are found by every gateway process and every gateway replica: the
scheduler keeps them beside its sessions (issue 52, item 4). With the gateway's memory
holding them, `--processes 2` answered GET /v1/responses/{id} 404 and previous_response_id
400 previous_response_not_found in about half the calls, and a second gateway never found
the first's. Real processes: a scheduler, one CPU worker, gateways; every HTTP call on a
fresh connection, so the kernel hands each to either process."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from devtools.cluster import stop_service
from tests.e2e.gateway.test_gateway_e2e import MODEL, start_gateway, wait_reserved_zero

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CALLS = 16  # all of them on one process of two, on main: about 1 in 2**15


def call(gateway, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    """One HTTP call on its own connection (urllib opens one per call)."""
    request = urllib.request.Request(
        f"http://{gateway.address}{path}", method=method,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"content-type": "application/json", "connection": "close"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def create(gateway, text: str, previous: str = "") -> dict:
    body = {"model": MODEL, "input": text, "max_output_tokens": 4, "temperature": 0}
    if previous:
        body["previous_response_id"] = previous
    status, answer = call(gateway, "POST", "/v1/responses", body)
    assert status == 200, answer
    return answer


@pytest.fixture(scope="module")
def two_processes(roomy, tmp_path_factory):
    service = start_gateway(tmp_path_factory, roomy.address, ("--processes", "2"))
    yield service
    stop_service(service)


def test_every_process_of_a_two_process_gateway_finds_a_stored_response(roomy, two_processes):
    first = create(two_processes, "Say hi.")
    reads = [call(two_processes, "GET", f"/v1/responses/{first['id']}") for _ in range(CALLS)]
    assert [status for status, _ in reads] == [200] * CALLS, [body for _, body in reads]
    assert all(body["id"] == first["id"] for _, body in reads)
    # A chain of follow-ups, each on whichever process takes it: the first opens a session
    # (a one-shot stored response keeps none), the rest continue that one session.
    assert first["ortserve"]["session"]["kept"] is False
    session = ""
    previous = first
    for turn in range(1, 5):
        previous = create(two_processes, f"And {turn}?", previous["id"])
        session = session or previous["ortserve"]["session"]["id"]
        assert previous["ortserve"]["session"] == {**previous["ortserve"]["session"],
                                                   "kept": True, "id": session, "turn": turn}
    deleted = [call(two_processes, "DELETE", f"/v1/responses/{r}")[0]
               for r in (first["id"], previous["id"])]
    assert deleted == [200, 200]
    assert call(two_processes, "GET", f"/v1/responses/{previous['id']}")[0] == 404
    assert wait_reserved_zero(roomy.address, timeout_s=15) == 0  # its session was closed


def test_a_second_gateway_finds_and_continues_the_firsts_stored_response(roomy,
                                                                        tmp_path_factory):
    one = start_gateway(tmp_path_factory, roomy.address)
    two = start_gateway(tmp_path_factory, roomy.address)
    try:
        first = create(one, "Say hi.")
        status, read = call(two, "GET", f"/v1/responses/{first['id']}")
        assert status == 200 and read == first
        second = create(two, "And again?", first["id"])
        # The follow-up opens a session on the whole conversation, its start from the
        # worker's prefix cache (where the first response's prompt and answer were kept).
        assert second["ortserve"]["session"]["kept"] and second["ortserve"]["session"]["turn"] == 1
        assert second["usage"]["input_tokens_details"]["cached_tokens"] > 0
        assert call(one, "DELETE", f"/v1/responses/{second['id']}")[0] == 200
        assert call(two, "GET", f"/v1/responses/{second['id']}")[0] == 404
        assert call(two, "DELETE", f"/v1/responses/{first['id']}")[0] == 200
        assert wait_reserved_zero(roomy.address, timeout_s=15) == 0
    finally:
        stop_service(one)
        stop_service(two)
