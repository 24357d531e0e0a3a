"""`ortserve chat`: a multi-turn REPL on a session; each stdin line is one user turn.

stdout carries the assistant's replies only (one per turn, then a newline);
the session, caps and --stats go to stderr. With stdin not a terminal (a
pipe, a file, `--script FILE`) it is the scripted form: one turn per line,
no prompt, and the exit code says whether every turn succeeded. The session
is closed on EOF, Ctrl-C or an error, so its bytes go back at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import grpc

from ortserve.status.units import human_bytes
from ortserve.v1 import scheduler_pb2, types_pb2

from . import flags
from .client import Client, GenerationStream
from .errors import from_rpc_error
from .report import cap_notice, notice, stats_lines
from .request import build_request
from .types import Admission, GenerateResult

_STATE = {types_pb2.SESSION_EMPTY: "empty", types_pb2.SESSION_BUSY: "busy",
          types_pb2.SESSION_RESIDENT: "resident", types_pb2.SESSION_SWAPPED: "swapped"}


class ChatSession:
    """A session over a Client: open, turns (each a GenerationStream), state, close."""

    def __init__(self, client: Client, model: str = "") -> None:
        """`model`: the served model the session is bound to; empty: the cluster's one model."""
        self._client = client
        self._stub = client._stub
        try:
            self.info = self._stub.OpenSession(scheduler_pb2.OpenSessionRequest(model=model),
                                               timeout=client.timeout_s)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        self.session_id = self.info.session_id

    def turn(self, messages: list[tuple[str, str]], *, on_admission=None,
             **kw) -> GenerationStream:
        """Send one turn: the (role, content) messages it adds to the conversation; iterate
        the stream for chunks (see build_request for `kw`)."""
        request = build_request(chat=messages, **kw)

        def start(timeout_s):
            return self._stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
                session_id=self.session_id, request=request), timeout=timeout_s)

        # No retry: a turn is not idempotent (the conversation grew by its messages).
        return GenerationStream(start, on_admission, timeout_s=self._client.timeout_s,
                                live=self._client.live_streams)

    def state(self) -> types_pb2.SessionInfo:
        try:
            return self._stub.GetSession(scheduler_pb2.SessionRequest(session_id=self.session_id),
                                         timeout=self._client.timeout_s)
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None

    def close(self) -> int:
        try:
            return self._stub.CloseSession(scheduler_pb2.SessionRequest(
                session_id=self.session_id), timeout=self._client.timeout_s).freed_bytes
        except grpc.RpcError:
            return 0  # gone already (expired, worker lost): nothing is held for it


def session_stats(turn: int, result: GenerateResult, info: types_pb2.SessionInfo) -> list[str]:
    u = result.usage
    lines = [f"stats: turn={turn} prompt_tokens={u.prompt_tokens:,} "
             f"reused_prompt_tokens={u.reused_prompt_tokens:,} "
             f"prefilled_tokens={u.prompt_tokens - u.reused_prompt_tokens:,} "
             f"session_state={_STATE.get(info.state, '?')} held_tokens={info.held_tokens:,} "
             f"reserved_bytes={info.reserved_bytes:,}"]
    return lines + stats_lines(result)


def _lines(a: argparse.Namespace) -> Iterator[str]:
    """The user turns: the script's lines, or stdin's (with a prompt on a terminal)."""
    if a.script:
        with open(a.script, encoding="utf-8") as script:
            yield from (line for line in script.read().splitlines() if line.strip())
        return
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return
        if line.strip():
            yield line.rstrip("\n")


def cmd_chat(client: Client, a: argparse.Namespace) -> int:
    session = ChatSession(client, a.model)
    notice(f"session {session.session_id} on worker {session.info.worker_id} "
           f"({session.info.worker_address}), model {session.info.model}; one line per turn, "
           "EOF to end")
    kw = {name: getattr(a, name) for name in ("max_new_tokens", "min_new_tokens", "temperature",
                                              "seed", "max_itl_ms", "max_ttft_ms")
          if getattr(a, name) is not None}
    try:
        for turn, line in enumerate(_lines(a), start=1):
            def announce(admission: Admission, turn: int = turn) -> None:
                if admission.budget_cap:
                    notice(f"turn {turn}: " + cap_notice(admission.budget_cap))

            # A system message goes with the first user turn (a turn is answered).
            system = [("system", a.system)] if a.system and turn == 1 else []
            stream = session.turn([*system, ("user", line)], on_admission=announce, **kw)
            for chunk in stream:
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
            sys.stdout.write("\n")
            sys.stdout.flush()
            if a.stats:
                for text in session_stats(turn, stream.result, session.state()):
                    notice(text)
    finally:
        freed = session.close()
        notice(f"session {session.session_id} closed ({human_bytes(freed)} returned)")
    return 0


def add_parser(sub) -> None:
    c = sub.add_parser("chat", help="a multi-turn chat on a session (one stdin line per turn)")
    c.add_argument("--system", help="a system message before the first turn")
    c.add_argument("--script", help="read the turns from this file (one per line) instead of stdin")
    c.add_argument("--max-new-tokens", type=flags.max_new_tokens,
                   help="per turn; unset: the remaining context window (may be capped)")
    c.add_argument("--min-new-tokens", type=flags.uint32, help="per turn")
    c.add_argument("--temperature", type=flags.temperature, help=">= 0; unset or 0: greedy")
    c.add_argument("--seed", type=flags.uint64)
    flags.add_goal_flags(c, ", per turn")
    c.add_argument("--stats", action="store_true",
                   help="per turn on stderr: prompt tokens reused vs prefilled, session state, timings")
    c.add_argument("--model", default="",
                   help="the served model the session is bound to; unset: the cluster's one model")
    c.set_defaults(func=cmd_chat)
