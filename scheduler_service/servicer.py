"""SchedulerServicer: protobuf in, ledger calls, protobuf out; Generate admits, then relays.

The queue wait is queue_wait.py's, the worker's stream relay.py's (both shared with SessionTurn);
the session RPCs are sessions/rpcs.py's, composed in (sessions/build.py) and delegated to.
Handlers raise (DomainError, Relayed); ortserve.rpc.error_path maps every failure
through the one table (ortserve.status.status_table) in one place.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from dataclasses import replace

import grpc
import structlog

from ortserve.rpc.auth import Role, caller_has, require_role
from ortserve.rpc.error_path import Relayed
from ortserve.rpc.worker_leg import worker_request
from ortserve.rules import request_rules
from ortserve.status.errors import DomainError, ErrorReason, InvalidField
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2, worker_pb2
from scheduler_service import convert, spans
from scheduler_service.adapter_admin import AdapterAdmin
from scheduler_service.adapter_catalog import OnDemand
from scheduler_service.config import SchedulerConfig
from scheduler_service.decision_log import log_expired
from scheduler_service.lease_secrets import LeaseSecrets
from scheduler_service.least_busy import NoneAnswered, on_least_busy
from scheduler_service.ledger import placement
from scheduler_service.ledger.ledger import (
    AdmissionDecision,
    Cause,
    Decision,
    Ledger,
    no_worker_rejection,
)
from scheduler_service.ledger.queue import Ticket
from scheduler_service.model_server_metrics import ledger_budget
from scheduler_service.prompt_count import count_prompt, noted_by_worker
from scheduler_service.queue_wait import AdmissionWait, QueueWaiter
from scheduler_service.rejections import rejection_error
from scheduler_service.relay import Leg, relay
from scheduler_service.request_outcome import RequestOutcome, request_outcome
from scheduler_service.sessions.build import Sessions
from scheduler_service.sessions.stored_rpcs import StoredResponseRPCs
from scheduler_service.tenant_of import caller_tenant
from scheduler_service.worker_clients import WorkerClients

log = structlog.get_logger("scheduler")


@contextmanager
def _under(prefix: str) -> Iterator[None]:
    """Name fields from the caller's message root (AdmitRequest's are under "request.")."""
    try:
        yield
    except InvalidField as error:
        numbers = {k: v for k, v in error.metadata.items() if k != "field"}
        raise InvalidField(prefix + error.field, error.message.split(": ", 1)[-1],
                           **numbers) from None


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, config: SchedulerConfig, ledger: Ledger, workers: WorkerClients,
                 waiter: QueueWaiter, sessions: Sessions, metrics=None,
                 secrets: LeaseSecrets | None = None) -> None:
        self._config = config
        self._secrets = secrets or LeaseSecrets()
        self._ledger = ledger
        self._workers = workers
        self._waiter = waiter
        self._sessions = sessions
        self._metrics = metrics  # SchedulerMetrics when --metrics-port is set
        self._adapters = AdapterAdmin(ledger, workers)
        self._on_demand = OnDemand(config.adapter_catalog, ledger, self._adapters.load)
        # Beside the sessions whose KV they continue; each record its caller's tenant's.
        self._stored = StoredResponseRPCs(tenants=lambda: self._ledger.tenants)

    # -- admission -------------------------------------------------------------

    def _model(self, requested: str) -> str:
        """The request's model as resolved against the models workers serve now (raises
        MODEL_NOT_FOUND, or INVALID_REQUEST on `model`: placement.resolve_model)."""
        return placement.resolve_model(requested, {w.geometry.model for w in self._ledger.snapshot()})

    async def _admit(self, request: types_pb2.GenerateRequest, dry_run: bool,
                     wait_s: float | None = None, deadline_s: float | None = None,
                     context=None, two_step: bool = False,
                     stream_deadline_s: float | None = None,
                     ) -> tuple[AdmissionDecision | Ticket, list[int], dict]:
        """The ledger's decision now, or (not dry_run) a Ticket in the admission queue; the
        prompt's ids; what the Admission passes on of the prompt (`noted_by_worker`)."""
        # Every rule the request alone is held to (sampling ranges included), before a
        # worker is asked to count it and before any byte is reserved.
        request_rules.generate_request(request)
        tenant = caller_tenant(self._ledger.tenants, context) if context is not None else ""
        model = self._model(request.model)  # before any worker is asked anything
        # A catalogued adapter no worker serves is loaded first (charged to the worker
        # that takes it), never on a dry run: that answers as things stand.
        if not dry_run:
            await self._on_demand.ensure(request.adapter, model)
        # An adapter no worker of the model serves: NOT_FOUND, before anything is reserved.
        placement.resolve_adapter(request.adapter, model, self._ledger.snapshot())
        default = self._config.default_max_new_tokens.for_model(model)
        prompt = await count_prompt(request, model, self._ledger, self._workers)
        if isinstance(prompt, str):
            n_known = len(request.token_ids.ids) if request.WhichOneof("prompt") == "token_ids" else 0
            domain = convert.admission_request(request, max(n_known, 1))  # validates the numbers
            return no_worker_rejection(
                request.request_id, n_known, domain.min_new_tokens, self._config.retry_after_s,
                registered_workers=len(placement.serving(self._ledger.snapshot(), model)),
                worker_error="" if prompt == "no worker registered" else prompt, model=model), [], {}
        if prompt.window_refusal is not None:
            # The ledger decides this refusal too (never reserving), so it is a REJECTED with
            # its Rejection, counted, and Admit's answer, exactly as for a token-id prompt.
            domain = convert.admission_request(request, prompt.window_refused_tokens, model,
                                               default_max_new_tokens=default)
            admission = self._ledger.admit(domain, dry_run=True)
            rejection = admission.rejection
            if rejection is None or rejection.cause is not Cause.CONTEXT_LENGTH_EXCEEDED:
                raise Relayed(prompt.window_refusal) from None  # the worker's window stands
            return replace(admission, dry_run=dry_run), [], {}
        domain = convert.admission_request(request, len(prompt.token_ids), model,
                                           prompt_ids=prompt.token_ids, tenant=tenant,
                                           default_max_new_tokens=default, two_step=two_step)
        # Generate's deadline bounds its whole stream: a time cap may fit max_new_tokens to
        # it (time_budget.py). Admit's bounds only the admission: its caller says the
        # stream's (AdmitRequest.stream_deadline_ms), or none is known.
        stream_s = stream_deadline_s if two_step else deadline_s
        if stream_s is not None:
            domain = replace(domain, deadline_at=time.monotonic() + stream_s)
        if dry_run:
            admission = self._ledger.admit(domain, dry_run=True)
        else:
            await self._sessions.reclaimer.make_room(domain)  # idle sessions' bytes before a cap
            admission = self._waiter.submit(domain, convert.queue_mode(request), wait_s=wait_s,
                                            deadline_s=deadline_s)
        log_expired(self._ledger.take_expired(), self._metrics)  # admit() already expired
        return admission, prompt.token_ids, {"reasoning_format": prompt.reasoning_format,
                                             "prompt_opens_reasoning": prompt.opens_reasoning,
                                             "tool_call_format": prompt.tool_call_format,
                                             "template_kwargs_unread":
                                                 prompt.template_kwargs_unread}

    def _kick(self) -> None:
        self._waiter.kick()

    def _outcome(self, rpc: str, context) -> RequestOutcome:
        """The request's one outcome, counted at its exit (request_outcome.py)."""
        return request_outcome(rpc, context, self._metrics)

    def _count(self, admission: AdmissionDecision) -> None:
        if self._metrics is not None:
            self._metrics.admission(admission)

    async def Admit(self, request: scheduler_pb2.AdmitRequest, context):
        arrived = time.perf_counter()
        inner = types_pb2.GenerateRequest()
        inner.CopyFrom(request.request)
        inner.request_id = inner.request_id or uuid.uuid4().hex[:16]
        wait_s = request.max_queue_wait_ms / 1e3 if request.max_queue_wait_ms else 0.0
        with _under("request."):
            admission, _, noted = await self._admit(inner, dry_run=request.dry_run,
                                                    wait_s=wait_s,
                                                    deadline_s=context.time_remaining(),
                                                    context=context, two_step=True,
                                                    stream_deadline_s=(
                                                        request.stream_deadline_ms / 1e3
                                                        if request.stream_deadline_ms else None))
        # Admit's way: no Queued events (the Places go by unsent), no "queued" line.
        wait = AdmissionWait(self._waiter, admission, log.bind(request_id=inner.request_id),
                             queued_line=None)
        admission = noted_by_worker(await wait.decided(), noted)
        self._count(admission)
        # The two-step path's trace (the gateway's and the client's default): the same
        # admission span and decision attributes as Generate's, on Admit's own span.
        spans.decided(admission, arrived, wait.queued_perf_s)
        lease = admission.lease
        log.info("admit", request_id=inner.request_id, decision=admission.decision.value,
                 lease_id=lease.lease_id if lease else None, dry_run=request.dry_run,
                 worker_id=admission.worker.worker_id if admission.worker else None,
                 model=admission.worker.model if admission.worker else inner.model,
                 max_new_tokens=admission.max_new_tokens, reserved_bytes=admission.reserved_bytes)
        answer = convert.admission_to_pb(admission)
        if lease is not None:
            answer.lease_secret = self._secrets.of(lease.lease_id)  # only this caller learns it
        return answer

    async def Release(self, request: scheduler_pb2.ReleaseRequest, context):
        request_rules.bounded("lease_id", request.lease_id, request_rules.MAX_LEASE_ID_CHARS)
        if request.worker_id:
            raise InvalidField("worker_id", "set only by a worker, on SchedulerInternal."
                               "ReleaseClaimed (the scheduler's internal port); a caller releases "
                               "its own unclaimed lease with lease_id and lease_secret",
                               worker_id_chars=len(request.worker_id))
        self._secrets.check(request.lease_id, request.lease_secret)  # before the ledger is touched
        freed = self._ledger.release(request.lease_id, "")
        log.info("release", lease_id=request.lease_id, freed_bytes=freed)
        if freed:
            self._kick()
        return scheduler_pb2.ReleaseResponse(freed_bytes=freed, released=freed > 0)

    # -- tokenizer passthrough (the gateway's /tokenize and /detokenize) -------------

    async def Tokenize(self, request: types_pb2.GenerateRequest, context):
        # Nothing is charged, but tenant metadata this scheduler cannot honour is refused
        # here as on every call that reads it (tenants.md: never silently ignored).
        caller_tenant(self._ledger.tenants, context)
        request_rules.request_shape(request)
        model = self._model(request.model)
        answer = await self._on_a_worker(model, lambda stub: stub.Tokenize(
            worker_pb2.TokenizeRequest(request=request), timeout=10.0))
        return types_pb2.PromptTokens(token_ids=answer.token_ids,
                                      context_length=answer.context_length, model=model)

    async def Detokenize(self, request: types_pb2.DetokenizeRequest, context):
        caller_tenant(self._ledger.tenants, context)  # as Tokenize
        model = self._model(request.model)
        return await self._on_a_worker(model, lambda stub: stub.Detokenize(request, timeout=10.0))

    async def _on_a_worker(self, model: str, call):
        """`call(worker stub)` on the least busy worker of `model` that answers (one model,
        one tokenizer); a worker's judgement (INVALID_ARGUMENT, ...) is relayed as is."""
        try:
            # Unreachable workers last: one may have come back before its heartbeat says so.
            return await on_least_busy(self._ledger, self._workers,
                                       placement.serving(self._ledger.snapshot(), model), call,
                                       "the call", first=lambda w: w.unreachable)
        except grpc.aio.AioRpcError as error:
            raise Relayed(error) from None
        except NoneAnswered as none:
            if none.unavailable is not None:
                raise Relayed(none.unavailable) from None
            if none.reasons:
                raise DomainError(ErrorReason.NO_WORKER, "no worker of the model answered: "
                                  + "; ".join(none.reasons) + "; retry when one does",
                                  metadata={"model": model}) from None
        raise DomainError(ErrorReason.NO_WORKER, "no worker is registered to tokenize with; "
                          "start a worker (or wait for one to register) and retry",
                          metadata={"model": model})

    async def GetBudget(self, request: scheduler_pb2.GetBudgetRequest, context):
        if request.include_leases:  # every caller's lease ids: an operator's view
            require_role(Role.ADMIN, "GetBudget with include_leases")
        log_expired(self._ledger.expire(), self._metrics)
        self._kick()  # serve what fits before showing the queue
        budget = ledger_budget(self._ledger, self._waiter.queue, request.include_leases)
        usage = self._ledger.tenant_usage()
        if not caller_has(Role.ADMIN):  # another tenant's standing is an operator's view
            own = caller_tenant(self._ledger.tenants, context)
            usage = [u for u in usage if u.tenant == own]
        budget.tenants.extend(convert.tenants_to_pb(usage, self._waiter.queue.tenant_stats()))
        budget.tenants_source = self._ledger.tenants.source
        budget.queue_aging_s = self._waiter.queue.aging_s
        return budget

    # -- the front door --------------------------------------------------------------

    async def Generate(self, request: types_pb2.GenerateRequest, context):
        arrived = time.perf_counter()
        with self._outcome("generate", context) as outcome:
            # NOTE: request_id is a label for logs, never a key: two callers may share one.
            inner = types_pb2.GenerateRequest()
            inner.CopyFrom(request)
            inner.request_id = request.request_id or uuid.uuid4().hex[:16]
            wait_s = inner.max_queue_wait_ms / 1e3 if inner.HasField("max_queue_wait_ms") else None
            admission, prompt_ids, noted = await self._admit(
                inner, dry_run=False, wait_s=wait_s, deadline_s=context.time_remaining(),
                context=context)
            bound = log.bind(request_id=inner.request_id)
            wait = AdmissionWait(self._waiter, admission, bound)
            async with aclosing(wait.places()) as places:
                async for place in places:
                    yield types_pb2.GenerateEvent(queued=convert.place_to_pb(place))
            admission = wait.admission
            self._count(admission)
            spans.decided(admission, arrived, wait.queued_perf_s)
            if admission.decision is Decision.REJECTED:
                bound.info("rejected", cause=admission.rejection.cause.value)
                raise rejection_error(admission.rejection)
            admission = noted_by_worker(admission, noted)
            leg = self._generate_leg(admission, inner, prompt_ids, bound, outcome)
            outcome.relaying = True
            async with aclosing(relay(admission, leg, arrived, context.time_remaining,
                                      replace=lambda: self._place_again(admission, inner, prompt_ids,
                                                                        bound, outcome, noted),
                                      on_unreached=self._unreached)) as events:
                async for event in events:
                    yield event

    def _unreached(self, leg: Leg) -> None:
        """A worker that could not be reached gets no new placements until it heartbeats."""
        if self._ledger.unreachable(leg.worker_id):
            leg.bound.warning("worker unreachable: no placements on it until its next heartbeat",
                              address=leg.address)

    async def _place_again(self, first: AdmissionDecision, asked: types_pb2.GenerateRequest,
                           prompt_ids: list[int], bound, outcome: RequestOutcome,
                           noted: dict) -> tuple[AdmissionDecision, Leg] | None:
        """The request once more through the ledger, now that its first worker could not be
        reached (and is skipped); None where no other worker takes it now."""
        model = first.worker.model
        domain = convert.admission_request(
            asked, len(prompt_ids), model, prompt_ids=prompt_ids, tenant=first.tenant,
            default_max_new_tokens=self._config.default_max_new_tokens.for_model(model))
        admission = noted_by_worker(self._ledger.admit(domain), noted)
        log_expired(self._ledger.take_expired(), self._metrics)
        if admission.decision is Decision.REJECTED:
            bound.info("no other worker takes it", cause=admission.rejection.cause.value)
            return None
        return admission, self._generate_leg(admission, asked, prompt_ids, bound, outcome)

    def _generate_leg(self, admission: AdmissionDecision, asked: types_pb2.GenerateRequest,
                      prompt_ids: list[int], bound, outcome: RequestOutcome) -> Leg:
        """The request's worker side for the relay: its outcome and a log line at Finished;
        on every exit, the lease released if no worker ever claimed it."""
        lease, worker = admission.lease, admission.worker
        bound = bound.bind(lease_id=lease.lease_id, worker_id=worker.worker_id)
        bound.info("admitted", decision=admission.decision.value, model=worker.model,
                   max_new_tokens=admission.max_new_tokens, reserved_bytes=admission.reserved_bytes)

        def on_finished(finished: types_pb2.Finished) -> None:
            outcome.finished(finished)
            bound.info("finished", finish_reason=types_pb2.FinishReason.Name(finished.finish_reason),
                       generated_tokens=finished.usage.generated_tokens)

        async def release_unclaimed(_ended_early: bool) -> None:
            # A claimed lease is the worker's to release once its KV is freed;
            # one never claimed (the worker was never reached) is ours.
            if self._ledger.release_unclaimed(lease.lease_id):
                bound.info("released unclaimed lease")
                self._kick()

        return Leg(worker_id=worker.worker_id, address=worker.address,
                   stub=self._workers.stub(worker.address),
                   # The admitted ceiling, the counted prompt and the resolved model: no
                   # second resolution.
                   request=worker_request(asked, lease.lease_id, admission.max_new_tokens,
                                          worker.model, prompt_ids),
                   bound=bound, on_finished=on_finished, on_exit=release_unclaimed,
                   if_worker_dies=f"its lease returns to the budget within "
                                  f"{self._config.lease_ttl_s:g} s; retry the request")

    # -- sessions (sessions/rpcs.py), delegated --------------------------------------

    async def OpenSession(self, request: scheduler_pb2.OpenSessionRequest, context):
        return await self._sessions.rpcs.OpenSession(request, context)

    def SessionTurn(self, request: scheduler_pb2.SessionTurnRequest, context):
        return self._sessions.rpcs.SessionTurn(request, context)

    async def GetSession(self, request: scheduler_pb2.SessionRequest, context):
        return await self._sessions.rpcs.GetSession(request, context)

    async def SwapOutSession(self, request: scheduler_pb2.SessionRequest, context):
        return await self._sessions.rpcs.SwapOutSession(request, context)

    async def CloseSession(self, request: scheduler_pb2.SessionRequest, context):
        return await self._sessions.rpcs.CloseSession(request, context)

    # -- stored responses (sessions/stored_rpcs.py: the gateway's `store: true`) --

    async def PutStoredResponse(self, request, context):
        return await self._stored.PutStoredResponse(request, context)

    async def GetStoredResponse(self, request, context):
        return await self._stored.GetStoredResponse(request, context)

    async def DeleteStoredResponse(self, request, context):
        return await self._stored.DeleteStoredResponse(request, context)

    async def ClaimStoredResponse(self, request, context):
        return await self._stored.ClaimStoredResponse(request, context)

    async def EndStoredTurn(self, request, context):
        return await self._stored.EndStoredTurn(request, context)

    # -- LoRA adapters at runtime (adapter_admin.py: admin role, relayed to the worker) --

    async def LoadAdapter(self, request: types_pb2.LoadAdapterRequest, context):
        return await self._adapters.load(request)

    async def UnloadAdapter(self, request: types_pb2.UnloadAdapterRequest, context):
        return await self._adapters.unload(request)
