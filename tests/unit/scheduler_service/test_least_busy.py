"""on_least_busy: the one fan-out Tokenize/Detokenize and prompt counting share."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from scheduler_service import least_busy, worker_patience
from scheduler_service.least_busy import NoneAnswered, on_least_busy
from scheduler_service.ledger.types import WorkerGeometry
from scheduler_service.ledger.worker_state import WorkerState


class Ledger:
    def __init__(self) -> None:
        self.marked: list[str] = []

    def unreachable(self, worker_id: str) -> bool:
        self.marked.append(worker_id)
        return True


class Workers:
    def stub(self, address: str) -> str:
        return address  # the call below gets the address as its "stub"

    def channel(self, address: str) -> str:
        return address


def worker(worker_id: str, leases: int, unreachable: bool = False) -> WorkerState:
    geometry = WorkerGeometry(worker_id=worker_id, address=f"{worker_id}:1", model="m",
                              context_length=64, bytes_per_token=8, capacity_bytes=1024)
    return WorkerState(geometry=geometry, last_heartbeat=0.0, unreachable=unreachable,
                       # Only their count is read here.
                       leases=dict.fromkeys(f"{worker_id}-{n}" for n in range(leases)))


def status(code: grpc.StatusCode) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), "said no")


@pytest.fixture
def answers(monkeypatch):
    """address -> what the worker does: an answer, an error to raise, or Unanswered."""
    table: dict[str, object] = {}
    tried: list[str] = []

    async def answer(call, channel, worker_id, what):
        tried.append(worker_id)
        outcome = table[channel]
        if outcome == "silent" or isinstance(outcome, Exception):
            call.close()  # never awaited: a real call is cancelled
        if outcome == "silent":
            raise worker_patience.Unanswered(worker_id, what)
        if isinstance(outcome, Exception):
            raise outcome
        return await call

    monkeypatch.setattr(least_busy.worker_patience, "answer", answer)
    return table, tried


async def echo(address: str) -> str:
    return address


def test_the_fewest_leases_are_asked_first_and_the_first_answer_wins(answers):
    table, tried = answers
    table.update({"a:1": "x", "b:1": "x", "c:1": "x"})
    candidates = [worker("a", 2), worker("b", 0), worker("c", 1)]
    got = asyncio.run(on_least_busy(Ledger(), Workers(), candidates, echo, "the call"))
    assert got == "b:1" and tried == ["b"]


def test_first_puts_the_preferred_before_the_least_busy(answers):
    table, tried = answers
    table.update({"a:1": "x", "b:1": "x"})
    candidates = [worker("a", 3), worker("b", 0, unreachable=True)]
    got = asyncio.run(on_least_busy(Ledger(), Workers(), candidates, echo, "the call",
                                    first=lambda w: w.unreachable))
    assert got == "a:1" and tried == ["a"]


def test_silent_and_unavailable_workers_are_passed_over_and_the_silent_marked(answers):
    table, tried = answers
    table.update({"a:1": "silent", "b:1": status(grpc.StatusCode.UNAVAILABLE), "c:1": "x"})
    ledger = Ledger()
    candidates = [worker("a", 0), worker("b", 1), worker("c", 2)]
    got = asyncio.run(on_least_busy(ledger, Workers(), candidates, echo, "Tokenize"))
    assert got == "c:1" and tried == ["a", "b", "c"]
    assert ledger.marked == ["a"]  # UNAVAILABLE is a refused connection, not a hung process


def test_none_answering_says_why_for_each_in_order(answers):
    table, _ = answers
    refused = status(grpc.StatusCode.UNAVAILABLE)
    table.update({"a:1": "silent", "b:1": refused})
    with pytest.raises(NoneAnswered) as caught:
        asyncio.run(on_least_busy(Ledger(), Workers(), [worker("b", 1), worker("a", 0)], echo,
                                  "Tokenize"))
    assert caught.value.unavailable is refused
    assert [r.split(":")[0] for r in caught.value.reasons] == ["a", "b"]
    assert "answered neither Tokenize" in caught.value.reasons[0]
    assert caught.value.reasons[1] == "b: said no"


def test_a_workers_judgement_is_raised_as_it_is_and_no_other_is_asked(answers):
    table, tried = answers
    judged = status(grpc.StatusCode.INVALID_ARGUMENT)
    table.update({"a:1": judged, "b:1": "x"})
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        asyncio.run(on_least_busy(Ledger(), Workers(), [worker("a", 0), worker("b", 1)], echo,
                                  "Tokenize"))
    assert caught.value is judged and tried == ["a"]


def test_no_candidate_is_none_answered_with_no_reason(answers):
    with pytest.raises(NoneAnswered) as caught:
        asyncio.run(on_least_busy(Ledger(), Workers(), [], echo, "Tokenize"))
    assert caught.value.reasons == [] and caught.value.unavailable is None
