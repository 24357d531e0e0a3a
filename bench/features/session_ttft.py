"""Turn 2's time to first token: a session that kept its KV vs re-sending the whole conversation.

  .venv/bin/python -m bench.features.session_ttft [--history-tokens 1000] [--repeats 3]

Both arms go through real processes (a scheduler and one CPU worker), the
same conversation and the same turn-2 question, interleaved per repeat so a
loaded machine slows both alike. The figure is the ratio of the medians
(fresh / reuse). JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import grpc

from devtools.cluster import LocalCluster, default_model_dir
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2

QUESTION = "Summarise the notes above in one sentence."


def _chat(*turns: tuple[str, str]) -> types_pb2.ChatMessages:
    return types_pb2.ChatMessages(messages=[types_pb2.ChatMessage(role=r, content=c)
                                            for r, c in turns])


def _finished(events) -> types_pb2.Finished:
    *_, last = events
    return last.finished


def history_text(stub, history_tokens: int) -> str:
    """A user message whose rendered chat prompt is about `history_tokens` tokens."""
    def text_and_count(n: int) -> tuple[str, int]:
        text = " ".join(f"note {i}." for i in range(n))
        adm = stub.Admit(scheduler_pb2.AdmitRequest(request=types_pb2.GenerateRequest(
            chat=_chat(("user", text)), max_new_tokens=1), dry_run=True), timeout=30)
        return text, adm.prompt_tokens

    _, per_50 = text_and_count(50)
    return text_and_count(max(50 * history_tokens // per_50, 1))[0]


def measure(address: str, history_tokens: int, repeats: int) -> dict:
    stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
    history = history_text(stub, history_tokens)
    reuse, fresh, reused = [], [], []
    for _ in range(repeats):
        sid = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
        turn1 = list(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
            session_id=sid, request=types_pb2.GenerateRequest(
                chat=_chat(("user", history)), max_new_tokens=8)), timeout=300))
        reply = "".join(e.chunk.text for e in turn1 if e.WhichOneof("event") == "chunk")
        turn2 = _finished(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
            session_id=sid, request=types_pb2.GenerateRequest(
                chat=_chat(("user", QUESTION)), max_new_tokens=1)), timeout=300))
        stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
        whole = _finished(stub.Generate(types_pb2.GenerateRequest(
            chat=_chat(("user", history), ("assistant", reply), ("user", QUESTION)),
            max_new_tokens=1), timeout=300))
        reuse.append(turn2.timings.ttft_ms)
        fresh.append(whole.timings.ttft_ms)
        reused.append(turn2.usage.reused_prompt_tokens)
        print(f"bench: turn-2 ttft reuse {reuse[-1]:.0f} ms ({reused[-1]} reused of "
              f"{turn2.usage.prompt_tokens}) vs fresh {fresh[-1]:.0f} ms", file=sys.stderr)
    return {"history_tokens": history_tokens, "turn2_prompt_tokens": turn2.usage.prompt_tokens,
            "reused_prompt_tokens": reused, "reuse_ttft_ms": reuse, "fresh_ttft_ms": fresh,
            "ratio_fresh_over_reuse": statistics.median(fresh) / statistics.median(reuse)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench.features.session_ttft", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--history-tokens", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as logs, LocalCluster(
            model_dir=default_model_dir(), log_dir=Path(logs), kv_capacities=["512MiB"]) as cluster:
        print(json.dumps(measure(cluster.address, a.history_tokens, a.repeats), indent=2))


if __name__ == "__main__":
    main()
