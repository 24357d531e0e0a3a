"""Ctrl-C (SIGINT) in the CLI: the streams in flight are cancelled, then the CLI ends.

Python's own handler raises KeyboardInterrupt wherever the main thread happens to be,
gRPC's own call machinery included. Under load that left a call nobody drives: the
CLI said "interrupted", then waited forever in the scheduler channel's close (a
faulthandler dump: grpc/_channel.py _close, threading wait), its lease held until the
scheduler expired it (1 of ~80 SIGINTs at random moments beside two CPU hogs). Here a
SIGINT while a stream runs cancels the stream from a thread (what a caller's cancel does:
the worker frees the KV, a lease no worker claimed is released, a queued Admit leaves the
queue), and the main thread ends by its ordinary path, CANCELLED, with its cleanup
whole. With no stream running (reading stdin, a unary call) it raises KeyboardInterrupt
as Python would. Whatever the path, a CLI that has not ended GRACE_S after the first
SIGINT, or that gets a second one, exits at once (130). An interrupted CLI leaves
through os._exit once its cleanup is done (cli.main): the interpreter's own shutdown
collects gRPC's call objects, whose finalizers take locks a daemon thread frozen at
shutdown may hold (seen: a CLI hung "Garbage-collecting" in grpc/_channel.py __del__).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

GRACE_S = 10.0
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for an interrupted command


class Interrupt:
    """The CLI's SIGINT handler over a Client's running streams."""

    def __init__(self, client, grace_s: float = GRACE_S) -> None:
        self._client = client
        self._grace_s = grace_s
        self.fired = False
        self._previous = None
        self._cancelling: threading.Thread | None = None
        self._fired_at = 0.0

    def install(self) -> Interrupt:
        self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.fired:  # a second Ctrl-C: the user will not wait for the cleanup
            _exit_now("interrupted again: exiting without waiting for the cleanup")
        self.fired, self._fired_at = True, time.monotonic()
        threading.Thread(target=self._bound, name="ortserve-sigint-grace", daemon=True).start()
        self._cancelling = self._client.cancel_streams()
        if self._cancelling is not None:
            return  # the main thread's stream ends CANCELLED; it exits on that path
        raise KeyboardInterrupt

    def settle(self) -> None:
        """Wait for the streams' cancel (a lease given back) to end, within the grace."""
        if self._cancelling is not None:
            self._cancelling.join(max(self._fired_at + self._grace_s - time.monotonic(), 0.0))

    def _bound(self) -> None:
        time.sleep(self._grace_s)
        _exit_now(f"did not end within {self._grace_s:g} s of the interrupt: exiting; a lease "
                  "it held goes back when its worker or the scheduler sees the call gone")


def _exit_now(why: str) -> None:
    try:
        sys.stderr.write(f"ortserve: {why}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_INTERRUPTED)
