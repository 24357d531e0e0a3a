"""OpenAI's `n`: several choices for one prompt, as n scheduler Generate calls at once.

The simplest honest implementation: each choice is its own GenerateRequest
(`ParsedRequest.choice_request`: seed + i, so n choices with a seed differ from
each other and repeat on the next call), admitted and reserved on its own, so
the cap rule applies per choice and each choice reports its own cap. The
prompt's KV is computed once per choice: the KV layout does not share a
prefix between sequences yet. Any choice refused refuses the request, and the
others are cancelled (their leases freed).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from gateway.upstream import OpenStream
from ortserve.v1 import types_pb2


async def open_all(opener: Callable[[types_pb2.GenerateRequest], Awaitable[OpenStream]],
                   requests: Sequence[types_pb2.GenerateRequest]) -> list[OpenStream]:
    """Open every choice's stream with `opener` (through the scheduler, or the direct
    path's Admit then worker) and wait for all the admissions; on the first failure (or
    our own cancellation) cancel the rest and raise it."""
    if len(requests) == 1:
        return [await opener(requests[0])]
    tasks = [asyncio.ensure_future(opener(r)) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        # Wait them out: a choice admitted meanwhile must have its call cancelled too.
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if not isinstance(outcome, BaseException):
                outcome.cancel()
        raise


def cancel_all(streams: Sequence[OpenStream]) -> None:
    for stream in streams:
        stream.cancel()


async def merged(streams: Sequence[OpenStream]
                 ) -> AsyncIterator[tuple[int, types_pb2.GenerateEvent]]:
    """(choice index, event) from every choice as they arrive, until each has finished;
    raises the first choice's failure. One choice is read directly (the token path)."""
    if len(streams) == 1:
        async for event in streams[0].events():
            yield 0, event
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: OpenStream) -> None:
        try:
            async for event in stream.events():
                await queue.put((index, event))
            await queue.put((index, done))
        except asyncio.CancelledError:
            raise
        except Exception as error:  # grpc.RpcError, StreamBroken: re-raised by the reader
            await queue.put((index, error))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(streams)
        while running:
            index, item = await queue.get()
            if item is done:
                running -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
