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
from collections.abc import AsyncIterator, Sequence

from ortserve.v1 import types_pb2

from .upstream import OpenStream, Upstream


async def open_all(upstream: Upstream, requests: Sequence[types_pb2.GenerateRequest],
                   metadata: Sequence[tuple[str, str]]) -> list[OpenStream]:
    """Open every choice's Generate and wait for all the admissions; on the first
    failure (or our own cancellation) cancel the rest and raise it."""
    if len(requests) == 1:
        return [await upstream.open(requests[0], metadata)]
    tasks = [asyncio.ensure_future(upstream.open(r, metadata)) for r in requests]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        # Wait them out: a choice admitted meanwhile must have its call cancelled too.
        for outcome in await asyncio.gather(*tasks, return_exceptions=True):
            if isinstance(outcome, OpenStream):
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
