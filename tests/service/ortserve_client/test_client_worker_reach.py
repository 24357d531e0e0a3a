"""The Python client's default token path: a worker it reaches is read directly, one it
cannot reach (nothing answers in worker_connect_s) is left to the scheduler's relay, said
once in a warning; real channels, an in-process health server."""

from __future__ import annotations

import logging
import socket
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2_grpc
from ortserve_client import Client


@pytest.fixture
def worker_address():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(None)


def closed_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed


def test_a_reachable_worker_is_read_directly_and_asked_once(worker_address):
    with Client("127.0.0.1:1") as client:
        assert client.direct
        assert client._reachable(worker_address)
        assert worker_address in client._reached  # no second check for later requests


def test_an_unreachable_worker_is_relayed_with_one_warning(caplog):
    address = closed_address()
    with Client("127.0.0.1:1", worker_connect_s=0.3) as client, \
            caplog.at_level(logging.WARNING, logger="ortserve_client"):
        assert not client._reachable(address)
        assert not client._reachable(address)  # remembered: no second wait
    warnings = [r.getMessage() for r in caplog.records if r.name == "ortserve_client"]
    assert len(warnings) == 1 and address in warnings[0] and "relayed" in warnings[0]


def test_the_token_path_follows_direct_and_tls():
    with Client("127.0.0.1:1", direct=False) as relayed:
        assert not relayed.direct
    with Client("127.0.0.1:1", direct=True) as strict:
        assert strict.direct and strict._relay_if_unreachable is None
    with Client("127.0.0.1:1", tls=True) as tls:  # no certificate for the workers
        assert not tls.direct
