"""The gateway's grpc.aio calls to the scheduler: one channel, no HTTP here."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ortserve.process import tracing
from ortserve.rpc import keepalive
from ortserve.rpc.tls import secure_or_insecure_channel
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

SCHEDULER_SERVICE = scheduler_pb2.DESCRIPTOR.services_by_name["Scheduler"].full_name


RUN_OUT_S = 10.0  # the stream ends as soon as the worker has released its lease
_RUNNING_OUT: set[asyncio.Task] = set()


class StreamBroken(Exception):
    """The scheduler's stream broke its contract (no Admission first, no Finished)."""


@dataclass
class OpenStream:
    """A Generate call whose Admission has already arrived."""

    call: grpc.aio.UnaryStreamCall
    admission: types_pb2.Admission

    async def events(self) -> AsyncIterator[types_pb2.GenerateEvent]:
        """Chunks, then the Finished event; raises grpc.RpcError or StreamBroken."""
        while True:
            event = await self.call.read()
            if event is grpc.aio.EOF:
                raise StreamBroken("the scheduler's stream ended without a Finished event")
            if event.WhichOneof("event") == "finished":
                self._run_out()
                yield event
                return
            yield event

    def _run_out(self) -> None:
        """Read the call's end in the background once the Finished is in (nothing follows
        it). Only with tracing on: the grpc instrumentation ends its span for the call when
        its stream is read to the end, and the handlers stop reading at the Finished."""
        if tracing.enabled():
            task = asyncio.ensure_future(self._read_to_end())
            _RUNNING_OUT.add(task)  # a task nobody holds may be collected mid-way
            task.add_done_callback(_RUNNING_OUT.discard)

    async def _read_to_end(self) -> None:
        with contextlib.suppress(grpc.RpcError, asyncio.TimeoutError):
            async with asyncio.timeout(RUN_OUT_S):
                while await self.call.read() is not grpc.aio.EOF:
                    pass

    def cancel(self) -> None:
        # Cancelling the call is what frees the lease: the scheduler cancels
        # the worker's stream, and the worker releases once its KV is freed.
        self.call.cancel()


async def admitted(call: grpc.aio.UnaryStreamCall, what: str) -> OpenStream:
    """`call` (Generate or SessionTurn) once its Admission is in: its Queued events waited
    out, anything else first a StreamBroken; the call is cancelled on any failure."""
    try:
        first = await call.read()
        # A request waiting in the admission queue hears its place first: HTTP has
        # nowhere to put that before the status line, so the gateway waits it out.
        while first is not grpc.aio.EOF and first.WhichOneof("event") == "queued":
            first = await call.read()
    except BaseException:
        call.cancel()
        raise
    if first is grpc.aio.EOF or first.WhichOneof("event") != "admission":
        call.cancel()
        raise StreamBroken(f"the scheduler's {what} did not start with an Admission")
    return OpenStream(call, first.admission)


class Upstream:
    """The scheduler, seen from the gateway."""

    def __init__(self, address: str, request_timeout_s: float, models_cache_s: float,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        """`credentials`: TLS to the scheduler (None: plaintext)."""
        self.address = address
        self.tls = credentials is not None
        self.timeout_s = request_timeout_s
        self._models_cache_s = models_cache_s
        self._channel = secure_or_insecure_channel(address, credentials,
                                                   options=keepalive.CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        # GetBudget answers per caller key (with API keys on, the scheduler checks
        # each): cached per key, so one caller's answer is never another's.
        self._budgets: dict[tuple, tuple[float, scheduler_pb2.Budget]] = {}

    async def open(self, request: types_pb2.GenerateRequest,
                   metadata: Sequence[tuple[str, str]] = ()) -> OpenStream:
        """Start Generate and wait for its Admission, so HTTP status and headers can
        follow from it. Rejections raise grpc.RpcError here, before any byte is sent."""
        call = self._stub.Generate(request, timeout=self.timeout_s, metadata=tuple(metadata))
        return await admitted(call, "stream")

    async def tokenize(self, request: types_pb2.GenerateRequest,
                       metadata: Sequence[tuple[str, str]] = ()) -> types_pb2.PromptTokens:
        return await self._stub.Tokenize(request, timeout=self.timeout_s,
                                         metadata=tuple(metadata))

    async def detokenize(self, request: types_pb2.DetokenizeRequest,
                         metadata: Sequence[tuple[str, str]] = ()) -> types_pb2.DetokenizeResponse:
        return await self._stub.Detokenize(request, timeout=self.timeout_s,
                                           metadata=tuple(metadata))

    @property
    def stub(self) -> scheduler_pb2_grpc.SchedulerStub:
        """The Scheduler stub (the direct path calls Admit and Release on it)."""
        return self._stub

    async def budget(self, timeout_s: float = 5.0,
                     metadata: Sequence[tuple[str, str]] = ()) -> scheduler_pb2.Budget:
        return await self._stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=timeout_s,
                                          metadata=tuple(metadata))

    async def ready(self, timeout_s: float = 2.0) -> bool:
        """The scheduler's own readiness (grpc.health.v1, open without a key): SERVING
        while it has a worker to place on and is not draining."""
        reply = await self._health.Check(health_pb2.HealthCheckRequest(service=SCHEDULER_SERVICE),
                                         timeout=timeout_s)
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    async def models(self, metadata: Sequence[tuple[str, str]] = (), fresh: bool = False
                     ) -> list[scheduler_pb2.ModelBudget]:
        """The served models (Budget.models, sorted by name), from GetBudget with the
        caller's key (cached briefly, per key; `fresh`: asked again now)."""
        now_s = time.monotonic()
        key = tuple(metadata)
        cached = self._budgets.get(key)
        if fresh or cached is None or now_s - cached[0] > self._models_cache_s:
            if len(self._budgets) > 1024:  # many keys: forget them all rather than grow
                self._budgets.clear()
            cached = self._budgets[key] = (now_s, await self.budget(metadata=metadata))
        return list(cached[1].models)

    async def resolve_adapter(self, request: types_pb2.GenerateRequest,
                              metadata: Sequence[tuple[str, str]] = ()) -> None:
        """`model` naming a LoRA adapter (as vLLM takes it): the request becomes its base
        model with that adapter. A served model's own name, or an unknown one, is left for
        the scheduler to resolve (an unknown name is its NOT_FOUND)."""
        if not request.model or request.adapter:
            return
        for fresh in (False, True):  # an adapter loaded since the cached listing
            served = await self.models(metadata, fresh=fresh)
            if any(m.model == request.model for m in served):
                return
            bases = [m.model for m in served if request.model in m.adapters]
            if bases:
                # NOTE: two bases serving adapters of one name: the first by name; a caller
                # that must choose sets model to the base and `adapter` (gRPC) instead.
                request.adapter, request.model = request.model, bases[0]
                return

    async def close(self) -> None:
        await self._channel.close()
