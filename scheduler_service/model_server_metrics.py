"""The ledger as GetBudget shows it (one composition for the RPC and the metrics), and the
model-server gauges an inference gateway's endpoint picker reads, computed from it at
scrape time (ortserve/process/model_server_gauges.py; docs/operations/inference-gateway.md).
"""

from __future__ import annotations

import time

from prometheus_client.registry import Collector

from ortserve.process import model_server_gauges
from ortserve.v1 import scheduler_pb2
from scheduler_service import convert
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.ledger.queue import AdmissionQueue


def ledger_budget(ledger: Ledger, queue: AdmissionQueue | None,
                  include_leases: bool = False) -> scheduler_pb2.Budget:
    """Every worker's share of the ledger and the queue, per model included (GetBudget's
    answer before its tenant rows)."""
    snapshot = ledger.snapshot()
    models = sorted({w.geometry.model for w in snapshot})
    budget = convert.budget_to_pb(snapshot, include_leases, time.monotonic(),
                                  queue.stats() if queue is not None else None,
                                  queue.model_stats(models) if queue is not None else None)
    convert.time_to_pb(budget, ledger.worker_times(), ledger.time_goals)
    return budget


class ModelServerGauges(Collector):
    """ortserve_model_server_* per worker (labelled worker_id and model), from one
    ledger_budget per scrape: the numbers GetBudget answers at that instant."""

    def __init__(self, ledger: Ledger, queue: AdmissionQueue | None) -> None:
        self._ledger, self._queue = ledger, queue

    def collect(self):
        yield from model_server_gauges.families(ledger_budget(self._ledger, self._queue),
                                                now_s=time.time())

    def describe(self):
        return model_server_gauges.describe()
