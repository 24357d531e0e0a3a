"""Sessions across the fault run (devtools.chaos): none lost, none changed.

Each session client keeps one token-id session on a worker with a disk tier
(--session-dir, --session-disk-after-s 0): a turn, then it waits until the
session is on disk (GetSession: SESSION_ON_DISK, its lease at 0 KV bytes),
rests, and takes another turn. Every turn's tokens are checked against a
fresh Generate of the whole conversation with the same seeded sampling (fp32
on the CPU: reuse is bit-exact against prefilling again), so a session that
came back from its file with wrong K/V shows. A worker is killed only while
no session client is between a turn's start and its session's return to disk
(`ParkedGate`): every session then lives on disk at the kill, and one that
does not continue afterwards (its turn retried, NOT_FOUND included, for
RETRY_S) is lost.

Outcomes: turns checked, `changed` (a turn's tokens differ from the fresh
run: a violation), `lost` (the session could not continue within the retry
window, or its worker's restart forgot it: a violation), `unseen_turn` (a turn
landed while its reply was lost with a killed scheduler: the client cannot
know the reply's tokens, so it closes the session and opens another; not a
violation).
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import grpc

from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

RETRY_S = 90.0  # a turn may wait this long for its worker to come back (a kill, a stop)
SAMPLING = types_pb2.SamplingParams(temperature=1.0, seed=7)


class ParkedGate:
    """Session clients enter before a turn and leave once their session is on disk; a
    worker kill waits until none is inside (and lets none in meanwhile)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self._closed = False

    def enter(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: not self._closed)
            self._inside += 1

    def leave(self) -> None:
        with self._cond:
            self._inside -= 1
            self._cond.notify_all()

    def close(self, timeout_s: float) -> bool:
        """Bar new turns; True once none is inside (False: timed out, still barred)."""
        with self._cond:
            self._closed = True
            return self._cond.wait_for(lambda: self._inside == 0, timeout_s)

    def open(self) -> None:
        with self._cond:
            self._closed = False
            self._cond.notify_all()


@dataclass
class SessionTally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    opened: int = 0
    turns: int = 0
    changed: list[dict] = field(default_factory=list)
    lost: list[dict] = field(default_factory=list)
    unseen_turn: int = 0
    closed: int = 0

    def report(self) -> dict:
        with self.lock:
            return {"opened": self.opened, "turns_checked": self.turns,
                    "changed": len(self.changed), "lost": len(self.lost),
                    "unseen_turn": self.unseen_turn, "closed": self.closed,
                    "changed_samples": self.changed[:5], "lost_samples": self.lost[:5]}


def _tokens(events) -> tuple[list[int], types_pb2.Finished]:
    events = list(events)
    ids = [t for e in events if e.WhichOneof("event") == "chunk" for t in e.chunk.token_ids]
    return ids, events[-1].finished


class SessionClient:
    def __init__(self, address: str, index: int, gate: ParkedGate, tally: SessionTally,
                 stop: threading.Event) -> None:
        self.address, self.rng = address, random.Random(1_000 + index)
        self.gate, self.tally, self.stop = gate, tally, stop

    def _stub(self, channel) -> scheduler_pb2_grpc.SchedulerStub:
        return scheduler_pb2_grpc.SchedulerStub(channel)

    def _retry(self, call, what: str):
        """`call()` until it answers; None when RETRY_S passed. NOT_FOUND is retried too: a
        restarted scheduler knows a session only once its worker registered again."""
        deadline = time.monotonic() + RETRY_S
        while time.monotonic() < deadline:
            try:
                with grpc.insecure_channel(self.address) as channel:
                    return call(self._stub(channel))
            except grpc.RpcError:
                time.sleep(0.5)
        return None

    def run(self) -> None:
        while not self.stop.is_set():
            self.one_session()

    def one_session(self) -> None:
        opened = self._retry(lambda s: s.OpenSession(scheduler_pb2.OpenSessionRequest(),
                                                     timeout=10), "open")
        if opened is None:
            return
        sid, history, turns = opened.session_id, [], 0
        with self.tally.lock:
            self.tally.opened += 1
        while not self.stop.is_set() and turns < 6:
            new = [self.rng.randrange(100, 1_000) for _ in range(self.rng.randint(4, 12))]
            self.gate.enter()
            try:
                outcome = self.turn(sid, history, new, turns)
            finally:
                self.gate.leave()
            if outcome is None:
                return  # lost or unseen: counted, a new session next
            history, turns = outcome, turns + 1
            self.stop.wait(self.rng.uniform(0.5, 3.0))
        if self._retry(lambda s: s.CloseSession(scheduler_pb2.SessionRequest(session_id=sid),
                                                timeout=30), "close") is not None:
            with self.tally.lock:
                self.tally.closed += 1

    def turn(self, sid: str, history: list[int], new: list[int], turns: int) -> list[int] | None:
        """One turn, checked, and its session back on disk; the conversation after it."""
        request = types_pb2.GenerateRequest(token_ids=types_pb2.TokenIds(ids=new),
                                            max_new_tokens=8, sampling=SAMPLING, ignore_eos=True)
        deadline = time.monotonic() + RETRY_S
        got = None
        while got is None and time.monotonic() < deadline:
            try:
                with grpc.insecure_channel(self.address) as channel:
                    got = _tokens(self._stub(channel).SessionTurn(
                        scheduler_pb2.SessionTurnRequest(session_id=sid, request=request),
                        timeout=30))
            except grpc.RpcError:
                info = self._retry(lambda s: s.GetSession(
                    scheduler_pb2.SessionRequest(session_id=sid), timeout=10), "get")
                if info is not None and info.turns > turns:
                    with self.tally.lock:
                        self.tally.unseen_turn += 1
                    return None
                time.sleep(0.5)
        if got is None:
            with self.tally.lock:
                self.tally.lost.append({"session_id": sid, "turns": turns,
                                        "at": time.strftime("%H:%M:%S")})
            return None
        ids, finished = got
        prompt = [*history, *new]
        fresh = self._retry(lambda s: _tokens(s.Generate(types_pb2.GenerateRequest(
            token_ids=types_pb2.TokenIds(ids=prompt), max_new_tokens=8, sampling=SAMPLING,
            ignore_eos=True),
            timeout=30)), "fresh")
        with self.tally.lock:
            self.tally.turns += 1
            if fresh is not None and fresh[0] != ids:
                self.tally.changed.append({"session_id": sid, "turn": turns + 1,
                                           "tokens": ids, "fresh": fresh[0],
                                           "reused": finished.usage.reused_prompt_tokens})
        self.wait_on_disk(sid)
        return [*prompt, *ids]

    def wait_on_disk(self, sid: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stop.is_set():
            info = self._retry(lambda s: s.GetSession(
                scheduler_pb2.SessionRequest(session_id=sid), timeout=10), "get")
            if info is None or (info.state in (types_pb2.SESSION_ON_DISK,
                                               types_pb2.SESSION_EMPTY)
                                and info.reserved_bytes == 0):
                return
            time.sleep(0.05)
