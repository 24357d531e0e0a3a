"""A session turn: the whole conversation rendered by the session's worker, admitted
(Ledger.resize on the session's own lease) in the one admission queue like a Generate,
and streamed through relay.py; a turn that ends early waits for its worker's end."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import aclosing
from dataclasses import replace

import grpc
import structlog
from google.rpc import error_details_pb2

from ortserve.output import conversation
from ortserve.rpc.error_path import Relayed
from ortserve.rpc.worker_leg import worker_request
from ortserve.rules import request_rules
from ortserve.status import rich_status
from ortserve.status.errors import ErrorReason, InvalidField, clip, quoted
from ortserve.v1 import scheduler_pb2, types_pb2, worker_pb2
from scheduler_service import convert, spans
from scheduler_service.ledger.ledger import (
    AdmissionDecision,
    AdmissionRequest,
    Decision,
)
from scheduler_service.queue_wait import AdmissionWait, QueueWaiter
from scheduler_service.rejections import rejection_error
from scheduler_service.relay import Leg, relay
from scheduler_service.request_outcome import RequestOutcome, request_outcome
from scheduler_service.sessions.reclaim import SessionReclaimer, tenant_bound
from scheduler_service.sessions.registry import (
    Session,
    context_full,
    worker_lost,
)
from scheduler_service.sessions.state import SharedSessionState

log = structlog.get_logger("scheduler")

TURN_END_WAIT_S = 30.0  # a cancelled turn's worker frees and shrinks within a step or two


class SessionTurnRelay:
    """SessionTurn and the steps of a turn."""

    def __init__(self, state: SharedSessionState, reclaimer: SessionReclaimer,
                 waiter: QueueWaiter) -> None:
        self._state = state
        self._reclaimer = reclaimer  # idle sessions' bytes for a turn that does not fit whole
        self._waiter = waiter  # the admission queue a busy turn waits in, as a Generate does
        # What every turn reads, by the names the steps below use (the state's own objects).
        self._config, self._ledger = state.config, state.ledger
        self._registry, self._metrics = state.registry, state.metrics

    async def _render(self, session: Session, inner: types_pb2.GenerateRequest,
                      ) -> tuple[types_pb2.GenerateRequest, list[int], dict]:
        """The turn's whole conversation as a request, its token ids (the worker that holds
        the session renders chat, so its template is the one whose tokens are held), and
        what that worker said of the prompt's formats, for the Admission (as Generate's)."""
        kind = inner.WhichOneof("prompt")
        if kind not in ("chat", "token_ids"):
            raise InvalidField("request.prompt", "a session turn adds chat messages or token_ids "
                               "to the conversation; text prompts have no turn structure")
        if session.kind and kind != session.kind:
            raise InvalidField("request.prompt", f"this session's turns are {session.kind}; "
                               f"send {session.kind} (or open another session)")
        full = types_pb2.GenerateRequest()
        full.CopyFrom(inner)
        if kind == "token_ids":
            ids = [*session.token_ids, *inner.token_ids.ids]
            geometry = self._ledger.geometry(session.worker_id)
            if geometry is not None and geometry.vocab_size:
                request_rules.token_ids_in_vocab(list(inner.token_ids.ids), geometry.vocab_size,
                                                 "request.")
            full.token_ids.ids[:] = ids
            return full, ids, {}
        full.chat.ClearField("messages")
        for message in session.messages:  # whole, so the history renders as it rendered before
            conversation.add_message(full.chat.messages, message)
        full.chat.messages.extend(inner.chat.messages)  # chat.tools: _session_tools set them
        try:
            answer = await self._state.worker(session).Tokenize(
                worker_pb2.TokenizeRequest(request=full), timeout=10.0)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                raise worker_lost(session, "does not answer Tokenize") from None
            info = rich_status.unpack(rich_status.details_of(error), error_details_pb2.ErrorInfo)
            if info is not None and info.reason == ErrorReason.CONTEXT_LENGTH_EXCEEDED:
                # The whole session counts: say how much came from earlier turns.
                label = "max_new_tokens" if inner.HasField("max_new_tokens") else "min_new_tokens"
                raise context_full(session, session.history_tokens,
                                   int(info.metadata.get("prompt_tokens", 0)), label,
                                   getattr(inner, label),
                                   int(info.metadata.get("context_length", 0))) from None
            raise Relayed(error) from None
        return full, list(answer.token_ids), {
            "reasoning_format": answer.reasoning_format,
            "prompt_opens_reasoning": answer.prompt_opens_reasoning,
            "tool_call_format": answer.tool_call_format,
            "template_kwargs_unread": tuple(answer.template_kwargs_unread)}

    @staticmethod
    def _session_tools(session: Session, inner: types_pb2.GenerateRequest) -> None:
        """A chat session's tools are its first turn's, for its life: a later turn sends
        none (the session's apply, filled in here) or the same list. The session's KV holds
        prompts rendered with them and its past calls were made against them."""
        if inner.WhichOneof("prompt") != "chat" or session.kind != "chat":
            return  # the first chat turn sets them (or a token-id turn, refused by _render)
        sent = tuple(conversation.tool_of(t) for t in inner.chat.tools)
        if not sent:
            for tool in session.tools:
                conversation.add_tool(inner.chat.tools, tool)
        elif sent != session.tools:
            names = ", ".join(t.name for t in session.tools) or "none"
            raise InvalidField(
                "request.chat.tools",
                f"session {quoted(session.session_id)} has the tools its first turn offered "
                f"({len(session.tools)}: {clip(names, 200)}); this turn sends {len(sent)} "
                "different ones. Its history was rendered (and its KV computed) with the first "
                "list and its past calls answer to it: leave chat.tools empty (the session's "
                "apply) or send the same list, or open a new session to offer other tools",
                session_tools=len(session.tools), sent_tools=len(sent))

    def _same_model(self, session: Session, inner: types_pb2.GenerateRequest) -> None:
        """A turn names no model or the session's own: its KV and template are that model's."""
        geometry = self._ledger.geometry(session.worker_id)
        if inner.model and geometry is not None and inner.model != geometry.model:
            raise InvalidField("request.model", f"{quoted(inner.model)} differs from the model "
                               f"this session is bound to, {quoted(geometry.model)} (chosen at "
                               "OpenSession); leave model empty, or open a session with "
                               "OpenSessionRequest.model set to the other model",
                               session_model=geometry.model)
        if geometry is not None:
            inner.model = geometry.model

    async def _admit_turn(self, session: Session, inner: types_pb2.GenerateRequest,
                          request: AdmissionRequest, context, bound) -> AdmissionWait:
        """The turn's admission as Generate's, on the session's own lease: the queue's first
        answer, to be waited out (its Places, then its Admission: the lease grown, unless
        REJECTED)."""
        # Not whole: idle sessions on this worker give their bytes back first.
        while ((probe := self._ledger.resize(session.lease_id, request, dry_run=True)).decision
               is not Decision.ADMITTED
               and await self._reclaimer.reclaim(
                   session.worker_id, exclude=session.session_id,
                   tenant=request.tenant if tenant_bound(probe) else None)):
            pass
        wait_s = inner.max_queue_wait_ms / 1e3 if inner.HasField("max_queue_wait_ms") else None
        answer = self._waiter.submit(request, convert.queue_mode(inner), wait_s=wait_s,
                                     deadline_s=context.time_remaining(),
                                     lease_id=session.lease_id)
        return AdmissionWait(self._waiter, answer, bound, queued_line="turn queued")

    def _undo_grant(self, session: Session, before_bytes: int) -> None:
        """A turn granted its bytes but gone before its worker was called (the caller left):
        the lease goes back to what the worker holds. Only here: once the worker was called,
        it shrinks the lease itself after freeing, as at every turn's end."""
        geometry = self._ledger.geometry(session.worker_id)
        if geometry is None:
            return
        held_tokens = before_bytes // geometry.bytes_per_token  # whole blocks: exact bytes back
        lease = self._ledger.shrink(session.lease_id, session.worker_id, held_tokens)
        if lease is not None:
            log.info("session turn left before its worker was called; lease restored",
                     session_id=session.session_id, reserved_bytes=lease.reserved_bytes)
            self._waiter.kick()

    async def turn(self, request: scheduler_pb2.SessionTurnRequest, context):
        arrived = time.perf_counter()
        with request_outcome("session_turn", context, self._metrics) as outcome:
            self._state.owned(request.session_id, context)  # before the turn is marked in flight
            session = self._registry.begin_turn(request.session_id)  # SESSION_BUSY if one runs
            granted: AdmissionDecision | None = None  # a grown lease no worker was called for yet
            wait: AdmissionWait | None = None  # the turn's way through the admission queue
            before_bytes = 0
            bound = log.bind(session_id=session.session_id, lease_id=session.lease_id,
                             worker_id=session.worker_id)
            try:
                self._state.alive(session)
                inner = types_pb2.GenerateRequest()
                inner.CopyFrom(request.request)
                inner.request_id = inner.request_id or uuid.uuid4().hex[:16]
                self._session_tools(session, inner)  # before the checks: a constraint needs them
                request_rules.generate_request(inner, prefix="request.")
                self._same_model(session, inner)
                full, ids, noted = await self._render(session, inner)
                geometry = self._ledger.geometry(session.worker_id)
                context_length = geometry.context_length if geometry else 0
                if context_length and len(ids) + max(inner.min_new_tokens, 1) > context_length:
                    raise context_full(session, session.history_tokens, len(ids), "min_new_tokens",
                                       inner.min_new_tokens, context_length)
                held = self._ledger.lease(session.lease_id)
                before_bytes = held.reserved_bytes if held is not None else 0
                admission = None
                # The turn is charged to the tenant that opened the session (its lease's).
                turn = convert.admission_request(
                    full, len(ids), full.model, tenant=held.tenant if held is not None else "",
                    default_max_new_tokens=self._config.default_max_new_tokens.for_model(full.model))
                if (remaining_s := context.time_remaining()) is not None:
                    # The call's deadline bounds the turn's stream: a time cap as Generate's.
                    turn = replace(turn, deadline_at=time.monotonic() + remaining_s)
                wait = await self._admit_turn(session, inner, turn, context, bound)
                async with aclosing(wait.places()) as places:
                    async for place in places:
                        yield types_pb2.GenerateEvent(queued=convert.place_to_pb(place))
                admission = wait.admission  # its outcome is ours now, taken
                spans.decided(admission, arrived, wait.queued_perf_s)  # as Generate's
                if admission.decision is Decision.REJECTED:
                    self._state.alive(session)  # a lease gone while it waited: its worker died
                    bound.info("turn rejected", cause=admission.rejection.cause.value)
                    raise rejection_error(admission.rejection)
                granted = admission = replace(admission, **noted)
                session.last_budget_cap = admission.budget_cap  # this turn's, or none
                bound.info("turn admitted", decision=admission.decision.value, prompt_tokens=len(ids),
                           max_new_tokens=admission.max_new_tokens,
                           reserved_bytes=admission.reserved_bytes)
                leg = self._turn_leg(session, inner, full, ids, bound, outcome,
                                     admission.max_new_tokens)
                outcome.relaying = True
                granted = None  # the relay owns the turn's end from here (the worker shrinks)
                async with aclosing(relay(admission, leg, arrived, context.time_remaining)) as events:
                    async for event in events:
                        yield event
            finally:
                if granted is None and wait is not None:
                    granted = wait.granted_untaken  # granted by the queue as its caller left
                if granted is not None and granted.lease is not None:
                    self._undo_grant(session, before_bytes)
                self._registry.end_turn(session)

    def _turn_leg(self, session: Session, inner: types_pb2.GenerateRequest,
                  full: types_pb2.GenerateRequest, ids: list[int], bound,
                  outcome: RequestOutcome, max_new_tokens: int) -> Leg:
        """The turn's worker side for the relay: the reply is gathered as it streams and
        remembered at Finished; a turn that ends early waits for the worker's own end."""
        text, generated = [], []

        def on_chunk(chunk: types_pb2.TokenChunk) -> None:
            text.append(chunk.text)
            generated.extend(chunk.token_ids)

        def on_finished(finished: types_pb2.Finished) -> None:
            session.remember_turn(inner.WhichOneof("prompt"),
                                  [conversation.message_of(m) for m in inner.chat.messages], ids,
                                  "".join(text), generated,
                                  tuple(conversation.tool_of(t) for t in full.chat.tools))
            finished.session.CopyFrom(self._state.info_pb(session, finished.session))
            finished.session.turn_in_flight = False
            outcome.finished(finished)
            bound.info("turn finished", generated_tokens=finished.usage.generated_tokens,
                       reused_prompt_tokens=finished.usage.reused_prompt_tokens)

        async def on_exit(ended_early: bool) -> None:
            if ended_early:
                await self._wait_turn_over(session)

        return Leg(worker_id=session.worker_id, address=session.address,
                   stub=self._state.worker(session),
                   request=worker_request(full, session.lease_id, max_new_tokens,
                                          prompt_token_ids=ids, session_id=session.session_id),
                   bound=bound, on_finished=on_finished, on_chunk=on_chunk, on_exit=on_exit)

    async def _wait_turn_over(self, session: Session) -> None:
        """A turn that ended early (cancel, error): the worker frees and shrinks the lease on
        its own exit; the next turn may grow the lease only after that shrink."""
        deadline = time.monotonic() + TURN_END_WAIT_S
        while time.monotonic() < deadline:
            try:
                info = await self._state.worker(session).GetSession(
                    worker_pb2.WorkerSessionRequest(session_id=session.session_id), timeout=5.0)
                if not info.turn_in_flight:
                    return
            except grpc.aio.AioRpcError:
                return  # gone: its lease expires with it
            await asyncio.sleep(0.05)
        log.error("session turn did not end on its worker in time", session_id=session.session_id)
