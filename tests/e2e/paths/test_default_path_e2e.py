"""The default token path: the gateway and the Python client read from the worker directly.

The scheduler admits, places and leases (the cap decided there, before any token) and
is told of every end by the worker's release; it relays no token (its
ortserve_scheduler_relayed_messages_total stays 0). Usage and timings are as the
relayed path gives them. Every exit on this path (a finish, a cancel, a deadline, a
killed client, a killed worker) leaves the ledger reserving 0 and the worker holding 0.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import openai
import pytest
from ortserve_client import Client, GenerationFailed

from devtools.cluster import LocalCluster, model_cache, stop_service
from tests.e2e.conftest import reserved_bytes, worker_held_bytes
from tests.e2e.gateway.test_gateway_e2e import start_gateway
from tests.e2e.ledger.test_request_outcomes_e2e import metrics_port, samples

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

TINY_BYTES_PER_TOKEN = 512  # 2 layers x K,V x 2 heads x 16 dims x fp32
CAPACITY_TOKENS = 1024  # a 13-token prompt asking for 1,900 new tokens is capped
PROMPT = [1, *range(100, 112)]
RELAYED = ("ortserve_scheduler_relayed_messages_total", ())
RELAYED_TOKENS = ("ortserve_scheduler_relayed_tokens_total", ())


def _cluster(tmp_path_factory, model: str, capacity: str, name: str, **kw) -> LocalCluster:
    model_dir = model_cache() / "models" / model
    if not (model_dir / "genai_config.json").exists():
        pytest.fail(f"the model is not prepared at {model_dir}: run `make model`")
    return LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=[capacity],
                        log_dir=tmp_path_factory.mktemp(f"logs-{name}"), **kw).start()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cluster = _cluster(tmp_path_factory, "tiny-llama", str(CAPACITY_TOKENS * TINY_BYTES_PER_TOKEN),
                       "default-path", scheduler_args=["--metrics-port", "0"])
    cluster.metrics = f"http://127.0.0.1:{metrics_port(cluster.services[0])}/metrics"
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def slow(tmp_path_factory):
    """SmolLM2 at tens of tokens a second: a deadline or a kill lands mid-stream."""
    cluster = _cluster(tmp_path_factory, "smollm2-135m-instruct-int4", "256MiB", "default-slow",
                       scheduler_args=["--lease-ttl-s", "3"])
    yield cluster
    cluster.stop()


def wait_until_free(cluster: LocalCluster, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and (
            worker_held_bytes(cluster.worker_services[0].address) or reserved_bytes(cluster.address)):
        time.sleep(0.02)
    assert worker_held_bytes(cluster.worker_services[0].address) == 0
    assert reserved_bytes(cluster.address) == 0


def test_the_default_client_reads_from_the_worker_with_the_cap_first(tiny):
    before = samples(tiny.metrics)
    with Client(tiny.address, timeout_s=120) as client, \
            Client(tiny.address, timeout_s=120, direct=False) as relayed:
        assert client.direct
        seen: list[str] = []
        stream = client.stream(PROMPT, max_new_tokens=1900, min_new_tokens=20,
                               on_admission=lambda a: seen.append(a.decision))
        ids = [i for chunk in stream for i in (seen.append("chunk") or chunk.token_ids)]
        got = stream.result
        after_default = samples(tiny.metrics)
        want = relayed.generate(PROMPT, max_new_tokens=1900, min_new_tokens=20)
    after_relayed = samples(tiny.metrics)
    # The scheduler relayed nothing on the default path; the relayed request, all its tokens.
    assert after_default[RELAYED] == before[RELAYED]
    assert after_default[RELAYED_TOKENS] == before[RELAYED_TOKENS]
    assert after_relayed[RELAYED_TOKENS] - after_default[RELAYED_TOKENS] == len(want.token_ids)
    assert seen[0] == "CAPPED" and seen[1] == "chunk"  # the cap before any token
    assert got.budget_cap == want.budget_cap and got.admission.decision == "CAPPED"
    assert ids == list(got.token_ids) == list(want.token_ids) and got.text == want.text
    assert got.usage == want.usage and got.finish_reason == want.finish_reason
    t = got.timings
    assert 0 <= t.queue_ms <= t.ttft_ms <= t.total_ms and t.decode_ms >= 0
    wait_until_free(tiny)


def test_the_default_gateway_reads_from_the_worker_with_the_cap_first(tiny, tmp_path_factory):
    gateway = start_gateway(tmp_path_factory, tiny.address)
    try:
        client = openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused",
                               timeout=120, max_retries=0)
        with Client(tiny.address, timeout_s=120, direct=False) as relayed:
            want = relayed.generate("Once upon a time", max_new_tokens=1900, min_new_tokens=24)
        before = samples(tiny.metrics)
        args = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 1900,
                "temperature": 0, "extra_body": {"min_tokens": 24}}
        raw = client.completions.with_raw_response.create(
            **args, stream=True, stream_options={"include_usage": True})
        assert raw.headers["x-ortserve-decision"] == "CAPPED"  # the cap before any token
        chunks = list(raw.parse())
        first = chunks[0].model_extra["ortserve"]
        assert first["budget_cap"]["admitted_max_new_tokens"] == want.budget_cap.admitted_max_new_tokens
        assert "".join(c.choices[0].text for c in chunks if c.choices) == want.text
        usage = next(c.usage for c in chunks if c.usage)
        assert usage.completion_tokens == want.usage.generated_tokens
        assert usage.prompt_tokens == want.usage.prompt_tokens
        assert samples(tiny.metrics)[RELAYED] == before[RELAYED]  # nothing relayed
        assert gateway.log_path.read_text().count("relay call opened") == 1  # its own, to the worker
        wait_until_free(tiny)
    finally:
        stop_service(gateway)


def test_coalesced_sse_events_carry_the_one_per_token_text(tiny, tmp_path_factory):
    """The body's stream_interval_ms: 0 gives an event per token; a long interval groups
    them (the first event not held), the same text. gRPC's: test_direct_path_e2e.py."""
    gateway = start_gateway(tmp_path_factory, tiny.address)
    try:
        client = openai.OpenAI(base_url=f"http://{gateway.address}/v1", api_key="unused",
                               timeout=120, max_retries=0)
        args = {"model": "tiny-llama", "prompt": "Once upon a time", "max_tokens": 120,
                "temperature": 0, "stream": True}
        texts = {}
        for interval in (0, 2_000):
            events = [c.choices[0].text for c in client.completions.create(
                **args, extra_body={"min_tokens": 120, "stream_interval_ms": interval})
                if c.choices and c.choices[0].text]
            texts[interval] = events
        assert "".join(texts[2_000]) == "".join(texts[0])
        assert len(texts[0]) > 2 * len(texts[2_000])  # grouped, not one event per token
        assert len(texts[2_000]) >= 2  # the first event left before the rest were generated
        wait_until_free(tiny)
    finally:
        stop_service(gateway)


def test_a_deadline_on_the_default_path_leaves_nothing_reserved_or_held(slow):
    with Client(slow.address, timeout_s=1.5) as client, pytest.raises(GenerationFailed) as info:
        client.generate("Tell me a long story about a dragon.", max_new_tokens=2000,
                        min_new_tokens=2000)
    assert info.value.code.name == "DEADLINE_EXCEEDED"
    wait_until_free(slow)


KILLED_CLIENT = """
import sys
from ortserve_client import Client
with Client(sys.argv[1], timeout_s=600) as client:
    assert client.direct
    for i, _ in enumerate(client.stream("Tell me a long story.", max_new_tokens=2000,
                                        min_new_tokens=2000)):
        if i == 2:
            print("running", flush=True)
"""


def test_a_killed_client_on_the_default_path_leaves_nothing_reserved_or_held(slow):
    client = subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, slow.address],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "running"
        assert worker_held_bytes(slow.worker_services[0].address) > 0
        client.send_signal(signal.SIGKILL)  # its connection to the worker closes
    finally:
        client.kill()
        client.wait(10)
    wait_until_free(slow)


def test_a_killed_worker_on_the_default_path_fails_the_stream_and_its_lease_expires(
        tmp_path_factory):
    cluster = _cluster(tmp_path_factory, "smollm2-135m-instruct-int4", "256MiB", "default-kill",
                       scheduler_args=["--lease-ttl-s", "2", "--heartbeat-interval-s", "0.5"])
    try:
        with Client(cluster.address, timeout_s=120) as client:
            stream = client.stream("Tell me a long story.", max_new_tokens=2000,
                                   min_new_tokens=2000)
            chunks = iter(stream)
            next(chunks)
            assert reserved_bytes(cluster.address) > 0
            cluster.worker_services[0].process.kill()
            with pytest.raises(GenerationFailed) as info:
                list(chunks)
        assert info.value.code.name == "UNAVAILABLE"
        assert info.value.message.startswith(f"worker {stream.admission.worker_id} at ")
        deadline = time.monotonic() + 30
        while reserved_bytes(cluster.address) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert reserved_bytes(cluster.address) == 0  # the lease expired with its worker
    finally:
        cluster.stop()
