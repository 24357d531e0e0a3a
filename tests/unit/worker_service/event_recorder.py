"""An on_event callback for the engine's tests: it keeps every event a sequence sends."""

from __future__ import annotations

import threading

from worker_service.core.sequence import Cancelled, Completed, Failed, TokenDelta

TERMINAL = (Completed, Cancelled, Failed)


class Recorder:
    """An on_event callback that keeps every event (thread-safe enough: appends only)."""

    def __init__(self) -> None:
        self.events: list = []
        self.done = threading.Event()
        self.tokens = threading.Semaphore(0)

    def __call__(self, event) -> None:
        self.events.append(event)
        if isinstance(event, TokenDelta):
            self.tokens.release()
        if isinstance(event, TERMINAL):
            self.done.set()

    def terminal(self) -> list:
        return [e for e in self.events if isinstance(e, TERMINAL)]

    def text(self) -> str:
        return "".join(e.text for e in self.events if isinstance(e, TokenDelta))

    def token_ids(self) -> list[int]:
        return [t for e in self.events if isinstance(e, TokenDelta) for t in e.token_ids]
