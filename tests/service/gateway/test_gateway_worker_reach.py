"""The gateway's default token path: a worker it cannot connect to has its requests
relayed by the scheduler, and is read directly again as soon as it answers (a worker
back on its port), not after the recheck meant for one it cannot route to; real
channels, an in-process health server."""

from __future__ import annotations

import asyncio
import socket
import time

import grpc
from grpc_health.v1 import health, health_pb2_grpc

from gateway.direct import RECHECK_S, Workers


def free_address() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed


async def serve_health(address: str) -> grpc.aio.Server:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    server.add_insecure_port(address)
    await server.start()
    return server


async def _a_worker_back_on_its_port_is_read_directly_again() -> float:
    address = free_address()
    workers = Workers(None, relay_if_unreachable=True)
    try:
        assert not await workers.reachable(address)  # nothing listens: relayed
        server = await serve_health(address)  # the worker is back, on the same port
        try:
            back = time.monotonic()
            while not await workers.reachable(address):
                assert time.monotonic() - back < RECHECK_S / 6, "still relayed"
                await asyncio.sleep(0.1)
            return time.monotonic() - back
        finally:
            await server.stop(None)
    finally:
        await workers.close()


def test_a_worker_back_on_its_port_is_read_directly_again():
    asyncio.run(_a_worker_back_on_its_port_is_read_directly_again())


async def _a_worker_still_down_stays_relayed() -> None:
    address = free_address()
    workers = Workers(None, relay_if_unreachable=True)
    try:
        for _ in range(3):
            assert not await workers.reachable(address)
            await asyncio.sleep(1.0)  # past the channel's reconnect backoff: it tried again
    finally:
        await workers.close()


def test_a_worker_still_down_stays_relayed():
    asyncio.run(_a_worker_still_down_stays_relayed())
