"""Time to first token for a shared prompt prefix: cached by the worker's prefix cache vs not.

  .venv/bin/python -m bench.features.prefix_ttft [--prefix-tokens 1000] [--repeats 3] [--chat-turns 4]

Through real processes (a scheduler and one CPU worker, cache at its default).
Per repeat, a fresh random token-id prefix: a first request over it (nothing
cached: the cold time, and it fills the cache), then a second request with the
same prefix and another tail (the hit). Cold and hit alternate, so a loaded
machine slows both alike; the figure is the ratio of the medians (cold / hit).
With --chat-turns N, a chat through the gateway's path (text messages through
the scheduler) that resends its whole history for N turns, once on a worker
with the cache and once on one without (--prefix-cache-bytes 0): turn N's
time to first token each way. JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
from pathlib import Path

import grpc

from devtools.cluster import LocalCluster, default_model_dir
from ortserve.v1 import scheduler_pb2_grpc, types_pb2

NOTES = " ".join(f"Note {i}: the meeting moved to room {i % 7}." for i in range(60))


def _finished(stub, request: types_pb2.GenerateRequest) -> types_pb2.Finished:
    *_, last = stub.Generate(request, timeout=600)
    return last.finished


def measure_prefix(address: str, prefix_tokens: int, repeats: int) -> dict:
    stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
    rng = random.Random(1)
    cold, hit, cached = [], [], []
    for _ in range(repeats):
        prefix = [rng.randrange(100, 40_000) for _ in range(prefix_tokens)]
        runs = []
        for tail in ([11, 12, 13], [21, 22, 23]):
            runs.append(_finished(stub, types_pb2.GenerateRequest(
                token_ids=types_pb2.TokenIds(ids=prefix + tail), max_new_tokens=1)))
        cold.append(runs[0].timings.ttft_ms)
        hit.append(runs[1].timings.ttft_ms)
        cached.append(runs[1].usage.cached_tokens)
        print(f"bench: ttft cold {cold[-1]:.0f} ms, hit {hit[-1]:.0f} ms "
              f"({cached[-1]} of {runs[1].usage.prompt_tokens} cached)", file=sys.stderr)
    return {"prefix_tokens": prefix_tokens, "cold_ttft_ms": cold, "hit_ttft_ms": hit,
            "cached_tokens": cached,
            "ratio_cold_over_hit": statistics.median(cold) / statistics.median(hit)}


def measure_chat(address: str, turns: int) -> dict:
    """Turn `turns`'s TTFT of a chat that resends its history (OpenAI style)."""
    stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
    messages = [("system", NOTES), ("user", "What moved?")]
    last = None
    for turn in range(turns):
        request = types_pb2.GenerateRequest(chat=types_pb2.ChatMessages(messages=[
            types_pb2.ChatMessage(role=r, content=c) for r, c in messages]), max_new_tokens=16)
        events = list(stub.Generate(request, timeout=600))
        reply = "".join(e.chunk.text for e in events if e.WhichOneof("event") == "chunk")
        last = events[-1].finished
        messages += [("assistant", reply), ("user", f"And after that? ({turn})")]
    return {"turns": turns, "last_prompt_tokens": last.usage.prompt_tokens,
            "last_cached_tokens": last.usage.cached_tokens, "last_ttft_ms": last.timings.ttft_ms}


def prefix_section(model_dir: Path, quick: bool) -> dict:
    """make bench's prefix-cache figure: measure_prefix through a scheduler and one worker on
    `model_dir` (--quick: one repeat of a 200-token prefix)."""
    with tempfile.TemporaryDirectory() as logs, LocalCluster(
            model_dir=model_dir, log_dir=Path(logs), kv_capacities=["512MiB"]) as cluster:
        return measure_prefix(cluster.address, 200 if quick else 1000, 1 if quick else 3)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench.features.prefix_ttft", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix-tokens", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chat-turns", type=int, default=0)
    a = p.parse_args(argv)
    out = {}
    with tempfile.TemporaryDirectory() as logs, LocalCluster(
            model_dir=default_model_dir(), log_dir=Path(logs), kv_capacities=["512MiB"]) as cluster:
        out["prefix"] = measure_prefix(cluster.address, a.prefix_tokens, a.repeats)
        if a.chat_turns:
            out["chat_cached"] = measure_chat(cluster.address, a.chat_turns)
    if a.chat_turns:
        with tempfile.TemporaryDirectory() as logs, LocalCluster(
                model_dir=default_model_dir(), log_dir=Path(logs), kv_capacities=["512MiB"],
                worker_args=["--prefix-cache-bytes", "0"]) as cluster:
            out["chat_uncached"] = measure_chat(cluster.address, a.chat_turns)
        out["chat_ratio_uncached_over_cached"] = (out["chat_uncached"]["last_ttft_ms"]
                                                  / out["chat_cached"]["last_ttft_ms"])
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
