"""The scheduler's channels to the workers (scheduler_service/worker_clients.py)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import grpc

from scheduler_service.worker_clients import WorkerClients


@contextlib.contextmanager
def refusing_port():
    """An address that refuses connections: bound (so no other process takes the port
    meanwhile) and never listening."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{s.getsockname()[1]}"


async def failed_channel(clients: WorkerClients, address: str) -> grpc.aio.Channel:
    clients.stub(address)
    channel = clients._stubs[address][0]
    channel.get_state(try_to_connect=True)
    async with asyncio.timeout(10):
        while channel.get_state() is not grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            await channel.wait_for_state_change(channel.get_state())
    return channel


def test_a_registration_replaces_a_channel_waiting_out_its_reconnect_backoff():
    """A worker restarted on its port registers while the scheduler's channel to that port
    still backs off from the failed attempts: requests placed there meanwhile would fail
    NO_WORKER for seconds. The registration gives the next request a fresh channel."""
    async def run(address: str):
        clients = WorkerClients()
        old_stub = clients.stub(address)
        # The registration reads the channel's state as it comes: on a loaded machine the
        # backoff (0.5-1 s) may end between the wait and the read, the channel then trying
        # again (CONNECTING), which is kept. Caught in TRANSIENT_FAILURE, it is replaced.
        for _attempt in range(5):
            await failed_channel(clients, address)
            clients.registered(address)
            if clients.stub(address) is not old_stub:
                break
        assert clients.stub(address) is not old_stub
        await asyncio.sleep(0)  # the old channel's close runs
        await clients.close()

    with refusing_port() as address:
        asyncio.run(run(address))


def test_a_registration_keeps_a_working_or_idle_channel():
    async def run(address: str):
        clients = WorkerClients()
        stub = clients.stub(address)  # IDLE: never tried, nothing to wait out
        clients.registered(address)
        assert clients.stub(address) is stub
        await clients.close()

    with refusing_port() as address:
        asyncio.run(run(address))
