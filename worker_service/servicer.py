"""WorkerServicer: claims the lease, hands the sequence to the engine thread, streams its events.

Async handlers never block on ORT: the engine runs on its own thread and
its callbacks hop onto the event loop with call_soon_threadsafe.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc
import structlog

from ortserve import rich_status
from ortserve.v1 import types_pb2, worker_pb2, worker_pb2_grpc

from . import convert
from .engine import Cancelled, Completed, Engine, Failed, TokenDelta
from .errors import EngineError, InvalidRequest
from .scheduler_link import SchedulerLink
from .status_map import engine_error_status

log = structlog.get_logger("worker")

_TERMINAL = (Completed, Cancelled, Failed)
CANCEL_WAIT_S = 30.0  # a cancelled sequence leaves within one step; this bounds a stuck one


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, worker_id: str, address: str, requested_device: str) -> None:
        self.worker_id = worker_id
        self.address = address
        self.requested_device = requested_device
        self.engine: Engine | None = None  # set once loaded and the provider verified
        self.link: SchedulerLink | None = None
        self._live: dict[str, types_pb2.Lease] = {}

    def live_leases(self) -> list[types_pb2.Lease]:
        return list(self._live.values())

    async def _ready(self, context) -> Engine:
        if self.engine is None or self.link is None:
            await rich_status.abort(context, grpc.StatusCode.UNAVAILABLE,
                                    f"worker {self.worker_id} is still loading its model; retry "
                                    "when its health check says SERVING",
                                    [rich_status.retry_info(1.0)])
        return self.engine

    async def _abort_engine_error(self, context, error: EngineError) -> None:
        code, message, details = engine_error_status(error)
        await rich_status.abort(context, code, message, details)

    # -- RPCs ------------------------------------------------------------------

    async def Info(self, request, context):
        engine = await self._ready(context)
        spec = engine.spec
        return worker_pb2.WorkerInfo(
            worker_id=self.worker_id, model=spec.name, model_dir=str(spec.model_dir),
            context_length=spec.context_length, bytes_per_token=spec.bytes_per_token,
            capacity_bytes=engine.capacity_bytes, held_bytes=engine.held_bytes(),
            block_tokens=engine.kv.block_tokens, requested_device=self.requested_device,
            device=engine.device, execution_provider=engine.provider, num_layers=spec.num_layers,
            kv_heads=spec.kv_heads, head_dim=spec.head_dim, kv_dtype=str(spec.kv_dtype),
            eos_token_ids=list(spec.eos_token_ids), vocab_size=spec.vocab_size,
            intra_op_threads=engine.intra_op_threads, active_sequences=engine.active_sequences(),
        )

    async def Tokenize(self, request, context):
        engine = await self._ready(context)
        try:
            ids = convert.prompt_ids(engine, request.request)
        except EngineError as error:
            await self._abort_engine_error(context, error)
        return worker_pb2.TokenizeResponse(token_ids=ids, context_length=engine.spec.context_length)

    async def Generate(self, request: worker_pb2.WorkerGenerateRequest, context):
        arrived = time.perf_counter()
        engine = await self._ready(context)
        bound = log.bind(lease_id=request.lease_id, worker_id=self.worker_id,
                         request_id=request.request.request_id)
        # No path bypasses admission: the lease must be live in the scheduler's ledger.
        try:
            lease = await self.link.claim(request.lease_id)
        except grpc.aio.AioRpcError as error:
            code = (grpc.StatusCode.FAILED_PRECONDITION if error.code() == grpc.StatusCode.NOT_FOUND
                    else grpc.StatusCode.UNAVAILABLE)
            await rich_status.abort(
                context, code,
                f"worker {self.worker_id} serves only admitted requests: {error.details()}",
                [rich_status.error_info("NO_LIVE_LEASE", {"lease_id": request.lease_id})])
        self._live[lease.lease_id] = lease
        handle = None
        ended = False  # the engine's terminal event for this sequence has arrived
        events: asyncio.Queue = asyncio.Queue()
        try:
            try:
                ids = convert.prompt_ids(engine, request.request)
                max_new = self._check_against_lease(request.request, ids, lease)
                sequence = convert.sequence_request(request.request, ids, max_new)
                loop = asyncio.get_running_loop()
                handle = engine.submit(sequence, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
            except EngineError as error:
                bound.info("refused", error=str(error))
                await self._abort_engine_error(context, error)
            bound.info("sequence started", prompt_tokens=len(ids), max_new_tokens=max_new,
                       capped=lease.HasField("budget_cap"))
            yield types_pb2.GenerateEvent(
                admission=convert.admission_from_lease(lease, self.worker_id, self.address))
            while True:
                event = await events.get()
                ended = isinstance(event, _TERMINAL)
                if isinstance(event, TokenDelta):
                    yield types_pb2.GenerateEvent(chunk=types_pb2.TokenChunk(
                        token_ids=event.token_ids, text=event.text))
                elif isinstance(event, Completed):
                    finished = convert.finished_to_pb(event, sequence.sampling, lease,
                                                      self.worker_id, engine.provider)
                    finished.timings.queue_ms += (time.perf_counter() - arrived) * 1e3 - event.total_ms
                    bound.info("sequence finished", finish_reason=event.finish_reason,
                               generated_tokens=event.generated_tokens,
                               decode_tokens_per_s=round(event.decode_tokens_per_s, 1))
                    yield types_pb2.GenerateEvent(finished=finished)
                    return
                elif isinstance(event, Failed):
                    await self._abort_engine_error(context, event.error)
                elif isinstance(event, Cancelled):
                    return
        except asyncio.CancelledError:
            bound.info("client cancelled")
            raise
        finally:
            if handle is not None and not ended:
                handle.cancel()
                await self._wait_terminal(events, bound)
            self._live.pop(lease.lease_id, None)
            # The KV buffer is free now: only then do its bytes go back to the ledger.
            freed = await self.link.release(lease.lease_id)
            bound.info("lease released", freed_bytes=freed)

    # -- helpers ------------------------------------------------------------------

    @staticmethod
    def _check_against_lease(request: types_pb2.GenerateRequest, ids: list[int],
                             lease: types_pb2.Lease) -> int:
        """The ceiling to run with; raises when the request is not the one admitted."""
        if len(ids) != lease.prompt_tokens:
            raise InvalidRequest("prompt", f"the prompt is {len(ids):,} tokens but lease "
                                 f"{lease.lease_id} was admitted for {lease.prompt_tokens:,}; "
                                 "admit the same request you send")
        if not request.HasField("max_new_tokens"):
            return lease.max_new_tokens
        if request.max_new_tokens > lease.max_new_tokens:
            raise InvalidRequest("max_new_tokens", f"max_new_tokens {request.max_new_tokens:,} "
                                 f"exceeds the lease's admitted {lease.max_new_tokens:,}; "
                                 "ask for at most that, or admit again")
        return request.max_new_tokens

    @staticmethod
    async def _wait_terminal(events: asyncio.Queue, bound) -> None:
        """Drain events until the engine says the sequence is gone (its KV freed)."""
        deadline = time.monotonic() + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(asyncio.TimeoutError):
                event = await asyncio.wait_for(events.get(), deadline - time.monotonic())
                if isinstance(event, _TERMINAL):
                    return
        bound.error("engine did not end a cancelled sequence in time", wait_s=CANCEL_WAIT_S)
