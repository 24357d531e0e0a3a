"""A long session's next turn after a worker restart: from the disk tier vs prefilling again.

  .venv/bin/python -m bench.features.session_restart_ttft [--history-tokens 2000]
      [--repeats 3] [--model-dir DIR]

Real processes: a scheduler and one CPU worker with --session-dir (and no
prefix cache, so the fresh arm really prefills). Per repeat: a session's
turn 1 over a history of about --history-tokens tokens; once the worker has
written it to disk (GetSession says SESSION_ON_DISK), the worker is killed
(SIGKILL) and started again on the same folder; one warm-up request; then
turn 2 (one new token, read back from the file) and a fresh Generate of the
whole conversation (prefilled again), both measured as the client sees
them (call to first token) and as the worker times them (Finished.timings).
The figure is the ratio of the medians (fresh / from disk); issue 55's
target is >= 5. JSON on stdout, progress on stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.features.session_ttft import QUESTION, _chat, history_text
from devtools.cluster import LocalCluster, default_model_dir, wait_serving
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc, types_pb2


def _timed(events) -> tuple[float, types_pb2.Finished, list]:
    """(ms from the call to its first token, its Finished, every event)."""
    start, first, seen = time.perf_counter(), None, []
    for event in events:
        seen.append(event)
        if first is None and event.WhichOneof("event") == "chunk" and event.chunk.token_ids:
            first = (time.perf_counter() - start) * 1e3
    return first or float("nan"), seen[-1].finished, seen


def _restart(cluster: LocalCluster) -> None:
    old = cluster.worker_services[0]
    port = old.address.rsplit(":", 1)[1]
    old.process.kill()
    old.process.wait(60)
    cluster.services.remove(old)
    wait_serving(cluster.start_worker(0, ["--port", port]), "ortserve.v1.Worker")


def measure(cluster: LocalCluster, history_tokens: int, repeats: int) -> dict:
    stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(cluster.address))
    rows = []
    for r in range(repeats):
        history = f"Run {r}. " + history_text(stub, history_tokens)
        sid = stub.OpenSession(scheduler_pb2.OpenSessionRequest(), timeout=30).session_id
        _, _, turn1 = _timed(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
            session_id=sid, request=types_pb2.GenerateRequest(
                chat=_chat(("user", history)), max_new_tokens=8)), timeout=600))
        reply = "".join(e.chunk.text for e in turn1 if e.WhichOneof("event") == "chunk")
        deadline = time.monotonic() + 120
        info = stub.GetSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
        while info.state != types_pb2.SESSION_ON_DISK and time.monotonic() < deadline:
            time.sleep(0.05)
            info = stub.GetSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
        assert info.state == types_pb2.SESSION_ON_DISK, info
        _restart(cluster)
        list(stub.Generate(types_pb2.GenerateRequest(text="warm up", max_new_tokens=2),
                           timeout=120))  # the first runs after a start pay ORT's warm-up
        disk_ms, disk, _ = _timed(stub.SessionTurn(scheduler_pb2.SessionTurnRequest(
            session_id=sid, request=types_pb2.GenerateRequest(
                chat=_chat(("user", QUESTION)), max_new_tokens=1)), timeout=600))
        fresh_ms, fresh, _ = _timed(stub.Generate(types_pb2.GenerateRequest(
            chat=_chat(("user", history), ("assistant", reply), ("user", QUESTION)),
            max_new_tokens=1), timeout=600))
        stub.CloseSession(scheduler_pb2.SessionRequest(session_id=sid), timeout=30)
        rows.append({"prompt_tokens": disk.usage.prompt_tokens,
                     "reused_prompt_tokens": disk.usage.reused_prompt_tokens,
                     "file_bytes": info.disk_bytes,
                     "disk_client_ttft_ms": disk_ms, "fresh_client_ttft_ms": fresh_ms,
                     "disk_worker_ttft_ms": disk.timings.ttft_ms,
                     "fresh_worker_ttft_ms": fresh.timings.ttft_ms})
        print(f"bench: after a restart, turn 2 ({disk.usage.reused_prompt_tokens} of "
              f"{disk.usage.prompt_tokens} tokens from a {info.disk_bytes / 2**20:.1f} MiB file) "
              f"first token in {disk_ms:.0f} ms vs {fresh_ms:.0f} ms prefilled again",
              file=sys.stderr)
    med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
    return {"history_tokens": history_tokens, "model": cluster.model_dir.name, "runs": rows,
            "median": med,
            "ratio_fresh_over_disk_client": med["fresh_client_ttft_ms"] / med["disk_client_ttft_ms"],
            "ratio_fresh_over_disk_worker": med["fresh_worker_ttft_ms"] / med["disk_worker_ttft_ms"]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="bench.features.session_restart_ttft", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--history-tokens", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model-dir", type=Path, default=None)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as logs, tempfile.TemporaryDirectory() as sessions, \
            LocalCluster(model_dir=a.model_dir or default_model_dir(), log_dir=Path(logs),
                         kv_capacities=["512MiB"],
                         worker_args=["--session-dir", sessions, "--session-disk-after-s", "0.2",
                                      "--prefix-cache-bytes", "0"]) as cluster:
        print(json.dumps(measure(cluster, a.history_tokens, a.repeats), indent=2))


if __name__ == "__main__":
    main()
