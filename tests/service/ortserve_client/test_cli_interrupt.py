"""Ctrl-C in the CLI (issue 52, item 9): the real `ortserve` process against a real
scheduler and a stand-in worker that streams until cancelled. A SIGINT while the stream
runs, or while the Admit waits in the queue, ends the CLI with 130 and "interrupted", the
worker's stream cancelled and the ledger back to what it held before."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ortserve.v1 import scheduler_pb2, types_pb2
from tests.service.fake_cluster import Cluster, StandInWorker

ORTSERVE = Path(sys.executable).with_name("ortserve")


class EndlessWorker(StandInWorker):
    """Generate: a chunk every 50 ms until its caller cancels; says when it started and ended."""

    def __init__(self) -> None:
        super().__init__()
        self.streaming = threading.Event()
        self.cancelled = threading.Event()

    async def Generate(self, request, context):
        self.generate_requests.append(request)
        try:
            while True:
                yield types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(token_ids=[1], text="a"))
                self.streaming.set()
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


@pytest.fixture()
def cluster():
    cluster = Cluster(worker=EndlessWorker())
    cluster.register(capacity_tokens=100)
    yield cluster
    cluster.close()


def wait_until(check, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert check()


def cli(cluster, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [str(ORTSERVE), "--address", f"127.0.0.1:{cluster.scheduler.port}", *args, "generate",
         "--max-new-tokens", "50", "one two three"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "ORTSERVE_DIRECT": ""})


def interrupted(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.rstrip().endswith("ortserve: interrupted"), err
    return err


@pytest.mark.parametrize("path", [[], ["--no-direct"]])
def test_a_sigint_while_streaming_cancels_the_stream_and_frees_the_lease(cluster, path):
    process = cli(cluster, *path)
    wait_until(lambda: cluster.worker.streaming.is_set() or process.poll() is not None)
    assert process.poll() is None, process.stderr.read()
    assert cluster.reserved_bytes() > 0
    interrupted(process)
    assert cluster.worker.cancelled.wait(30)
    wait_until(lambda: cluster.reserved_bytes() == 0)


def test_a_sigint_while_the_admit_waits_in_the_queue_leaves_it(cluster):
    held = cluster.stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
        token_ids=types_pb2.TokenIds(ids=[1, 2]), max_new_tokens=98)), timeout=5)  # all 100
    assert held.decision == types_pb2.ADMITTED
    process = cli(cluster)
    budget = lambda: cluster.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5)  # noqa: E731
    wait_until(lambda: budget().queue_length == 1)
    interrupted(process)
    wait_until(lambda: budget().queue_length == 0)
    assert budget().total_reserved_bytes == held.reserved_bytes  # it took nothing
    assert not cluster.worker.generate_requests
