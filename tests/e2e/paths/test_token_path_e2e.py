"""The token path through real processes: coalesced chunks, the cap first, a cancel's reach.

Client -> scheduler (relays the worker's chunk frames as bytes) -> worker
(tokens that queued behind a busy reader leave as one TokenChunk). The tiny
model keeps the model's share small, so 32 streams load the path itself.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from ortserve_client import Client, GenerationFailed

from devtools.cluster import LocalCluster, model_cache
from tests.e2e.conftest import reserved_bytes, worker_held_bytes

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

STREAMS = 32
NEW_TOKENS = 64


@pytest.fixture(scope="module", params=["shared", "per-request"])
def tiny(tmp_path_factory, request):
    """`--relay-calls shared` (the default: one Worker.Relay call carries every stream) and
    `per-request` (a Worker.Generate call each): the same behaviour either way."""
    model_dir = model_cache() / "models" / "tiny-llama"
    if not (model_dir / "genai_config.json").exists():
        pytest.fail(f"the tiny model is not prepared at {model_dir}: run `make tiny-model`")
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=["1GiB"],
                           scheduler_args=["--relay-calls", request.param],
                           log_dir=tmp_path_factory.mktemp("logs-token-path")).start()
    cluster.relay_calls = request.param
    yield cluster
    cluster.stop()


def relay_calls_opened(cluster: LocalCluster) -> int:
    """The scheduler's log lines for a Relay call opened (one per worker until one ends)."""
    return cluster.services[0].log_path.read_text().count("relay call opened")


def prompts() -> list[list[int]]:
    """STREAMS different token-id prompts (ids inside any vocabulary of the tiny model)."""
    return [[1, *range(100 + 7 * i, 100 + 7 * i + 12)] for i in range(STREAMS)]


def test_concurrent_streams_equal_their_batch_1_greedy_runs_chunk_by_chunk(tiny):
    with Client(tiny.address, timeout_s=300, direct=False) as client:
        alone = [client.generate(p, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
                 for p in prompts()]
        results: list[dict] = [{} for _ in range(STREAMS)]

        def one(i: int, prompt: list[int]) -> None:
            seen: list[str] = []
            stream = client.stream(prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                   on_admission=lambda a: seen.append("admission"))
            chunks = []
            for chunk in stream:
                seen.append("chunk")
                chunks.append(chunk)
            results[i] = {"chunks": chunks, "seen": seen, "result": stream.result}

        threads = [threading.Thread(target=one, args=(i, p)) for i, p in enumerate(prompts())]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    multi = 0
    for ref, got in zip(alone, results, strict=True):
        chunks = got["chunks"]
        # A chunk may carry several tokens; joined, they are the batch-1 greedy run's.
        assert [i for c in chunks for i in c.token_ids] == list(ref.token_ids)
        assert "".join(c.text for c in chunks) == ref.text
        assert got["result"].token_ids == ref.token_ids and got["result"].text == ref.text
        # Usage counts tokens, not messages.
        assert got["result"].usage.generated_tokens == NEW_TOKENS == len(ref.token_ids)
        assert got["result"].usage.prompt_tokens == ref.usage.prompt_tokens
        assert got["seen"][0] == "admission"  # the admission (and any cap) before any token
        assert len(chunks) <= NEW_TOKENS
        multi += sum(len(c.token_ids) > 1 for c in chunks)
        t = got["result"].timings
        assert 0 <= t.queue_ms <= t.ttft_ms <= t.total_ms  # composed once, in order
    print(f"chunks carrying more than one token: {multi}")
    # 32 concurrent streams (and the 32 before them) went over one Relay call, or none.
    assert relay_calls_opened(tiny) == (1 if tiny.relay_calls == "shared" else 0)


def test_a_client_cancel_frees_the_workers_kv_promptly(tiny):
    """The client cancels mid-stream; the worker's KV and the scheduler's ledger are
    back at zero soon after (the figure is printed: docs/benchmarks.md quotes it). The
    two-step path's cancel: test_direct_path_e2e.py."""
    with Client(tiny.address, timeout_s=300, direct=False) as client:
        waits = []
        for _ in range(3):
            stream = client.stream(prompts()[0], max_new_tokens=1500, min_new_tokens=1500)
            for n, _chunk in enumerate(stream):
                if n == 20:
                    break
            assert worker_held_bytes(tiny.worker_services[0].address) > 0
            cancelled = time.perf_counter()
            stream.cancel()
            deadline = cancelled + 10
            while time.perf_counter() < deadline and (
                    worker_held_bytes(tiny.worker_services[0].address)
                    or reserved_bytes(tiny.address)):
                time.sleep(0.005)
            waits.append(time.perf_counter() - cancelled)
            assert worker_held_bytes(tiny.worker_services[0].address) == 0
            assert reserved_bytes(tiny.address) == 0
    print(f"cancel -> worker KV freed and ledger at zero: {[round(w * 1e3) for w in waits]} ms")
    assert min(waits) < 2.0


def test_a_scheduler_killed_mid_stream_leaves_the_worker_holding_nothing(tmp_path_factory):
    """kill -9 of the scheduler ends its Relay call: the worker cancels every sequence on
    it and frees their KV at once (the clients see the scheduler gone, UNAVAILABLE)."""
    model_dir = model_cache() / "models" / "tiny-llama"
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=["1GiB"],
                           log_dir=tmp_path_factory.mktemp("logs-scheduler-kill")).start()
    try:
        worker = cluster.worker_services[0].address
        with Client(cluster.address, timeout_s=60, direct=False) as client:
            streams = [iter(client.stream(p, max_new_tokens=1500, min_new_tokens=1500))
                       for p in prompts()[:4]]
            for stream in streams:
                next(stream)  # each is running
            assert worker_held_bytes(worker) > 0
            killed = time.perf_counter()
            cluster.services[0].process.kill()
            cluster.services[0].process.wait(10)
            while worker_held_bytes(worker) and time.perf_counter() - killed < 10:
                time.sleep(0.005)
            freed_s = time.perf_counter() - killed
            assert worker_held_bytes(worker) == 0
            for stream in streams:
                with pytest.raises(GenerationFailed) as failure:
                    for _ in stream:
                        pass
                assert failure.value.code.name == "UNAVAILABLE", failure.value
        print(f"scheduler killed -> the worker's KV freed: {freed_s * 1e3:.0f} ms")
        assert freed_s < 2.0
    finally:
        cluster.stop()


def test_a_scheduler_that_stops_answering_fails_the_clients_stream_in_seconds(tmp_path_factory):
    """The scheduler stopped (SIGSTOP: its connections stay open, nothing answers): the
    Python client's keepalive gives the call up, UNAVAILABLE, long before its 120 s
    deadline; resumed, the scheduler sees its caller gone, the worker frees the KV and
    the ledger returns to zero."""
    import signal

    model_dir = model_cache() / "models" / "tiny-llama"
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=["1GiB"],
                           log_dir=tmp_path_factory.mktemp("logs-scheduler-stopped")).start()
    scheduler = cluster.services[0].process
    try:
        with Client(cluster.address, timeout_s=120, keepalive_s=1, direct=False) as client:
            stream = iter(client.stream(prompts()[0], max_new_tokens=1500, min_new_tokens=1500))
            next(stream)  # running
            stopped = time.perf_counter()
            scheduler.send_signal(signal.SIGSTOP)
            try:
                with pytest.raises(GenerationFailed) as failure:
                    for _ in stream:
                        pass
                failed_s = time.perf_counter() - stopped
            finally:
                scheduler.send_signal(signal.SIGCONT)
            assert failure.value.code.name == "UNAVAILABLE", failure.value
            print(f"scheduler stopped -> the client's stream failed: {failed_s:.1f} s")
            assert failed_s < 30
        worker = cluster.worker_services[0].address
        deadline = time.monotonic() + 30
        while ((worker_held_bytes(worker) or reserved_bytes(cluster.address))
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert worker_held_bytes(worker) == 0
        assert reserved_bytes(cluster.address) == 0
    finally:
        cluster.stop()


@pytest.mark.parametrize("direct", [False, True], ids=["relayed", "direct"])
def test_many_streams_with_random_cancels_end_complete_or_cancelled_and_hold_nothing(tiny, direct):
    """96 overlapping streams on the worker, a third cancelled at random points: the rest
    each get their whole ids, and the worker and the ledger end holding nothing."""
    rng = random.Random(7)
    plan = [(i, rng.random() < 1 / 3, rng.randrange(1, 20)) for i in range(96)]
    outcomes: list = [None] * len(plan)
    with Client(tiny.address, timeout_s=300, direct=direct) as client:
        def one(i: int, cancel: bool, after: int) -> None:
            prompt = prompts()[i % STREAMS]
            stream = client.stream(prompt, max_new_tokens=48, min_new_tokens=48)
            ids = []
            try:
                for n, chunk in enumerate(stream):
                    ids.extend(chunk.token_ids)
                    if cancel and n == after:
                        stream.cancel()
                        outcomes[i] = "cancelled"
                        return
            except Exception as error:  # noqa: BLE001 - the assertion below names it
                outcomes[i] = error
                return
            outcomes[i] = ids

        threads = [threading.Thread(target=one, args=p) for p in plan]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        alone = {p: client.generate(prompts()[p], max_new_tokens=48, min_new_tokens=48).token_ids
                 for p in range(STREAMS)}
    for (i, _cancel, _after), got in zip(plan, outcomes, strict=True):
        assert not isinstance(got, Exception), f"stream {i}: {got!r}"
        if got != "cancelled":  # a cancel after the last chunk reads as complete
            assert tuple(got) == tuple(alone[i % STREAMS]), i
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (worker_held_bytes(tiny.worker_services[0].address)
                                           or reserved_bytes(tiny.address)):
        time.sleep(0.02)
    assert worker_held_bytes(tiny.worker_services[0].address) == 0
    assert reserved_bytes(tiny.address) == 0


def test_a_worker_killed_and_restarted_on_its_port_serves_again_on_a_new_relay_call(
        tmp_path_factory):
    """kill -9 of the worker fails the streams on its Relay call UNAVAILABLE; the same
    worker back on the same address registers, and the next request opens a new call."""
    from devtools.cluster import wait_serving

    model_dir = model_cache() / "models" / "tiny-llama"
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=["1GiB"],
                           log_dir=tmp_path_factory.mktemp("logs-worker-restart")).start()
    try:
        old = cluster.worker_services[0]
        port = old.address.rsplit(":", 1)[1]
        with Client(cluster.address, timeout_s=60, direct=False) as client:
            want = client.generate(prompts()[0], max_new_tokens=16, min_new_tokens=16)
            streams = [iter(client.stream(p, max_new_tokens=1500, min_new_tokens=1500))
                       for p in prompts()[:3]]
            for stream in streams:
                next(stream)
            old.process.kill()
            old.process.wait(10)
            for stream in streams:
                with pytest.raises(GenerationFailed) as failure:
                    for _ in stream:
                        pass
                assert failure.value.code.name == "UNAVAILABLE", failure.value
            cluster.services.remove(old)
            wait_serving(cluster.start_worker(0, ["--port", port]))  # SERVING once registered
            again = client.generate(prompts()[0], max_new_tokens=16, min_new_tokens=16)
            assert again.token_ids == want.token_ids
        deadline = time.monotonic() + 10
        while reserved_bytes(cluster.address) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reserved_bytes(cluster.address) == 0  # the killed worker's leases went with it
        assert cluster.services[0].log_path.read_text().count("relay call opened") == 2
    finally:
        cluster.stop()


def test_a_worker_that_stops_answering_fails_its_streams_in_seconds_not_at_their_deadline(
        tmp_path_factory):
    """A worker stopped (SIGSTOP: its connection stays open, nothing answers, as with a host
    gone without a reset) fails the streams on its Relay call UNAVAILABLE once a keepalive
    ping goes unanswered, long before their 120 s deadline; resumed, it frees their KV and
    the ledger returns to zero."""
    import signal

    model_dir = model_cache() / "models" / "tiny-llama"
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=["1GiB"],
                           scheduler_args=["--worker-keepalive-s", "1"],
                           log_dir=tmp_path_factory.mktemp("logs-worker-stopped")).start()
    worker = cluster.worker_services[0]
    try:
        with Client(cluster.address, timeout_s=120, direct=False) as client:
            want = client.generate(prompts()[0], max_new_tokens=16, min_new_tokens=16)
            streams = [iter(client.stream(p, max_new_tokens=1500, min_new_tokens=1500))
                       for p in prompts()[:3]]
            for stream in streams:
                next(stream)  # each is running
            stopped = time.perf_counter()
            worker.process.send_signal(signal.SIGSTOP)
            try:
                for stream in streams:
                    with pytest.raises(GenerationFailed) as failure:
                        for _ in stream:
                            pass
                    assert failure.value.code.name == "UNAVAILABLE", failure.value
                    assert worker.address in str(failure.value) or "worker-0" in str(failure.value)
                failed_s = time.perf_counter() - stopped
            finally:
                worker.process.send_signal(signal.SIGCONT)
            print(f"worker stopped -> its streams failed: {failed_s:.1f} s")
            assert failed_s < 30  # pings every 1 s, each answered within 1 s or given up
            deadline = time.monotonic() + 30
            while ((worker_held_bytes(worker.address) or reserved_bytes(cluster.address))
                   and time.monotonic() < deadline):
                time.sleep(0.05)
            assert worker_held_bytes(worker.address) == 0
            assert reserved_bytes(cluster.address) == 0
            again = client.generate(prompts()[0], max_new_tokens=16, min_new_tokens=16)
            assert again.token_ids == want.token_ids
    finally:
        cluster.stop()


def test_a_worker_with_two_rows_runs_six_streams_two_at_a_time_all_complete(tmp_path_factory):
    """--max-batch-rows 2: six admitted streams, at most two running; the rest wait for a
    row (their KV reserved) and every one ends with the batch-1 greedy ids."""
    from ortserve.v1 import worker_pb2
    from tests.e2e.conftest import worker_stub

    model_dir = model_cache() / "models" / "tiny-llama"
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1, kv_capacities=["1GiB"],
                           worker_args=["--max-batch-rows", "2"],
                           log_dir=tmp_path_factory.mktemp("logs-two-rows")).start()
    try:
        worker = worker_stub(cluster.worker_services[0].address)
        assert worker.Info(worker_pb2.InfoRequest(), timeout=10).max_batch_rows == 2
        with Client(cluster.address, timeout_s=120) as client:
            alone = [client.generate(p, max_new_tokens=24, min_new_tokens=24).token_ids
                     for p in prompts()[:6]]
            got: list = [None] * 6

            def one(i: int) -> None:
                got[i] = client.generate(prompts()[i], max_new_tokens=24,
                                         min_new_tokens=24).token_ids

            threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        assert got == alone
        assert worker.Info(worker_pb2.InfoRequest(), timeout=10).largest_batch <= 2
        assert reserved_bytes(cluster.address) == 0
    finally:
        cluster.stop()


def test_placement_sends_a_stream_to_a_worker_with_a_row_free_before_more_free_bytes(
        tmp_path_factory):
    """worker-1 has twice worker-0's bytes and one row: the first stream goes there (most
    free bytes), the second to worker-0, which has a row free, instead of waiting behind
    the first for worker-1's row."""
    from devtools.cluster import wait_serving

    model_dir = model_cache() / "models" / "tiny-llama"
    cluster = LocalCluster(model_dir=model_dir, workers=1, threads=1,
                           kv_capacities=["1GiB", "2GiB"],
                           log_dir=tmp_path_factory.mktemp("logs-rows-placement")).start()
    try:
        wait_serving(cluster.start_worker(1, ["--max-batch-rows", "1"]))
        cluster.wait_registered(2)
        with Client(cluster.address, timeout_s=120) as client:
            placed: list[str] = []
            streams = []
            for prompt in prompts()[:2]:
                # One after the other: a stream's call starts when it is made, so two made
                # together may reach the scheduler in either order.
                streams.append(iter(client.stream(
                    prompt, max_new_tokens=1500, min_new_tokens=1500,
                    on_admission=lambda a: placed.append(a.worker_id))))
                next(streams[-1])  # admitted and running
            assert placed == ["worker-1", "worker-0"]
            for stream in streams:
                stream.close()
        deadline = time.monotonic() + 10
        while reserved_bytes(cluster.address) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reserved_bytes(cluster.address) == 0
    finally:
        cluster.stop()
