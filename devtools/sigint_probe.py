"""The CLI under Ctrl-C: SIGINT at random moments, queued and streaming, beside CPU hogs.

  python -m devtools.sigint_probe --rounds 12 --hogs 2 > sigint.json

A scheduler and one tiny-llama worker with room for one request or two (devtools.cluster);
each round starts 8 `ortserve generate` processes at once (some on --no-direct), so most
wait in the admission queue while one or two stream, and sends each a SIGINT at a random
moment (--window-s). A CLI still running --hang-s after its SIGINT is asked for every
thread's stack (SIGABRT, with PYTHONFAULTHANDLER=1) and counted as hung. After each round the
ledger must drain. One JSON object on stdout (exit codes, the slowest exit, the hung CLIs
with their stacks); progress on stderr. Issue 52, item 9: main's CLI hung 30 s+ about once
in 10 rounds, in the scheduler channel's close after a KeyboardInterrupt mid-call.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from devtools.cluster import LocalCluster, model_cache
from ortserve.v1 import scheduler_pb2, scheduler_pb2_grpc

BIN = Path(sys.executable).parent
BLOCK_BYTES = 64 * 512  # the tiny model: 64-token blocks of 512 B a token


def _drain(address: str, timeout_s: float = 60.0) -> int:
    stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(address))
    deadline = time.monotonic() + timeout_s
    while True:
        held = stub.GetBudget(scheduler_pb2.GetBudgetRequest(), timeout=10).total_reserved_bytes
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(0.1)


def run_round(address: str, rng: random.Random, window_s: tuple[float, float],
              hang_s: float) -> list[dict]:
    procs = []
    for _ in range(8):
        path = ["--no-direct"] if rng.random() < 0.3 else []
        process = subprocess.Popen(
            [str(BIN / "ortserve"), "--address", address, *path, "generate",
             "Count slowly to one thousand.", "--max-new-tokens", "400", "--min-new-tokens",
             "400"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONFAULTHANDLER": "1"})
        procs.append({"process": process, "at_s": rng.uniform(*window_s), "path": path})
    start = time.monotonic()
    ended: list[dict] = []
    while procs:
        for p in list(procs):
            process = p["process"]
            if "sent" not in p and process.poll() is not None:  # ended before its SIGINT
                procs.remove(p)
            elif "sent" not in p and time.monotonic() - start >= p["at_s"]:
                process.send_signal(signal.SIGINT)
                p["sent"] = time.monotonic()
            elif "sent" in p and process.poll() is not None:
                ended.append({"at_s": round(p["at_s"], 2), "path": p["path"],
                              "exit_s": round(time.monotonic() - p["sent"], 2),
                              "code": process.returncode, "stderr": process.stderr.read()[-400:]})
                procs.remove(p)
            elif "sent" in p and time.monotonic() - p["sent"] > hang_s:
                process.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack
                try:
                    _, err = process.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    _, err = process.communicate()
                ended.append({"at_s": round(p["at_s"], 2), "path": p["path"], "hung": True,
                              "stderr": err[-6000:]})
                procs.remove(p)
        time.sleep(0.02)
    return ended


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m devtools.sigint_probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--hogs", type=int, default=2, help="busy-looping processes beside it")
    p.add_argument("--window-s", type=float, nargs=2, default=(4.0, 14.0),
                   help="each SIGINT at a random moment in this window after its start")
    p.add_argument("--hang-s", type=float, default=30.0, help="running this long after: hung")
    p.add_argument("--seed", type=int, default=31)
    p.add_argument("--log-dir", type=Path, default=Path("logs/sigint"))
    a = p.parse_args(argv)
    rng = random.Random(a.seed)
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(a.hogs)]
    cluster = LocalCluster(model_dir=model_cache() / "models" / "tiny-llama", workers=1,
                           threads=1, log_dir=a.log_dir, kv_capacities=[str(8 * BLOCK_BYTES)])
    ended: list[dict] = []
    try:
        cluster.start()
        for r in range(a.rounds):
            ended += run_round(cluster.address, rng, tuple(a.window_s), a.hang_s)
            left = _drain(cluster.address)
            print(f"sigint_probe: round {r + 1}/{a.rounds}: {sum(e.get('hung', False) for e in ended)}"
                  f" hung so far; ledger {'drained' if not left else f'holds {left:,} B'}",
                  file=sys.stderr, flush=True)
    finally:
        cluster.stop()
        for hog in hogs:
            hog.kill()
    codes: dict[str, int] = {}
    for e in ended:
        key = "hung" if e.get("hung") else str(e["code"])
        codes[key] = codes.get(key, 0) + 1
    print(json.dumps({"sigints": len(ended), "exit_codes": codes,
                      "slowest_exit_s": max((e["exit_s"] for e in ended if "exit_s" in e), default=0),
                      "hung": [e for e in ended if e.get("hung")]}, indent=1))
    sys.exit(1 if codes.get("hung") else 0)


if __name__ == "__main__":
    main()
