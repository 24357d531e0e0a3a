"""End to end (issue 55): a one-shot stored Responses call (`store: true`, the default)
leaves no session charged; its prompt and answer wait in the worker's prefix cache, and
a follow-up with previous_response_id copies them in (cached tokens) and answers as the
whole conversation does. And a stored response is its tenant's: another tenant's key
finds none. Real scheduler, worker and gateway, the tiny model (its KV blocks are 64
tokens: the prompts here are several blocks long)."""

from __future__ import annotations

import time

import openai
import pytest

from devtools.cluster import LocalCluster, stop_service
from ortserve.v1 import scheduler_pb2
from scheduler_service.ledger.tenants import key_digest
from tests.e2e.conftest import scheduler_stub
from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway, wait_reserved_zero
from tests.e2e.ledger.test_request_outcomes_e2e import metrics_port, samples
from tests.models import prepared_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

MODEL = "tiny-llama"
# Several 64-token blocks of prompt, so the cache has whole blocks to keep.
LONG = " ".join(f"Item {i}: the river flows past the old mill and the stone bridge."
                for i in range(20))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cluster = LocalCluster(model_dir=prepared_model_dir(MODEL), kv_capacities=["64MiB"],
                           worker_args=["--metrics-port", "0"],
                           log_dir=tmp_path_factory.mktemp("logs-responses-prefix")).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def gateway(cluster, tmp_path_factory):
    service = start_gateway(tmp_path_factory, cluster.address)
    yield service
    stop_service(service)


def _budget(address: str) -> scheduler_pb2.Budget:
    return scheduler_stub(address).GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)


def _wait_cached(address: str, timeout_s: float = 30.0) -> int:
    """The cache bytes the ledger sees (a heartbeat brings them); 0 if none came."""
    deadline = time.monotonic() + timeout_s
    while not (cached := _budget(address).workers[0].cached_bytes) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    return cached


def test_a_one_shot_stored_response_leaves_no_session_and_its_follow_up_reuses_it(
        cluster, gateway):
    client = openai_client(gateway)
    first = client.responses.create(model=MODEL, input=LONG, max_output_tokens=40,
                                    temperature=0)
    # Nothing charged once the answer is out: no session lease waits for a follow-up. The
    # prompt and answer are cache bytes, which the ledger sees (GetBudget's cached_bytes).
    assert wait_reserved_zero(cluster.address, timeout_s=15) == 0
    assert _budget(cluster.address).total_leases == 0
    assert first.model_extra["ortserve"]["session"]["kept"] is False
    assert first.model_extra["ortserve"]["session"]["prefix_kept_s"] > 0
    assert _wait_cached(cluster.address) > 0
    # ... kept for the follow-up: the worker got the gateway's keep_prefix_s.
    url = f"http://127.0.0.1:{metrics_port(cluster.worker_services[0])}/metrics"
    assert samples(url)[("ortserve_worker_prefix_cache_kept_bytes", ())] > 0
    # Stored and readable as before.
    assert client.responses.retrieve(first.id).output_text == first.output_text

    second = client.responses.create(model=MODEL, previous_response_id=first.id,
                                     input="And then?", max_output_tokens=24, temperature=0)
    # Promoted: the follow-up runs in a session opened on the whole conversation, whose
    # first blocks came from the cache instead of a prefill.
    session = second.model_extra["ortserve"]["session"]
    assert session["kept"] and session["turn"] == 1
    cached = second.usage.input_tokens_details.cached_tokens
    assert cached > 0 and second.usage.input_tokens > cached
    # The answer the whole conversation gets with nothing reused (stateless, greedy).
    whole_input = [{"role": "user", "content": LONG}, *[o.model_dump() for o in first.output],
                   {"role": "user", "content": "And then?"}]
    whole = client.responses.create(model=MODEL, store=False, max_output_tokens=24,
                                    temperature=0, input=whole_input)
    assert whole.usage.input_tokens == second.usage.input_tokens
    assert whole.output_text == second.output_text
    # The third turn continues the promoted session on its own KV.
    third = client.responses.create(model=MODEL, previous_response_id=second.id,
                                    input="Go on.", max_output_tokens=8, temperature=0)
    assert third.model_extra["ortserve"]["session"]["id"] == session["id"]
    assert third.model_extra["ortserve"]["session"]["turn"] == 2
    assert third.usage.input_tokens_details.cached_tokens > second.usage.input_tokens - 8
    # Deleting the heads closes the session: its lease goes.
    for response in (third, second, first):
        client.responses.delete(response.id)
    assert wait_reserved_zero(cluster.address, timeout_s=15) == 0


KEY_A, KEY_B = "tenant-a-key-" + "a" * 20, "tenant-b-key-" + "b" * 20


@pytest.fixture(scope="module")
def two_tenants(tmp_path_factory):
    folder = tmp_path_factory.mktemp("responses-tenants")
    keys = folder / "keys.txt"
    keys.write_text(f"generate:{KEY_A}\ngenerate:{KEY_B}\n")
    table = folder / "tenants.toml"
    table.write_text(f'[tenants.a]\nquota = "50%"\nkey_sha256 = ["{key_digest(KEY_A).hex()}"]\n'
                     f'[tenants.b]\nquota = "50%"\nkey_sha256 = ["{key_digest(KEY_B).hex()}"]\n')
    cluster = LocalCluster(model_dir=prepared_model_dir(MODEL), kv_capacities=["64MiB"],
                           log_dir=folder / "logs", api_key=KEY_A,
                           scheduler_args=["--api-keys-file", str(keys),
                                           "--tenants-file", str(table)]).start()
    gateway = start_gateway(tmp_path_factory, cluster.address)
    yield gateway
    stop_service(gateway)
    cluster.stop()


def test_another_tenants_key_finds_no_stored_response(two_tenants):
    a = openai.OpenAI(base_url=f"http://{two_tenants.address}/v1", api_key=KEY_A, timeout=120)
    b = openai.OpenAI(base_url=f"http://{two_tenants.address}/v1", api_key=KEY_B, timeout=120)
    mine = a.responses.create(model=MODEL, input="Hello there.", max_output_tokens=4,
                              temperature=0)
    # As if never stored: the GET's 404, the follow-up's previous_response_not_found, and
    # a delete that finds nothing.
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(mine.id)
    with pytest.raises(openai.BadRequestError) as follow_up:
        b.responses.create(model=MODEL, previous_response_id=mine.id, input="And?",
                           max_output_tokens=4, temperature=0)
    assert follow_up.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(mine.id)
    # Its own tenant still reads, continues and deletes it.
    assert a.responses.retrieve(mine.id).output_text == mine.output_text
    again = a.responses.create(model=MODEL, previous_response_id=mine.id, input="And?",
                               max_output_tokens=4, temperature=0)
    assert again.previous_response_id == mine.id
    a.responses.delete(again.id)
    a.responses.delete(mine.id)
