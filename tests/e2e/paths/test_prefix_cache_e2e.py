"""End to end: the automatic prefix cache through real processes (docs/features/prefix-cache.md).

A second request sharing a 600-token prefix reports the cached tokens and
produces the same greedy tokens as a worker with the cache off; on the int4
model a chat sent twice (a miss, then a hit) streams the same tokens, text and
logprobs, greedy and seeded; an
admission that needs the cache's bytes evicts and succeeds, with the
ledger's and the worker's figures within the capacity; with two workers a
follow-up lands on the worker holding its prefix; the gateway reports
OpenAI's cached_tokens on a resent conversation.
"""

from __future__ import annotations

import contextlib
import time

import pytest

from devtools.cluster import LocalCluster
from ortserve.v1 import scheduler_pb2, types_pb2, worker_pb2
from tests.e2e.conftest import scheduler_stub, start_cluster, worker_stub
from tests.models import prepared_model_dir

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

BPT = 46_080  # SmolLM2-135M fp32 KV bytes per token
BLOCK = 16  # its block_tokens
SHARED = [(i * 13) % 5000 + 100 for i in range(600)]


def generate(address: str, ids: list[int], max_new: int = 12) -> types_pb2.Finished:
    request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=ids),
                                        max_new_tokens=max_new)
    finished = None
    for event in scheduler_stub(address).Generate(request, timeout=300):
        if event.HasField("finished"):
            finished = event.finished
    assert finished is not None
    return finished


def budget(address: str) -> scheduler_pb2.Budget:
    return scheduler_stub(address).GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)


def wait_cached(address: str, worker_id: str, timeout_s: float = 30.0,
                min_bytes: int = 1) -> scheduler_pb2.WorkerBudget:
    """The worker's budget once a heartbeat has reported at least `min_bytes` cached (a
    finishing sequence's blocks enter the cache one by one, so a heartbeat may see part)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        worker = next(w for w in budget(address).workers if w.worker_id == worker_id)
        if worker.cached_blocks and worker.cached_bytes >= min_bytes:
            return worker
        time.sleep(0.2)
    pytest.fail(f"{worker_id} reported fewer than {min_bytes:,} cached bytes within "
                f"{timeout_s:g} s")


@contextlib.contextmanager
def _stopping(cluster):
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "prefix-on", kv_capacities=["512MiB"])
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def uncached(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "prefix-off", kv_capacities=["512MiB"],
                            worker_args=["--prefix-cache-bytes", "0"])
    yield cluster
    cluster.stop()


def _stream_ids(address: str, ids: list[int], max_new: int) -> tuple[list[int], types_pb2.Finished]:
    request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=ids),
                                        max_new_tokens=max_new)
    out, finished = [], None
    for event in scheduler_stub(address).Generate(request, timeout=300):
        if event.HasField("chunk"):
            out += event.chunk.token_ids
        elif event.HasField("finished"):
            finished = event.finished
    return out, finished


def test_a_shared_600_token_prefix_is_cached_and_changes_no_token(cached, uncached):
    first, second = SHARED + [7, 8, 9], SHARED + [4242, 17]
    results = {}
    for name, cluster in (("on", cached), ("off", uncached)):
        ids_1, fin_1 = _stream_ids(cluster.address, first, 4)
        ids_2, fin_2 = _stream_ids(cluster.address, second, 16)
        results[name] = (ids_1, ids_2, fin_1.usage.cached_tokens, fin_2.usage.cached_tokens)
    on, off = results["on"], results["off"]
    assert on[:2] == off[:2]  # greedy tokens identical with and without the cache
    assert on[2] == 0 and on[3] == 600 // BLOCK * BLOCK  # 592: whole blocks of the prefix
    assert off[2] == off[3] == 0  # --prefix-cache-bytes 0: today's behaviour
    worker = wait_cached(cached.address, "worker-0")
    assert 0 < worker.cached_bytes <= worker.capacity_bytes // 2  # the default: half
    assert worker.cached_bytes % (BLOCK * BPT) == 0
    assert all(w.cached_bytes == 0 for w in budget(uncached.address).workers)


def _stream_chat(address: str, question: str, sampling: types_pb2.SamplingParams
                 ) -> tuple[list[int], str, list[tuple], types_pb2.Finished]:
    """One chat's streamed token ids, text and logprobs (every float as sent), and Finished."""
    request = types_pb2.GenerateRequest(
        chat=types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(role="user",
                                                                    content=question)]),
        max_new_tokens=24, sampling=sampling, logprobs=types_pb2.LogprobsOptions(top_logprobs=3))
    ids, text, logprobs, finished = [], "", [], None
    for event in scheduler_stub(address).Generate(request, timeout=300):
        if event.HasField("chunk"):
            ids += event.chunk.token_ids
            text += event.chunk.text
            logprobs += [(lp.token_id, lp.logprob, tuple((t.token_id, t.logprob)
                                                         for t in lp.top_logprobs))
                         for lp in event.chunk.logprobs]
        elif event.HasField("finished"):
            finished = event.finished
    assert finished is not None
    return ids, text, logprobs, finished


def test_an_int4_chat_sent_twice_answers_the_same_from_the_cache(tmp_path_factory):
    """The same chat twice to an int4 worker: the second hits the cache (32 of its 37 prompt
    tokens) and streams exactly what the first did, greedy and with a seeded sample."""
    model = prepared_model_dir("smollm2-135m-instruct-int4")
    cluster = LocalCluster(model_dir=model, log_dir=tmp_path_factory.mktemp("logs-prefix-int4"),
                           kv_capacities=["256MiB"]).start()
    with _stopping(cluster):
        for sampling in (types_pb2.SamplingParams(temperature=0),
                         types_pb2.SamplingParams(temperature=1.0, seed=4242)):
            *miss, miss_fin = _stream_chat(cluster.address, "What is the capital of Peru?",
                                           sampling)
            *hit, hit_fin = _stream_chat(cluster.address, "What is the capital of Peru?",
                                         sampling)
            assert hit_fin.usage.cached_tokens == 32 and hit_fin.usage.prompt_tokens == 37
            assert hit == miss  # ids, text and every logprob float


def test_an_admission_that_needs_the_caches_bytes_evicts_and_succeeds(tmp_path_factory):
    capacity = 2_048 * BPT  # one full context window
    cluster = start_cluster(tmp_path_factory, "prefix-evict", kv_capacities=[str(capacity)],
                            worker_args=["--prefix-cache-bytes", str(capacity)])
    with _stopping(cluster):
        first = [(i * 7) % 3000 + 50 for i in range(1_200)]
        generate(cluster.address, first, 2)
        worker = wait_cached(cluster.address, "worker-0",
                             min_bytes=1_200 // BLOCK * BLOCK * BPT)
        # Admission counts the cache's bytes as available: 1,900 tokens fit only if they go.
        assert worker.reserved_bytes + worker.cached_bytes + 1_900 * BPT > capacity
        finished = generate(cluster.address, [(i * 11) % 3000 + 60 for i in range(1_880)], 20)
        assert finished.usage.generated_tokens == 20 and not finished.HasField("budget_cap")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the ledger and the worker settle after the finish
            worker = budget(cluster.address).workers[0]
            info = worker_stub(cluster.worker_services[0].address).Info(worker_pb2.InfoRequest(),
                                                                         timeout=5)
            if worker.reserved_bytes == 0 and info.held_bytes == 0:
                break
            time.sleep(0.2)
        assert info.held_bytes == 0 and worker.reserved_bytes == 0
        assert worker.cached_bytes <= capacity  # live (0) + cached <= capacity
        # The first prompt's blocks went for that admission: asked again, it finds at most
        # what was left of them. (The cached figure alone cannot tell: once the second
        # sequence finishes, its own blocks fill the cache.)
        again = generate(cluster.address, first, 1)
        assert again.usage.cached_tokens < 1_200 // BLOCK * BLOCK


def test_a_follow_up_lands_on_the_worker_holding_its_prefix(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory, "prefix-place", workers=2,
                            kv_capacities=["256MiB", "256MiB"])
    with _stopping(cluster):
        prefix = [(i * 17) % 4000 + 70 for i in range(400)]
        holder = generate(cluster.address, prefix + [1, 2], 2).worker_id
        wait_cached(cluster.address, holder)
        # Make the holder the worker with fewer free bytes: placement by bytes alone would
        # now pick the other one.
        leases = []
        for _ in range(20):
            workers = {w.worker_id: w.available_bytes for w in budget(cluster.address).workers}
            other = next(w for w in workers if w != holder)
            if workers[holder] < workers[other]:
                break
            admission = scheduler_stub(cluster.address).Admit(scheduler_pb2.AdmitRequest(
                request=types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=[5] * 100),
                                                  max_new_tokens=400)), timeout=10)
            leases.append(admission)
        assert workers[holder] < workers[other]
        follow = generate(cluster.address, prefix + [3, 4, 5], 4)
        assert follow.worker_id == holder
        assert follow.usage.cached_tokens == 400 // BLOCK * BLOCK
        fresh = generate(cluster.address, [(i * 19) % 4000 + 90 for i in range(400)], 2)
        assert fresh.worker_id == other and fresh.usage.cached_tokens == 0  # by bytes, as before
        for admission in leases:
            scheduler_stub(cluster.address).Release(scheduler_pb2.ReleaseRequest(
                lease_id=admission.lease_id, lease_secret=admission.lease_secret), timeout=5)


def test_the_gateway_reports_cached_tokens_on_a_resent_conversation(cached, tmp_path_factory):
    from devtools.cluster import stop_service
    from tests.e2e.gateway.test_gateway_e2e import openai_client, start_gateway

    gateway = start_gateway(tmp_path_factory, cached.address)
    try:
        client = openai_client(gateway)
        system = ("You are a careful assistant. " * 40).strip()
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": "Name a colour."}]
        one = client.chat.completions.create(model="smollm2-135m-instruct-fp32",
                                             messages=messages, max_tokens=8, temperature=0)
        messages += [{"role": "assistant", "content": one.choices[0].message.content},
                     {"role": "user", "content": "Another one."}]
        two = client.chat.completions.create(model="smollm2-135m-instruct-fp32",
                                             messages=messages, max_tokens=8, temperature=0)
        assert two.usage.prompt_tokens_details.cached_tokens > 0
        assert two.usage.prompt_tokens_details.cached_tokens < two.usage.prompt_tokens
    finally:
        stop_service(gateway)
