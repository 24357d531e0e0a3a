"""Channels to the workers, one per address, reused across requests."""

from __future__ import annotations

import grpc

from ortserve.tls import secure_or_insecure_channel
from ortserve.v1 import worker_pb2, worker_pb2_grpc


class RelayingWorkerStub(worker_pb2_grpc.WorkerStub):
    """The Worker stub whose Generate yields each event as its serialized bytes: the relay
    reads the first byte (which event) and parses only the Finished (relay.py)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel)
        self.Generate = channel.unary_stream(
            "/ortserve.v1.Worker/Generate",
            request_serializer=worker_pb2.WorkerGenerateRequest.SerializeToString,
            response_deserializer=None)  # None: the frame's bytes as they came


class WorkerClients:
    def __init__(self, credentials: grpc.ChannelCredentials | None = None) -> None:
        self._credentials = credentials  # TLS towards workers; None: plaintext
        self._stubs: dict[str, tuple[grpc.aio.Channel, RelayingWorkerStub]] = {}

    def stub(self, address: str) -> RelayingWorkerStub:
        entry = self._stubs.get(address)
        if entry is None:
            channel = secure_or_insecure_channel(address, self._credentials)
            entry = (channel, RelayingWorkerStub(channel))
            self._stubs[address] = entry
        return entry[1]

    async def forget(self, address: str) -> None:
        entry = self._stubs.pop(address, None)
        if entry is not None:
            await entry[0].close()

    async def close(self) -> None:
        for address in list(self._stubs):
            await self.forget(address)
