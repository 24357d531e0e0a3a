"""A worker's call on the admission path, bounded by whether the worker is alive.

A worker stopped (SIGSTOP), hung, or on a host gone without a reset keeps its TCP
connection: its calls neither answer nor fail, and Admit waited out Tokenize's whole
deadline (10 s) to answer DEADLINE_EXCEEDED with no details. A worker that has not
answered within PATIENCE_S is asked whether it lives (grpc.health.v1 Check, PROBE_S):
one that does not answer that either is Unanswered (the caller passes it over and marks
it unreachable until its next heartbeat); one that answers is only busy, and its call
runs on to its own deadline, so a long prompt on a loaded worker is never cut short.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# Together about two seconds from the call to the caller's next worker or its NO_WORKER.
PATIENCE_S = 1.0
PROBE_S = 1.0


class Unanswered(Exception):
    """The worker answered neither the call nor a health check: stopped or hung."""

    def __init__(self, worker_id: str, what: str) -> None:
        super().__init__(f"{worker_id}: answered neither {what} within {PATIENCE_S:g} s nor a "
                         f"health check within {PROBE_S:g} s (a stopped or hung process); "
                         "passed over until its next heartbeat")
        self.worker_id = worker_id


async def alive(channel: grpc.aio.Channel) -> bool:
    """Whether the process behind `channel` answers a health check within PROBE_S (any
    answer counts: NOT_SERVING or UNIMPLEMENTED come from a live process)."""
    try:
        await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                        timeout=PROBE_S)
    except grpc.aio.AioRpcError as error:
        return error.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED,
                                    grpc.StatusCode.UNAVAILABLE)
    return True


async def answer(call: grpc.aio.Call, channel: grpc.aio.Channel, worker_id: str, what: str):
    """`call`'s answer (its own errors raised as they are), or Unanswered after about
    PATIENCE_S + PROBE_S when the worker is not alive; the call is cancelled on every exit
    that does not wait for it (this caller cancelled too)."""

    async def result():
        return await call

    waiting = asyncio.ensure_future(result())
    try:
        done, _ = await asyncio.wait({waiting}, timeout=PATIENCE_S)
        if not done and not await alive(channel):
            raise Unanswered(worker_id, what)
        return await waiting
    finally:
        if not waiting.done():
            call.cancel()
            waiting.cancel()
