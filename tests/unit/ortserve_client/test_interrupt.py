"""The CLI's SIGINT handler (ortserve_client/interrupt.py), on a stand-in client: a stream
running is cancelled rather than interrupted mid-call; none running is KeyboardInterrupt;
a second SIGINT, or a CLI still running after the grace, exits at once."""

from __future__ import annotations

import threading

import pytest
from ortserve_client import interrupt as interrupt_module
from ortserve_client.interrupt import EXIT_INTERRUPTED, Interrupt


class _Client:
    def __init__(self, streams: int) -> None:
        self.streams = streams
        self.cancels = 0

    def cancel_streams(self):
        self.cancels += 1
        if not self.streams:
            return None
        thread = threading.Thread(target=lambda: None)
        thread.start()
        return thread


class _Exited(BaseException):
    pass


@pytest.fixture()
def exits(monkeypatch):
    codes: list[int] = []
    exited = threading.Event()

    def exit_(code: int) -> None:
        codes.append(code)
        exited.set()
        if threading.current_thread() is threading.main_thread():
            raise _Exited  # os._exit never returns; the grace thread's call just ends

    monkeypatch.setattr(interrupt_module.os, "_exit", exit_)
    return codes, exited


def test_a_running_stream_is_cancelled_and_nothing_is_raised_in_the_main_thread(exits):
    client = _Client(streams=1)
    handler = Interrupt(client, grace_s=3_600)
    handler._handle(2, None)  # no KeyboardInterrupt: the stream ends CANCELLED on its own path
    assert handler.fired and client.cancels == 1
    handler.settle()  # the cancel's thread joined
    with pytest.raises(_Exited):
        handler._handle(2, None)  # a second Ctrl-C: out now
    assert exits[0] == [EXIT_INTERRUPTED]


def test_with_no_stream_running_it_is_a_keyboard_interrupt(exits):
    handler = Interrupt(_Client(streams=0), grace_s=3_600)
    with pytest.raises(KeyboardInterrupt):
        handler._handle(2, None)
    assert exits[0] == []


def test_a_cli_not_ended_within_the_grace_exits(exits):
    handler = Interrupt(_Client(streams=1), grace_s=0.01)
    handler._handle(2, None)
    codes, exited = exits
    assert exited.wait(30) and codes == [EXIT_INTERRUPTED]


def test_install_and_restore_put_the_handler_back():
    import signal

    before = signal.getsignal(signal.SIGINT)
    handler = Interrupt(_Client(streams=0)).install()
    assert signal.getsignal(signal.SIGINT) == handler._handle
    handler.restore()
    assert signal.getsignal(signal.SIGINT) == before
