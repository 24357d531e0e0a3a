"""A real scheduler server on port 0 with a stand-in worker (Tokenize and Generate), for service tests."""

from __future__ import annotations

import asyncio

import grpc

from ortserve.rpc.error_path import register_service
from ortserve.rules import request_rules
from ortserve.v1 import (
    internal_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    types_pb2,
    worker_pb2,
    worker_pb2_grpc,
)
from scheduler_service.config import SchedulerConfig
from scheduler_service.server import build_server
from tests.aio_thread import LoopThread
from worker_service.relay_call import RelayCall

BPT = 1_024
CTX = 4_096
VOCAB = 1_000


class StandInWorker(worker_pb2_grpc.WorkerServicer):
    """Tokenize: one token per word. Generate: records what it got, emits a few tokens."""

    def __init__(self) -> None:
        self.tokenize_calls = 0
        self.relay_calls = 0
        self.generate_requests: list[worker_pb2.WorkerGenerateRequest] = []

    async def Relay(self, requests, context):
        """As the real worker: each request runs as this stand-in's Generate."""
        self.relay_calls += 1
        await context.send_initial_metadata(())
        async for frames in RelayCall(lambda request: self.Generate(request, context)).serve(requests):
            yield frames

    async def Tokenize(self, request, context):
        self.tokenize_calls += 1
        req = request.request
        ids = (list(req.token_ids.ids) if req.HasField("token_ids")
               else list(range(max(len(req.text.split()), 1))))
        # The real worker's Tokenize validates as its Generate would, the window included.
        max_new = (req.max_new_tokens if req.HasField("max_new_tokens")
                   else max(CTX - len(ids), req.min_new_tokens, 1))
        request_rules.context_window(len(ids), max_new, CTX, req.min_new_tokens)
        return worker_pb2.TokenizeResponse(token_ids=ids, context_length=CTX)

    async def Generate(self, request, context):
        self.generate_requests.append(request)
        await asyncio.sleep(0.05)  # overlap concurrent calls
        yield types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(token_ids=[1, 2], text="ab"))
        yield types_pb2.GenerateEvent(finished=types_pb2.Finished(
            finish_reason=types_pb2.LENGTH))


class Cluster:
    def __init__(self, worker: worker_pb2_grpc.WorkerServicer | None = None, **config) -> None:
        self.loop = LoopThread()
        self.worker = worker if worker is not None else StandInWorker()

        async def start():
            server = grpc.aio.server()
            # Through the one error path, as the real worker: its refusals carry ErrorInfo.
            register_service(server, worker_pb2.DESCRIPTOR.services_by_name["Worker"], self.worker)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            return server, port, await build_server(SchedulerConfig(port=0, internal_port=0,
                                                                    retry_after_s=2.5, **config))

        self._worker_server, worker_port, self.scheduler = self.loop.run(start())
        self.worker_address = f"127.0.0.1:{worker_port}"
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.scheduler.port}")
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)
        # The worker-facing RPCs: the scheduler's internal port, as a worker dials them.
        self.internal_channel = grpc.insecure_channel(f"127.0.0.1:{self.scheduler.internal_port}")
        self.internal = internal_pb2_grpc.SchedulerInternalStub(self.internal_channel)

    def register(self, capacity_tokens: int = 10_000, worker_id: str = "w1", address: str | None = None,
                 vocab_size: int = VOCAB, block_tokens: int = 1, capacity_bytes: int | None = None):
        return self.internal.RegisterWorker(scheduler_pb2.RegisterWorkerRequest(
            worker_id=worker_id, address=address or self.worker_address, model="m",
            context_length=CTX, bytes_per_token=BPT, block_tokens=block_tokens,
            capacity_bytes=capacity_tokens * BPT if capacity_bytes is None else capacity_bytes,
            vocab_size=vocab_size), timeout=5)

    def reserved_bytes(self) -> int:
        return self.stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=5).total_reserved_bytes

    def close(self) -> None:
        self.channel.close()
        self.internal_channel.close()
        self.loop.run(self.scheduler.stop(0))
        self.loop.run(self._worker_server.stop(0))
        self.loop.close()
