"""WorkerServicer: protobuf in, domain calls, protobuf out. Handlers raise; the one
status table (ortserve.status.status_table) turns what they raise into a status, in one place.

Async handlers never block on ORT: the engine runs on its own thread and its
events hop onto the event loop (lease_lifecycle).
"""

from __future__ import annotations

import asyncio
import time

import structlog

from ortserve.process.version import package_version
from ortserve.rpc.error_path import at_deadline
from ortserve.rules import request_rules
from ortserve.v1 import types_pb2, worker_pb2, worker_pb2_grpc
from worker_service import adapter_admin, convert
from worker_service.core.errors import InvalidWorkerField, NotReady
from worker_service.core.sequence import Cancelled, Completed, Failed, TokenDelta
from worker_service.engine.engine import Engine
from worker_service.lease_lifecycle import LeaseLifecycle
from worker_service.relay_call import RelayCall
from worker_service.session_lifecycle import WorkerSessions

log = structlog.get_logger("worker")


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    def __init__(self, worker_id: str, address: str, requested_device: str) -> None:
        self.worker_id = worker_id
        self.address = address
        self.requested_device = requested_device
        self.leases: LeaseLifecycle | None = None  # set once loaded and the provider verified
        self.draining = False  # SIGTERM: live streams finish, new ones are refused
        self.metrics = None  # WorkerMetrics when --metrics-port is set
        self.stop_metrics = None
        self._sessions: WorkerSessions | None = None
        self._relay_calls: set[RelayCall] = set()

    @property
    def engine(self) -> Engine | None:
        return self.leases.engine if self.leases is not None else None

    def live_leases(self) -> list[types_pb2.Lease]:
        return self.leases.live_leases() if self.leases is not None else []

    def _ready(self) -> LeaseLifecycle:
        if self.leases is None:
            raise NotReady(f"worker {self.worker_id} is still loading its model; retry when its "
                           "health check says SERVING")
        return self.leases

    def live_sessions(self):
        """The sessions held here, for a registration (SchedulerLink.live_sessions)."""
        return self._session_rpcs().live_sessions() if self.leases is not None else []

    async def drop_sessions(self, session_ids: list[str], refused_lease_ids: list[str]) -> None:
        """After a registration, those the scheduler did not restore (SchedulerLink)."""
        if self.leases is not None:
            await self._session_rpcs().drop(session_ids, refused_lease_ids)

    async def stop_unrestored(self, refused_lease_ids: list[str]) -> None:
        """After a registration, the running sequences whose leases the ledger refused."""
        if self.leases is not None:
            stopped = self.leases.stop_unrestored(refused_lease_ids)
            if stopped:
                log.warning("stopped sequences whose leases the scheduler did not restore",
                            lease_ids=stopped)

    def session_rpcs(self) -> WorkerSessions:
        """The session RPCs' core (the server starts its disk tier through it)."""
        return self._session_rpcs()

    def _session_rpcs(self) -> WorkerSessions:
        leases = self._ready()
        if self._sessions is None or self._sessions.leases is not leases:
            self._sessions = WorkerSessions(leases, self.address)
        return self._sessions

    def end_relay_calls(self) -> None:
        """Draining: each Relay call ends once its requests are done (the scheduler opens
        no new one here: it places nothing on a draining worker)."""
        for call in self._relay_calls:
            call.end_when_idle()

    # -- RPCs ------------------------------------------------------------------

    async def Relay(self, requests, context):
        # Headers at once: the scheduler writes nothing before them (ortserve/rpc/relay_client.py).
        await context.send_initial_metadata(())
        call = RelayCall(lambda request: self.Generate(request, context))
        if self.draining:
            call.end_when_idle()
        self._relay_calls.add(call)
        try:
            async for frames in call.serve(requests):
                yield frames
        finally:
            self._relay_calls.discard(call)

    async def OpenSession(self, request, context):
        return await self._session_rpcs().open(request.session_id, request.lease_id)

    async def GetSession(self, request, context):
        return self._session_rpcs().info_pb(request.session_id)

    async def SwapOutSession(self, request, context):
        return await self._session_rpcs().swap_out(request.session_id)

    async def CloseSession(self, request, context):
        return await self._session_rpcs().close(request.session_id)

    async def Info(self, request, context):
        engine = self._ready().engine
        spec = engine.spec
        return worker_pb2.WorkerInfo(
            worker_id=self.worker_id, model=spec.name, model_dir=str(spec.model_dir),
            context_length=spec.context_length, bytes_per_token=spec.bytes_per_token,
            capacity_bytes=engine.capacity_bytes, held_bytes=engine.held_bytes(),
            block_tokens=engine.kv.block_tokens, requested_device=self.requested_device,
            device=engine.device, execution_provider=engine.provider, num_layers=spec.num_layers,
            kv_heads=spec.kv_heads, head_dim=spec.head_dim, kv_dtype=spec.kv_dtype.name,
            eos_token_ids=list(spec.eos_token_ids), vocab_size=spec.vocab_size,
            intra_op_threads=engine.intra_op_threads, active_sequences=engine.active_sequences(),
            speculative=engine.speculative,
            kv_layout=engine.kv_layout, batch_rows=engine.batch_rows,
            max_batch_rows=engine.max_batch_rows, largest_batch=engine.runner.largest_batch,
            nodes_by_provider=engine.nodes_by_provider, version=package_version(),
            nodes_off_device=engine.nodes_off_device,
            kv_allocated_bytes=engine.runtime.allocated_bytes,
            kv_reserved_bytes=engine.runtime.reserved_bytes,
            kv_reserved_overhead_bytes=max(0, engine.runtime.reserved_bytes
                                           - engine.runtime.allocated_bytes),
            held_leases=self._held_leases(engine),
            adapters=adapter_admin.adapters_pb(engine),
        )

    def _held_leases(self, engine: Engine) -> list[worker_pb2.HeldLease]:
        """WorkerInfo.held_leases: the engine keys sequences by lease id and idle sessions
        by session id; a session's lease id comes from the lease lifecycle."""
        sessions = self.leases.sessions.leases if self.leases is not None else {}
        held = []
        for key, nbytes in sorted(engine.held_bytes_by_key().items()):
            lease = sessions.get(key)
            held.append(worker_pb2.HeldLease(lease_id=lease.lease_id, session_id=key,
                                             held_bytes=nbytes) if lease is not None else
                        worker_pb2.HeldLease(lease_id=key, held_bytes=nbytes))
        return held

    async def LoadAdapter(self, request: types_pb2.LoadAdapterRequest, context):
        leases = self._ready()
        request_rules.bounded("name", request.name, request_rules.MAX_WORKER_ID_CHARS)
        if not request.name or not request.path:
            raise InvalidWorkerField("name" if not request.name else "path",
                                 "required: the adapter's name and its .onnx_adapter file's path")
        return await adapter_admin.load(leases.engine, leases.link, request.name, request.path)

    async def UnloadAdapter(self, request: types_pb2.UnloadAdapterRequest, context):
        leases = self._ready()
        return await adapter_admin.unload(leases.engine, leases.link, request.name)

    async def Tokenize(self, request, context):
        engine = self._ready().engine
        req = convert.prepare(request.request, engine.tokenizer, sequence_id="tokenize",
                              context_length=engine.spec.context_length)
        engine.check(req)
        answer = worker_pb2.TokenizeResponse(token_ids=req.prompt_ids,
                                             context_length=engine.spec.context_length)
        if request.request.WhichOneof("prompt") == "chat":
            # The gateway splits a reasoning model's output by these (ortserve/output/reasoning.py).
            answer.reasoning_format = engine.tokenizer.reasoning_format
            answer.prompt_opens_reasoning = engine.tokenizer.opens_reasoning(req.prompt_ids)
            answer.tool_call_format = engine.tokenizer.tool_call_format
            # Accepted, and said: the caller learns its variables changed nothing.
            answer.template_kwargs_unread.extend(engine.tokenizer.unread_template_kwargs(
                request_rules.template_kwargs(request.request.chat.template_kwargs_json)))
        return answer

    async def Detokenize(self, request, context):
        engine = self._ready().engine
        request_rules.token_ids_in_vocab(request.token_ids, engine.spec.vocab_size,
                                         field="token_ids")
        return types_pb2.DetokenizeResponse(
            text=engine.tokenizer.decode(request.token_ids, skip_special_tokens=False),
            model=engine.spec.name)

    async def Generate(self, request: worker_pb2.WorkerGenerateRequest, context):
        arrived = time.perf_counter()
        leases = self._ready()
        if self.draining:
            raise NotReady(f"worker {self.worker_id} is draining (shutting down); the scheduler "
                           "places no new requests here: admit again")
        engine = leases.engine
        inner = request.request
        # Validate and tokenize once, before the lease is touched.
        req = convert.prepare(inner, engine.tokenizer, sequence_id=request.lease_id,
                              forwarded_ids=request.prompt_token_ids, arrived_at=arrived,
                              context_length=engine.spec.context_length)
        session_id = request.session_id
        if session_id:
            self._session_rpcs()._lease(session_id)  # NOT_FOUND before the lease is touched
        async with leases.open(request.lease_id, req, inner.HasField("max_new_tokens"),
                               session_id=session_id,
                               stream_interval_ms=inner.stream_interval_ms) as stream:
            lease = stream.lease
            yield types_pb2.GenerateEvent(
                admission=convert.admission_from_lease(lease, self.worker_id, self.address))
            try:
                async for event in stream.events():
                    if isinstance(event, TokenDelta):
                        yield types_pb2.GenerateEvent(chunk=convert.chunk_to_pb(event,
                                                                                engine.tokenizer))
                    elif isinstance(event, Completed):
                        if self.metrics is not None:
                            self.metrics.completed(event)
                        stream.log.info("sequence finished", finish_reason=event.finish_reason.value,
                                        generated_tokens=event.generated_tokens,
                                        decode_tokens_per_s=round(event.decode_tokens_per_s, 1))
                        finished = convert.finished_to_pb(event, stream.request.sampling, lease,
                                                          self.worker_id, engine.provider)
                        if session_id:
                            # The ledger shrinks before the client hears the turn is over.
                            await stream.shrink()
                            self._session_rpcs().turn_ended(session_id, inner, req.prompt_ids,
                                                            event.text, event.token_ids)
                            finished.session.CopyFrom(self._session_rpcs().info_pb(session_id))
                            finished.session.turn_in_flight = False
                        stream.ended_as, stream.finished = ("finished", ""), finished
                        yield types_pb2.GenerateEvent(finished=finished)
                    elif isinstance(event, Failed):
                        stream.ended_as = ("failed", event.error.reason.value.lower())
                        raise event.error
                    elif isinstance(event, Cancelled):
                        return
            except (asyncio.CancelledError, GeneratorExit):
                if at_deadline(context.time_remaining()):
                    stream.ended_as = ("deadline", "")  # else: cancelled, the caller left
                raise
