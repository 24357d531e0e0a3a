"""The session parts built together: one SharedSessionState held by a reclaimer, a turn
relay holding both, and the RPC surface over them. The servicer calls each by name (the RPCs
on `rpcs`, a plain admission's room on `reclaimer`); server.py runs `reclaimer`'s sweep."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_service.config import SchedulerConfig
from scheduler_service.ledger.ledger import Ledger
from scheduler_service.queue_wait import QueueWaiter
from scheduler_service.sessions.reclaim import SessionReclaimer
from scheduler_service.sessions.registry import SessionRegistry
from scheduler_service.sessions.rpcs import SessionRPCs
from scheduler_service.sessions.state import SharedSessionState
from scheduler_service.sessions.turn import SessionTurnRelay
from scheduler_service.worker_clients import WorkerClients


@dataclass(frozen=True)
class Sessions:
    """The scheduler's session parts, each reached by name."""

    state: SharedSessionState
    reclaimer: SessionReclaimer
    turns: SessionTurnRelay
    rpcs: SessionRPCs


def build_sessions(config: SchedulerConfig, ledger: Ledger, workers: WorkerClients,
                   waiter: QueueWaiter, registry: SessionRegistry | None = None,
                   metrics=None) -> Sessions:
    """The parts over one state; `registry` is shared with registration (restored sessions)."""
    state = SharedSessionState(config, ledger, workers, registry=registry, metrics=metrics)
    reclaimer = SessionReclaimer(state)
    turns = SessionTurnRelay(state, reclaimer, waiter)
    return Sessions(state=state, reclaimer=reclaimer, turns=turns,
                    rpcs=SessionRPCs(state, turns))
