"""The engine thread's events onto the event loop, and what a reader that fell behind gets.

`EventMailbox` hands a step's events to the serving loop with one wake-up per
batch; `coalesced` merges the TokenDeltas a reader finds queued into one. The
lease stream (lease_lifecycle.LeaseStream) reads through both.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from worker_service.core.sequence import Event, TokenDelta


class EventMailbox:
    """The engine thread's events onto the event loop: ONE loop wake-up per batch, not per token.

    A step emits a token for every running sequence; a call_soon_threadsafe per token
    would cost a self-pipe write and a loop iteration each. Here the
    engine thread appends to a deque (thread-safe) and schedules one delivery
    only when none is pending, so a step's tokens arrive in one loop callback.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: deque[tuple[Callable[[Event], None], Event]] = deque()
        self._scheduled = False

    def post(self, deliver: Callable[[Event], None], event: Event) -> None:
        """Engine thread: queue `event` for `deliver` (a stream's, called on the loop); wake the
        loop unless a wake-up is pending."""
        self._items.append((deliver, event))
        if not self._scheduled:
            # NOTE: the order matters: the loop clears the flag BEFORE it drains, so an
            # item appended after the drain's last pop sees the flag clear and wakes again.
            self._scheduled = True
            self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        self._scheduled = False
        items = self._items
        while items:
            deliver, event = items.popleft()
            deliver(event)


def coalesced(events: list[Event]) -> list[Event]:
    """Consecutive TokenDeltas as one (ids concatenated, texts joined); the rest as they are.

    Only what is already queued is merged: a reader that keeps up gets every
    token as it comes, one behind gets what piled up in one message.
    """
    out: list[Event] = []
    for event in events:
        if type(event) is TokenDelta and out and type(out[-1]) is TokenDelta:
            last = out[-1]
            # logprobs are one per token id, so they concatenate in step with the ids.
            out[-1] = TokenDelta(last.sequence_id, last.token_ids + event.token_ids,
                                 last.text + event.text, last.logprobs + event.logprobs)
        else:
            out.append(event)
    return out
