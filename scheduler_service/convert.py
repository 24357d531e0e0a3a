"""Protobuf <-> ledger types. The only place the scheduler's core meets the wire."""

from __future__ import annotations

import math
from dataclasses import replace

from ortserve.process.version import package_version
from ortserve.status.errors import InvalidField
from ortserve.v1 import scheduler_pb2, types_pb2
from scheduler_service.ledger.ledger import (
    AdmissionDecision,
    AdmissionRequest,
    CapLimit,
    Cause,
    Decision,
    Lease,
    NewTokensCap,
    NewTokensSource,
    Rejection,
    TenantUsage,
    WorkerGeometry,
    WorkerSnapshot,
)
from scheduler_service.ledger.queue import (
    Mode,
    ModelQueueStats,
    Place,
    QueueStats,
    TenantQueueStats,
)
from scheduler_service.ledger.step_model import PromptPace, StepSample
from scheduler_service.ledger.time_budget import TimeGoals, WorkerTime

_DECISION = {
    Decision.ADMITTED: types_pb2.ADMITTED,
    Decision.CAPPED: types_pb2.CAPPED,
    Decision.REJECTED: types_pb2.REJECTED,
}
_CAUSE = {cause: types_pb2.RejectionCause.Value(cause.name) for cause in Cause}


def admission_request(request: types_pb2.GenerateRequest, prompt_tokens: int,
                      model: str = "", prompt_ids: list[int] | None = None,
                      tenant: str = "",
                      default_max_new_tokens: int | None = None,
                      two_step: bool = False) -> AdmissionRequest:
    """The ledger's view of a request; raises InvalidField naming the proto field.

    `model`: the request's model as resolved (placement.resolve_model), not as sent.
    `prompt_ids`: its token ids when counted (placement follows the prefix caches).
    `default_max_new_tokens`: the server's ceiling for that model when the request sets
    none (None: the remaining window).
    """
    return AdmissionRequest(
        request_id=request.request_id,
        prompt_tokens=prompt_tokens,
        max_new_tokens=request.max_new_tokens if request.HasField("max_new_tokens") else None,
        min_new_tokens=request.min_new_tokens,
        strict=request.cap_policy == types_pb2.CAP_POLICY_STRICT,
        model=model,
        prompt_ids=tuple(prompt_ids or ()),
        tenant=tenant,
        priority=request.priority,
        default_max_new_tokens=default_max_new_tokens,
        two_step=two_step,
        adapter=request.adapter,
        preferred_worker=request.preferred_worker_id,
        max_itl_ms=request.max_itl_ms,
        max_ttft_ms=request.max_ttft_ms,
    )


def step_samples(timings) -> list[StepSample]:
    """HeartbeatRequest.step_timings as the ledger's samples; a malformed one is refused
    naming the field (a worker bug, never silently dropped)."""
    samples = []
    for i, t in enumerate(timings):
        try:
            samples.append(StepSample(rows=t.rows, steps=t.steps, seconds=t.seconds,
                                      tail_seconds=t.tail_seconds))
        except ValueError as error:
            raise InvalidField(f"step_timings[{i}]", str(error), rows=t.rows, steps=t.steps,
                               seconds=t.seconds, tail_seconds=t.tail_seconds) from None
    return samples


def prefill_pace(request) -> PromptPace | None:
    """HeartbeatRequest's prompt_token_ms / prompt_chunk_ms / prefill_chunk_tokens as the
    ledger's pace (None: not measured yet); a malformed one is refused naming the field
    (a worker bug, never silently dropped)."""
    if not request.prompt_token_ms:
        return None
    try:
        return PromptPace(request.prompt_token_ms, request.prefill_chunk_tokens or 512,
                          request.prompt_chunk_ms)
    except ValueError as error:
        token_ok = math.isfinite(request.prompt_token_ms) and request.prompt_token_ms >= 0
        raise InvalidField("prompt_token_ms" if not token_ok else "prompt_chunk_ms", str(error),
                           prompt_token_ms=request.prompt_token_ms,
                           prompt_chunk_ms=request.prompt_chunk_ms,
                           prefill_chunk_tokens=request.prefill_chunk_tokens) from None


# The proto's names, one for one (the enum `limit` converted on its own).
_CAP_FIELDS = tuple(name for name in NewTokensCap.__dataclass_fields__ if name != "limit")
_CAP_LIMIT = {CapLimit.WORKER: types_pb2.CAP_LIMIT_WORKER,
              CapLimit.TENANT_QUOTA: types_pb2.CAP_LIMIT_TENANT_QUOTA,
              CapLimit.DEADLINE: types_pb2.CAP_LIMIT_DEADLINE}


def budget_cap_to_pb(cap: NewTokensCap | None) -> types_pb2.BudgetCap | None:
    if cap is None:
        return None
    return types_pb2.BudgetCap(**{name: getattr(cap, name) for name in _CAP_FIELDS},
                               limit=_CAP_LIMIT[cap.limit])


def budget_cap_from_pb(pb: types_pb2.BudgetCap) -> NewTokensCap:
    limit = next((domain for domain, number in _CAP_LIMIT.items() if number == pb.limit),
                 CapLimit.WORKER)
    cap = NewTokensCap(**{name: getattr(pb, name) for name in _CAP_FIELDS
                       if name != "requested_source"}, limit=limit)
    if pb.requested_source:  # unset: a lease from a scheduler older than the field
        cap = replace(cap, requested_source=NewTokensSource(pb.requested_source))
    return cap


def rejection_to_pb(rejection: Rejection) -> types_pb2.Rejection:
    pb = types_pb2.Rejection(
        cause=_CAUSE[rejection.cause],
        message=rejection.message,
        remedy=rejection.remedy,
        cap_refused=rejection.cap_refused,
        prompt_tokens=rejection.prompt_tokens,
        min_new_tokens=rejection.min_new_tokens,
        requested_max_new_tokens=rejection.requested_max_new_tokens,
        admissible_max_new_tokens=rejection.admissible_max_new_tokens,
        context_length=rejection.context_length,
        needed_bytes=rejection.needed_bytes,
        available_bytes=rejection.available_bytes,
        capacity_bytes=rejection.capacity_bytes,
        bytes_per_token=rejection.bytes_per_token,
        prompt_tokens_unknown=rejection.prompt_tokens_unknown,
        queue_length=rejection.queue_length,
        max_queue_length=rejection.max_queue_length,
        requests_ahead=rejection.requests_ahead,
        bytes_ahead=rejection.bytes_ahead,
        waited_ms=rejection.waited_s * 1e3,
        max_queue_wait_ms=rejection.max_queue_wait_s * 1e3,
        tenant=rejection.tenant,
        tenant_quota_bytes=rejection.tenant_quota_bytes,
        tenant_reserved_bytes=rejection.tenant_reserved_bytes,
        tenant_requests_per_s=rejection.tenant_requests_per_s,
        tenant_burst=rejection.tenant_burst,
        worker_id=rejection.worker_id,
        predicted_step_ms=rejection.predicted_step_ms,
        itl_goal_ms=rejection.itl_goal_ms,
        ttft_goal_ms=rejection.ttft_goal_ms,
        fastest_step_ms=rejection.fastest_step_ms,
        streams=rejection.streams,
        estimated_wait_ms=rejection.estimated_wait_s * 1e3,
        deadline_ms=rejection.deadline_ms,
        prefill_ms=rejection.prefill_ms,
        prefill_budget_tokens=rejection.prefill_budget_tokens,
        first_token_ms=rejection.first_token_ms,
    )
    if rejection.retry_after_s:
        pb.retry_after.FromNanoseconds(int(rejection.retry_after_s * 1e9))
    return pb


def admission_to_pb(admission: AdmissionDecision) -> types_pb2.Admission:
    pb = types_pb2.Admission(
        decision=_DECISION[admission.decision],
        request_id=admission.request_id,
        prompt_tokens=admission.prompt_tokens,
        max_new_tokens=admission.max_new_tokens,
        reserved_bytes=admission.reserved_bytes,
        dry_run=admission.dry_run,
        queue_wait_ms=admission.queue_wait_s * 1e3,
        max_new_tokens_source=admission.max_new_tokens_source or 0,
        reasoning_format=admission.reasoning_format,
        prompt_opens_reasoning=admission.prompt_opens_reasoning,
        tool_call_format=admission.tool_call_format,
        template_kwargs_unread=admission.template_kwargs_unread,
    )
    if admission.lease is not None:
        pb.lease_id = admission.lease.lease_id
    if admission.worker is not None:
        pb.worker_id = admission.worker.worker_id
        pb.worker_address = admission.worker.address
        pb.model = admission.worker.model  # what answers: the resolved model
    if admission.budget_cap is not None:
        pb.budget_cap.CopyFrom(budget_cap_to_pb(admission.budget_cap))
    if admission.rejection is not None:
        pb.rejection.CopyFrom(rejection_to_pb(admission.rejection))
    return pb


def lease_to_pb(lease: Lease, now: float) -> types_pb2.Lease:
    pb = types_pb2.Lease(
        lease_id=lease.lease_id,
        worker_id=lease.worker_id,
        request_id=lease.request_id,
        prompt_tokens=lease.prompt_tokens,
        max_new_tokens=lease.max_new_tokens,
        reserved_bytes=lease.reserved_bytes,
        claimed=lease.claimed,
        age_s=max(0.0, now - lease.created_at),
        tenant=lease.tenant,
        two_step=lease.two_step,
        host_bytes=lease.host_bytes,
        disk_bytes=lease.disk_bytes,
        max_itl_ms=lease.max_itl_ms,
    )
    if lease.budget_cap is not None:
        pb.budget_cap.CopyFrom(budget_cap_to_pb(lease.budget_cap))
    return pb


def lease_from_pb(pb: types_pb2.Lease, now: float, session: bool = False) -> Lease:
    return Lease(
        lease_id=pb.lease_id,
        worker_id=pb.worker_id,
        request_id=pb.request_id,
        prompt_tokens=pb.prompt_tokens,
        max_new_tokens=pb.max_new_tokens,
        reserved_bytes=pb.reserved_bytes,
        budget_cap=budget_cap_from_pb(pb.budget_cap) if pb.HasField("budget_cap") else None,
        created_at=now - pb.age_s,
        claimed=True,
        claimed_at=now,
        session=session,
        tenant=pb.tenant,  # the worker keeps the lease as claimed, tenant included
        two_step=pb.two_step,
        # A restarted worker's sessions on disk: charged to their tenants as disk bytes.
        host_bytes=pb.host_bytes,
        disk_bytes=pb.disk_bytes,
        max_itl_ms=pb.max_itl_ms,  # the goal it was admitted under, kept across a restart
    )


def live_leases_from_pb(pb: scheduler_pb2.RegisterWorkerRequest, now: float) -> list[Lease]:
    """A registering worker's live leases, its sessions' marked as such."""
    sessions = {session.lease_id for session in pb.live_sessions}
    return [lease_from_pb(lease, now, session=lease.lease_id in sessions)
            for lease in pb.live_leases]


def geometry_from_pb(pb: scheduler_pb2.RegisterWorkerRequest) -> WorkerGeometry:
    return WorkerGeometry(
        worker_id=pb.worker_id,
        address=pb.address,
        model=pb.model,
        context_length=pb.context_length,
        bytes_per_token=pb.bytes_per_token,
        capacity_bytes=pb.capacity_bytes,
        block_tokens=pb.block_tokens or 1,
        execution_provider=pb.execution_provider,
        vocab_size=pb.vocab_size,
        version=pb.version,
        device=pb.device,
        max_batch_rows=pb.max_batch_rows,
        nodes_off_device=tuple(pb.nodes_off_device),
        adapters=tuple(sorted((a.name, a.held_bytes) for a in pb.adapters)),
        adapter_paths=tuple(sorted((a.name, a.path) for a in pb.adapters if a.path)),
        decode_graph_bytes=pb.decode_graph_bytes,
        decode_buffer_bytes=pb.decode_buffer_bytes,
    )


def adapter_change_to_pb(geometry: WorkerGeometry,
                         adapter: types_pb2.LoraAdapter) -> types_pb2.AdapterChange:
    """A worker's adapters and capacity after a load or unload, as the ledger holds them."""
    return types_pb2.AdapterChange(
        worker_id=geometry.worker_id, adapter=adapter, capacity_bytes=geometry.capacity_bytes,
        adapters=adapters_pb(geometry))


def adapters_pb(geometry: WorkerGeometry) -> list[types_pb2.LoraAdapter]:
    """The adapters a worker serves as the ledger holds them: name, bytes, and its path."""
    paths = dict(geometry.adapter_paths)
    return [types_pb2.LoraAdapter(name=name, held_bytes=n, path=paths.get(name, ""))
            for name, n in geometry.adapters]


def queue_mode(request: types_pb2.GenerateRequest) -> Mode:
    """What the request waits for in the admission queue, from its cap policy."""
    if request.cap_policy == types_pb2.CAP_POLICY_STRICT:
        return Mode.STRICT
    if request.cap_policy == types_pb2.CAP_POLICY_WAIT_FULL:
        return Mode.WAIT_FULL
    return Mode.ALLOW


def place_to_pb(place: Place) -> types_pb2.Queued:
    return types_pb2.Queued(
        position=place.position, requests_ahead=place.requests_ahead, bytes_ahead=place.bytes_ahead,
        needed_bytes=place.needed_bytes, waited_ms=place.waited_s * 1e3,
        max_wait_ms=place.max_wait_s * 1e3, queue_length=place.queue_length)


def tenants_to_pb(usage: list[TenantUsage], queued: dict[tuple[str, str], TenantQueueStats]
                  ) -> list[scheduler_pb2.TenantBudget]:
    """Budget.tenants: each (tenant, model) the ledger knows, with its waiting requests."""
    rows = []
    for u in usage:
        waiting = queued.get((u.tenant, u.model), TenantQueueStats())
        row = scheduler_pb2.TenantBudget(
            tenant=u.tenant, model=u.model, reserved_bytes=u.reserved_bytes, weight=u.weight,
            leases=u.leases, queue_length=waiting.length,
            queue_waiting_bytes=waiting.waiting_bytes, host_bytes=u.host_bytes,
            disk_bytes=u.disk_bytes)
        if u.quota_bytes is not None:
            row.quota_bytes = u.quota_bytes
        rows.append(row)
    return rows


def budget_to_pb(snapshot: list[WorkerSnapshot], include_leases: bool, now: float,
                 queue: QueueStats | None = None,
                 model_queues: dict[str, ModelQueueStats] | None = None) -> scheduler_pb2.Budget:
    """The ledger as GetBudget answers it; `model_queues` (AdmissionQueue.model_stats) fills
    each model's queue_length and waiting_adapters."""
    workers = []
    for w in snapshot:
        g = w.geometry
        workers.append(scheduler_pb2.WorkerBudget(
            worker_id=g.worker_id,
            address=g.address,
            model=g.model,
            capacity_bytes=g.capacity_bytes,
            reserved_bytes=w.reserved_bytes,
            available_bytes=w.available_bytes,
            bytes_per_token=g.bytes_per_token,
            block_tokens=g.block_tokens,
            context_length=g.context_length,
            lease_count=len(w.leases),
            heartbeat_age_s=w.heartbeat_age_s,
            leases=[lease_to_pb(lease, now) for lease in w.leases] if include_leases else [],
            execution_provider=g.execution_provider,
            draining=w.draining,
            unreachable=w.unreachable,
            running_sequences=w.batch.running_sequences,
            batch_rows=w.batch.batch_rows,
            largest_batch=w.batch.largest_batch,
            version=g.version,
            device=g.device,
            cached_bytes=w.prefix.cached_bytes,
            cached_blocks=len(w.prefix.hashes),
            nodes_off_device=list(g.nodes_off_device),
            adapters=adapters_pb(g),
            host_bytes=w.host_bytes,
            disk_bytes=w.disk_bytes,
            decode_graph_bytes=g.decode_graph_bytes,
            decode_buffer_bytes=g.decode_buffer_bytes,
        ))
    models = _models(workers)
    for m in models:
        waiting = (model_queues or {}).get(m.model)
        if waiting is not None:
            m.queue_length, m.waiting_adapters[:] = waiting.length, list(waiting.adapters)
    return scheduler_pb2.Budget(
        workers=workers,
        models=models,
        total_capacity_bytes=sum(w.capacity_bytes for w in workers),
        total_reserved_bytes=sum(w.reserved_bytes for w in workers),
        total_available_bytes=sum(w.available_bytes for w in workers),
        total_leases=sum(w.lease_count for w in workers),
        total_host_bytes=sum(w.host_bytes for w in workers),
        total_disk_bytes=sum(w.disk_bytes for w in workers),
        queue_length=queue.length if queue else 0,
        queue_oldest_wait_s=queue.oldest_wait_s if queue else 0.0,
        queue_waiting_bytes=queue.waiting_bytes if queue else 0,
        max_queue_length=queue.max_length if queue else 0,
        max_queue_wait_s=queue.max_wait_s if queue else 0.0,
        scheduler_version=package_version(),
    )


def time_to_pb(budget: scheduler_pb2.Budget, times: list[WorkerTime], goals: TimeGoals) -> None:
    """Each worker's time budget (Ledger.worker_times) and the server's goals into `budget`,
    beside its bytes (docs/features/time-budget.md)."""
    by_id = {t.worker_id: t for t in times}
    budget.max_itl_ms, budget.max_ttft_ms = goals.max_itl_ms, goals.max_ttft_ms
    for w in budget.workers:
        t = by_id.get(w.worker_id)
        if t is None:
            continue
        w.time_measured, w.streams, w.step_ms, w.next_step_ms = (
            t.measured, t.streams, t.step_ms, t.next_step_ms)
        w.itl_goal_ms, w.steps_measured = t.itl_goal_ms, t.steps_measured
        w.step_means.extend(scheduler_pb2.StepTiming(rows=rows, steps=1, seconds=ms / 1e3)
                            for rows, ms in t.table)
        if t.prefill is not None:  # the pace its heartbeat said, as the TTFT prediction reads it
            w.prompt_token_ms, w.prompt_chunk_ms = t.prefill.prompt_token_ms, t.prefill.chunk_ms
            w.prefill_chunk_tokens = t.prefill.chunk_tokens


def _models(workers: list[scheduler_pb2.WorkerBudget]) -> list[scheduler_pb2.ModelBudget]:
    """Per served model, the sums over its workers (Budget.models), sorted by name."""
    models: dict[str, scheduler_pb2.ModelBudget] = {}
    for w in workers:
        m = models.setdefault(w.model, scheduler_pb2.ModelBudget(model=w.model))
        m.workers += 1
        m.capacity_bytes += w.capacity_bytes
        m.reserved_bytes += w.reserved_bytes
        m.available_bytes += w.available_bytes
        m.context_length = max(m.context_length, w.context_length)
        m.adapters[:] = sorted(set(m.adapters) | {a.name for a in w.adapters})
    return [models[name] for name in sorted(models)]


def session_info_to_pb(session, worker: types_pb2.SessionInfo | None, reserved_bytes: int,
                       model: str, idle_s: float) -> types_pb2.SessionInfo:
    """A session as the scheduler knows it, over what its worker reported (`worker`)."""
    pb = types_pb2.SessionInfo()
    if worker is not None:
        pb.CopyFrom(worker)
    pb.session_id, pb.worker_id, pb.worker_address = (session.session_id, session.worker_id,
                                                      session.address)
    pb.model = model or pb.model
    pb.lease_id, pb.reserved_bytes = session.lease_id, reserved_bytes
    pb.turns, pb.turn_in_flight, pb.idle_s = session.turns, session.turn_in_flight, idle_s
    pb.ClearField("last_budget_cap")
    if session.last_budget_cap is not None:
        pb.last_budget_cap.CopyFrom(budget_cap_to_pb(session.last_budget_cap))
    return pb
