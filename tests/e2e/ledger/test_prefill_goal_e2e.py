"""Prompt chunks held to the decoding streams' gap goal, through real processes: a scheduler
and one worker on the default model (docs/features/time-budget.md, "The rule").

Read by steps, not by time: a long prompt arriving while streams decode runs in the
configured chunks (512 tokens) when no stream has a goal, and in more, smaller chunks when
they have one it would pass; the worker's /metrics count the chunks. The scheduler here
hears no step timing (its heartbeat interval is longer than the test), so it admits by
bytes alone and a 1 ms goal, which its time rule would refuse, reaches the worker: the
worker's rule is what is read, with its floor (a prompt still moves).

Not the tiny model: on a fast CPU its two streams' 1,500 steps (its context holds no more)
could end before the long prompt's chunks ran beside them. SmolLM2-135M fp32 decodes them
for tens of seconds on any CPU.
"""

from __future__ import annotations

import socket
import threading
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from devtools.cluster import LocalCluster
from ortserve.v1 import scheduler_pb2, types_pb2
from tests.e2e.conftest import require_model, scheduler_stub

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

CHUNK_TOKENS = 512  # the worker's --prefill-chunk-tokens default
LONG_PROMPT_TOKENS = 900  # 512 + 388: two chunks with no goal


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def quiet_scheduler(tmp_path_factory):
    port = free_port()
    cluster = LocalCluster(model_dir=require_model(),
                           log_dir=tmp_path_factory.mktemp("logs-prefill-goal"),
                           # No heartbeat, so no step timing, for the test's length.
                           scheduler_args=["--heartbeat-interval-s", "600", "--lease-ttl-s", "1800"],
                           worker_args=["--metrics-port", str(port)]).start()
    cluster.metrics_port = port
    yield cluster
    cluster.stop()


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {s.name: s.value for family in text_string_to_metric_families(text)
            for s in family.samples}


class Decoding:
    """A stream decoding in a thread; `started` once its first token came."""

    def __init__(self, stub, first_id: int, max_itl_ms: int) -> None:
        self.started = threading.Event()
        self.finished = threading.Event()
        self.call = stub.Generate(types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=[first_id, 5, 6, 7]), max_new_tokens=1_500,
            ignore_eos=True, max_itl_ms=max_itl_ms), timeout=600)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for event in self.call:
                if event.HasField("chunk"):
                    self.started.set()
        except Exception:  # cancelled by the test
            pass
        finally:
            self.finished.set()
            self.started.set()

    def stop(self) -> None:
        self.call.cancel()
        self.thread.join(60)


def chunks_of_a_long_prompt(cluster, max_itl_ms: int, first_id: int) -> tuple[int, float]:
    """(prompt chunks the long prompt ran in, the budget gauge after it) while two streams
    with this gap goal decode."""
    stub = scheduler_stub(cluster.address)
    streams = [Decoding(stub, first_id + i, max_itl_ms) for i in (1, 2)]
    try:
        for stream in streams:
            assert stream.started.wait(120) and not stream.finished.is_set()
        before = scrape(cluster.metrics_port)["ortserve_worker_prompt_chunks_total"]
        # Distinct ids each call: no prefix cache hit shortens the prompt.
        ids = [first_id, *((first_id * 7 + i) % 30_000 + 100 for i in range(LONG_PROMPT_TOKENS - 1))]
        events = list(stub.Generate(types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=ids), max_new_tokens=1), timeout=300))
        assert events[-1].finished.usage.prompt_tokens == LONG_PROMPT_TOKENS
        assert events[-1].finished.usage.cached_tokens == 0
        after = scrape(cluster.metrics_port)
        # The streams decoded all along: every chunk shared its step with them.
        assert not any(stream.finished.is_set() for stream in streams)
    finally:
        for stream in streams:
            stream.stop()
    (worker,) = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=10).workers
    assert not worker.time_measured  # admitted by bytes: the worker's rule is what ran
    return (int(after["ortserve_worker_prompt_chunks_total"] - before),
            after["ortserve_worker_prefill_budget_tokens"])


def test_a_long_prompt_beside_streams_with_no_goal_runs_in_the_configured_chunks(quiet_scheduler):
    chunks, budget = chunks_of_a_long_prompt(quiet_scheduler, max_itl_ms=0, first_id=1_000)
    assert chunks == 2  # 512 + 388
    assert budget == CHUNK_TOKENS


def test_a_long_prompt_beside_streams_with_a_goal_runs_in_more_smaller_chunks(quiet_scheduler):
    # 1 ms: no step of two decodes and a chunk fits it, so the chunks shrink toward the
    # floor (3 tokens), and the prompt still completes.
    chunks, budget = chunks_of_a_long_prompt(quiet_scheduler, max_itl_ms=1, first_id=2_000)
    print(f"chunks {chunks}, budget {budget}")
    assert chunks > 2 * 4  # chunks of at most ~a quarter of 512 on average
    assert budget < CHUNK_TOKENS
