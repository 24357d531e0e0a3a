"""A request's prompt counted for admission: token ids checked against the model's
vocabulary here, text and chat through a worker's Tokenize (its tokenizer, its template),
and what that worker said of the prompt (reasoning, tool-call format) for the Admission."""

from __future__ import annotations

from dataclasses import dataclass, replace

import grpc

from ortserve.rpc.error_path import Relayed
from ortserve.rules import request_rules
from ortserve.status.errors import clip
from ortserve.v1 import types_pb2, worker_pb2
from scheduler_service.least_busy import NoneAnswered, on_least_busy
from scheduler_service.ledger import placement
from scheduler_service.ledger.ledger import AdmissionDecision, Decision, Ledger
from scheduler_service.rejections import window_refused_prompt_tokens
from scheduler_service.worker_clients import WorkerClients


@dataclass(frozen=True)
class Prompt:
    """A request's prompt as counted for admission."""

    token_ids: list[int]  # empty when no worker could count it
    known: bool
    # A worker's Tokenize refused it for the context window (token_ids then empty): the
    # refusal, and the prompt's length it counted, for the ledger to decide on.
    window_refusal: grpc.aio.AioRpcError | None = None
    window_refused_tokens: int = 0
    # What the counting worker said of a chat prompt's reasoning (passed on in the Admission).
    reasoning_format: str = ""
    opens_reasoning: bool = False
    tool_call_format: str = ""
    template_kwargs_unread: tuple[str, ...] = ()


def noted_by_worker(admission: AdmissionDecision, noted: dict) -> AdmissionDecision:
    """The admission with what the counting worker said of the prompt (not REJECTED)."""
    if admission.decision is Decision.REJECTED or not noted:
        return admission
    return replace(admission, **noted)


async def count_prompt(request: types_pb2.GenerateRequest, model: str, ledger: Ledger,
                       workers: WorkerClients) -> Prompt | str:
    """The prompt's token ids, or why no worker of `model` could count them (-> NO_WORKER).

    A token-id prompt is checked against the model's registered vocabulary
    here, with no round trip; text and chat go through Tokenize on a worker
    of the model (its tokenizer, its template), which also validates the
    request as Generate would.
    """
    snapshot = placement.serving(ledger.snapshot(), model)
    if request.WhichOneof("prompt") == "token_ids":
        ids = list(request.token_ids.ids)
        vocab = max((w.geometry.vocab_size for w in snapshot), default=0)
        if vocab or not snapshot:
            if vocab:
                request_rules.token_ids_in_vocab(ids, vocab)
                # The worker's Tokenize would check it; this path skips that call.
                request_rules.logit_bias_in_vocab(request.sampling.logit_bias, vocab)
                request_rules.stop_token_ids_in_vocab(request.stop_token_ids, vocab)
            return Prompt(ids, known=True)
    if not snapshot:
        return "no worker registered"
    reachable = [w for w in snapshot if not w.unreachable]
    if not reachable:  # the ledger places nothing on them either: say so now, not after a wait
        return ("every worker of the model is marked unreachable (a call to it went "
                "unanswered) until its next heartbeat: "
                + ", ".join(clip(w.geometry.worker_id, 40) for w in snapshot))
    try:
        # A worker serving the request's adapter first: Tokenize checks the request as
        # Generate would.
        answer = await on_least_busy(
            ledger, workers, reachable,
            lambda stub: stub.Tokenize(worker_pb2.TokenizeRequest(request=request), timeout=10.0),
            "Tokenize", first=lambda w: not w.geometry.serves_adapter(request.adapter))
    except NoneAnswered as none:
        return none.reasons[-1]
    except grpc.aio.AioRpcError as error:
        counted = window_refused_prompt_tokens(error)
        if counted is not None:
            return Prompt([], known=True, window_refusal=error, window_refused_tokens=counted)
        raise Relayed(error) from None  # the worker judged the request: pass it on
    return Prompt(list(answer.token_ids), known=True, reasoning_format=answer.reasoning_format,
                  opens_reasoning=answer.prompt_opens_reasoning,
                  tool_call_format=answer.tool_call_format,
                  template_kwargs_unread=tuple(answer.template_kwargs_unread))
