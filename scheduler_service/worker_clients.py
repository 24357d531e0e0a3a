"""Channels to the workers, one per address, reused across requests."""

from __future__ import annotations

import asyncio

import grpc

from ortserve.rpc import keepalive
from ortserve.rpc.relay_client import RelayClient, generate_call
from ortserve.rpc.tls import secure_or_insecure_channel
from ortserve.v1 import worker_pb2_grpc


class RelayingWorkerStub(worker_pb2_grpc.WorkerStub):
    """The Worker stub whose Generate yields each event as its serialized bytes: the relay
    reads the first byte (which event) and parses only the Finished (relay.py).

    With a shared relay, Generate starts the request on the worker's one Relay call
    (ortserve/rpc/relay_client.py) and answers the same bytes and failures as a call of its own.
    """

    def __init__(self, channel: grpc.aio.Channel, address: str, shared_relay: bool) -> None:
        super().__init__(channel)
        self.relay = RelayClient(channel, address) if shared_relay else None
        self.Generate = self.relay.generate if self.relay is not None else generate_call(channel)


class WorkerClients:
    def __init__(self, credentials: grpc.ChannelCredentials | None = None,
                 shared_relay: bool = True,
                 keepalive_s: float = keepalive.DEFAULT_INTERVAL_S) -> None:
        self._credentials = credentials  # TLS towards workers; None: plaintext
        self._shared_relay = shared_relay
        # A worker gone silent fails its streams in ~2x this, not at their deadlines.
        self._options = keepalive.channel_options(keepalive_s)
        self._stubs: dict[str, tuple[grpc.aio.Channel, RelayingWorkerStub]] = {}
        self._closing: set[asyncio.Task] = set()

    def stub(self, address: str) -> RelayingWorkerStub:
        entry = self._stubs.get(address)
        if entry is None:
            channel = secure_or_insecure_channel(address, self._credentials, options=self._options)
            entry = (channel, RelayingWorkerStub(channel, address, self._shared_relay))
            self._stubs[address] = entry
        return entry[1]

    def channel(self, address: str) -> grpc.aio.Channel:
        """The channel to `address` that stub(address) calls on (a health check's)."""
        self.stub(address)
        return self._stubs[address][0]

    def registered(self, address: str) -> None:
        """A worker (re)registered at `address`: it may be a new version, one that serves
        Relay where the one before did not, so the next request tries Relay again.

        A channel that failed to reach the worker before (TRANSIENT_FAILURE: a worker
        restarted on the same port) would wait out its reconnect backoff, seconds in which
        every request placed there fails NO_WORKER though the worker is up: it is replaced.
        Nothing runs on a channel in that state, so closing it loses no call."""
        entry = self._stubs.get(address)
        if entry is None:
            return
        if entry[0].get_state(try_to_connect=False) is grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            del self._stubs[address]
            task = asyncio.get_running_loop().create_task(self._close(entry))
            self._closing.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._closing.discard)
        elif entry[1].relay is not None:
            entry[1].relay.unsupported = False

    async def forget(self, address: str) -> None:
        entry = self._stubs.pop(address, None)
        if entry is not None:
            await self._close(entry)

    @staticmethod
    async def _close(entry: tuple[grpc.aio.Channel, RelayingWorkerStub]) -> None:
        if entry[1].relay is not None:
            await entry[1].relay.close()
        await entry[0].close()

    async def close(self) -> None:
        for address in list(self._stubs):
            await self.forget(address)
