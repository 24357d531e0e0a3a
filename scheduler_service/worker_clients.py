"""Channels to the workers, one per address, reused across requests."""

from __future__ import annotations

import grpc

from ortserve.tls import secure_or_insecure_channel
from ortserve.v1 import worker_pb2_grpc


class WorkerClients:
    def __init__(self, credentials: grpc.ChannelCredentials | None = None) -> None:
        self._credentials = credentials  # TLS towards workers; None: plaintext
        self._stubs: dict[str, tuple[grpc.aio.Channel, worker_pb2_grpc.WorkerStub]] = {}

    def stub(self, address: str) -> worker_pb2_grpc.WorkerStub:
        entry = self._stubs.get(address)
        if entry is None:
            channel = secure_or_insecure_channel(address, self._credentials)
            entry = (channel, worker_pb2_grpc.WorkerStub(channel))
            self._stubs[address] = entry
        return entry[1]

    async def forget(self, address: str) -> None:
        entry = self._stubs.pop(address, None)
        if entry is not None:
            await entry[0].close()

    async def close(self) -> None:
        for address in list(self._stubs):
            await self.forget(address)
