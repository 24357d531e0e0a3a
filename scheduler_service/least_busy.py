"""A call on the least busy worker of a model that answers: Tokenize and Detokenize for
their own RPCs (servicer.py) and for counting a prompt (prompt_count.py) fan out the same
way. Any worker of the model will do (one model, one tokenizer); the least leases first.

A worker that does not answer at all (worker_patience.Unanswered) is marked unreachable
in the ledger and passed over, as is one UNAVAILABLE; any other error is the worker's
judgement of the request, raised as it is for the caller to relay.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc
import structlog

from ortserve.status.errors import clip
from ortserve.v1 import worker_pb2_grpc
from scheduler_service import worker_patience
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.ledger.worker_state import WorkerState
from scheduler_service.worker_clients import WorkerClients

log = structlog.get_logger("scheduler")


class NoneAnswered(Exception):
    """Every worker tried was passed over (or there was none): why, in the order tried."""

    def __init__(self, reasons: list[str], unavailable: grpc.aio.AioRpcError | None) -> None:
        super().__init__("; ".join(reasons) or "no worker to call")
        self.reasons = reasons  # each "worker_id: why" (Unanswered's own sentence or the status)
        self.unavailable = unavailable  # the last UNAVAILABLE answer, if any


async def on_least_busy(ledger: Ledger, workers: WorkerClients, candidates: Sequence[WorkerState],
                        call: Callable[[worker_pb2_grpc.WorkerStub], Awaitable[Any]], what: str,
                        first: Callable[[WorkerState], Any] = lambda _worker: False):
    """`call(stub)`'s answer from the first of `candidates` that answers, tried by `first`
    (False before True), then by fewest leases; NoneAnswered when none does."""
    reasons: list[str] = []
    unavailable: grpc.aio.AioRpcError | None = None
    for worker in sorted(candidates, key=lambda w: (first(w), len(w.leases))):
        worker_id, address = worker.geometry.worker_id, worker.geometry.address
        try:
            return await worker_patience.answer(call(workers.stub(address)),
                                                workers.channel(address), worker_id, what)
        except worker_patience.Unanswered as unanswered:
            if ledger.unreachable(worker_id):
                log.warning("worker unanswered: no placements on it until its next heartbeat",
                            worker_id=worker_id, address=address,
                            waited_s=worker_patience.PATIENCE_S + worker_patience.PROBE_S)
            reasons.append(str(unanswered))
        except grpc.aio.AioRpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise  # the worker judged the request
            unavailable = error
            reasons.append(f"{worker_id}: {clip(error.details(), 120)}")
    raise NoneAnswered(reasons, unavailable)
