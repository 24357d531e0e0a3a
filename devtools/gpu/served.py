"""A served request on one device: scheduler + one worker + gateway, asked as a user would.

  python -m devtools.gpu.served --model-dir DIR --device cuda --result F --log-dir LOGS

Starts the three processes on free loopback ports (devtools.cluster, as `make cluster` does;
`python -m` where ortserve is not installed), then: a chat completion through the gateway,
plain and streamed (TTFT, chunks, usage, decode tokens/s), the CLI's `generate --chat
--stats`, `info --json` and `budget`. The result goes to F after every request, so a step
stopped at its timeout keeps what it had; SIGTERM stops the services before it exits.
Exit 0 when the plain and streamed requests both answered and the CLI exited 0, else 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import subprocess
import sys
import time
import traceback
import urllib.request
from pathlib import Path

from devtools.cluster import (
    ClusterError,
    LocalCluster,
    console_command,
    start_service,
    stop_service,
)

PROMPT = "Name three rivers."
MAX_TOKENS = 32


def guarded(fn) -> dict:
    t0 = time.perf_counter()
    try:
        out = fn()
    except Exception as error:  # noqa: BLE001 - one request's failure leaves the others'
        out = {"error": f"{type(error).__name__}: {error}"[:2000],
               "trace": traceback.format_exc()[-2000:]}
    out.setdefault("seconds", round(time.perf_counter() - t0, 2))
    return out


def http(base: str, method: str, path: str, body: dict | None = None, timeout_s: float = 60):
    request = urllib.request.Request(base + path, method=method,
                                     data=json.dumps(body).encode() if body else None,
                                     headers={"content-type": "application/json"})
    return urllib.request.urlopen(request, timeout=timeout_s)


def wait_for_model(base: str, gateway, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gateway.process.poll() is not None:
            raise ClusterError(f"the gateway exited ({gateway.process.returncode}): "
                               f"{gateway.log_tail()}")
        with contextlib.suppress(OSError, ValueError, KeyError, IndexError), \
                http(base, "GET", "/v1/models", timeout_s=5) as reply:
            return json.loads(reply.read())["data"][0]["id"]
        time.sleep(0.5)
    raise ClusterError(f"the gateway listed no model within {timeout_s:g} s")


def chat_plain(base: str, ask: dict) -> dict:
    t0 = time.perf_counter()
    with http(base, "POST", "/v1/chat/completions", ask) as reply:
        body = json.loads(reply.read())
        decision = reply.headers.get("X-Ortserve-Decision")
    choice = body["choices"][0]
    return {"latency_ms": round((time.perf_counter() - t0) * 1e3, 1), "decision": decision,
            "usage": body.get("usage"), "finish_reason": choice.get("finish_reason"),
            "text": (choice["message"].get("content") or "")[:300]}


def chat_streamed(base: str, ask: dict) -> dict:
    t0 = time.perf_counter()
    first, chunks, usage = None, 0, None
    streamed = {**ask, "stream": True, "stream_options": {"include_usage": True}}
    with http(base, "POST", "/v1/chat/completions", streamed) as reply:
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            event = json.loads(line[5:])
            usage = event.get("usage") or usage
            if event.get("choices") and event["choices"][0].get("delta", {}).get("content"):
                chunks += 1
                first = first or time.perf_counter()
    end = time.perf_counter()
    tokens = (usage or {}).get("completion_tokens") or 0
    return {"ttft_ms": round((first - t0) * 1e3, 1) if first else None,
            "total_ms": round((end - t0) * 1e3, 1), "content_chunks": chunks, "usage": usage,
            "decode_tokens_per_s": round((tokens - 1) / (end - first), 1)
            if first and tokens > 1 and end > first else None}


def cli(address: str, *words: str, timeout_s: float = 60) -> dict:
    argv = [*console_command("ortserve"), "--address", address, *words]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"exit": "timeout", "argv": argv[-len(words):]}
    out: dict = {"exit": done.returncode, "stdout": done.stdout[-1500:],
                 "stderr": done.stderr[-1500:]}
    with contextlib.suppress(ValueError):
        out["json"] = json.loads(done.stdout)
        del out["stdout"]
    return out


def serve_and_ask(model_dir: Path, device: str, log_dir: Path, kv_capacity: str | None,
                  write) -> dict:
    out: dict = {"model_dir": str(model_dir), "device": device}
    cluster = LocalCluster(model_dir=model_dir, log_dir=log_dir, device=device,
                           kv_capacities=[kv_capacity] if kv_capacity else [])
    gateway = None
    try:
        t0 = time.perf_counter()
        cluster.start()
        out["cluster_started_s"] = round(time.perf_counter() - t0, 1)
        gateway = start_service("gateway", [*console_command("ortserve-gateway"), "--port", "0",
                                            "--scheduler", cluster.address], log_dir)
        base = f"http://{gateway.address}"
        model = wait_for_model(base, gateway, 60)
        out["model"] = model
        out["ready_s"] = round(time.perf_counter() - t0, 1)
        out["pids"] = {s.name: s.process.pid for s in [*cluster.services, gateway]}
        write(out)
        ask = {"model": model, "messages": [{"role": "user", "content": PROMPT}],
               "max_tokens": MAX_TOKENS, "temperature": 0}
        out["chat_plain"] = guarded(lambda: chat_plain(base, ask))
        write(out)
        out["chat_stream"] = guarded(lambda: chat_streamed(base, ask))
        write(out)
        out["cli_generate"] = cli(cluster.address, "generate", PROMPT, "--chat", "--stats",
                                  "--max-new-tokens", str(MAX_TOKENS))
        out["cli_info"] = cli(cluster.address, "info", "--json")
        out["cli_budget"] = cli(cluster.address, "budget")
        write(out)
    finally:
        if gateway is not None:
            stop_service(gateway)
        # the worker's last lines say what it reserved and resolved: keep them with the result
        tails = {s.name: s.log_tail(15) for s in cluster.services}
        cluster.stop()
        out["log_tails"] = tails
    return out


def succeeded(out: dict) -> bool:
    plain, stream = out.get("chat_plain", {}), out.get("chat_stream", {})
    return ("error" not in plain and (plain.get("usage") or {}).get("completion_tokens", 0) > 0
            and "error" not in stream and stream.get("content_chunks", 0) > 0
            and out.get("cli_generate", {}).get("exit") == 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gpu.served",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--result", type=Path, required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--kv-capacity", default=None, help="the worker's --kv-capacity")
    args = parser.parse_args(argv)

    def stop(signum, frame):  # the proof's timeout: leave through the finally blocks
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    out: dict = {}

    def write(partial: dict) -> None:
        out.update(partial)
        args.result.write_text(json.dumps(out, indent=1, default=str))

    try:
        write(serve_and_ask(args.model_dir, args.device, args.log_dir, args.kv_capacity, write))
    except (ClusterError, OSError) as error:
        write({"error": f"{type(error).__name__}: {error}"[:4000]})
    out["ok"] = succeeded(out)
    write(out)
    print(f"served: ok={out['ok']} plain={out.get('chat_plain', {}).get('latency_ms')} ms "
          f"stream ttft={out.get('chat_stream', {}).get('ttft_ms')} ms", file=sys.stderr)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
