"""The load the dataplane benches put on a running cluster, and what they read back.

`grpc_streams` / `sse_streams` start n streams at once (gRPC through the
client, SSE through a gateway) and count tokens, messages and the gaps
between messages; `metrics_address` and `ort_cpu_s` read the worker's ORT
share from its /metrics; `start_gateway` adds a gateway to a cluster.
Used by bench/served/dataplane.py, bench/served/rate_set.py and bench/peers/serving_peers.py.
"""

from __future__ import annotations

import http.client
import json
import re
import sys
import threading
import time
import urllib.request
from pathlib import Path

from bench.common.measure import PROMPT
from devtools.cluster import Service, start_service, stop_service


def metrics_address(worker: Service, timeout_s: float = 30.0) -> str:
    """HOST:PORT of the worker's /metrics, from its 'metrics serving' log line."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for line in worker.log_path.read_text(errors="replace").splitlines():
            if "metrics serving" in line:  # JSON lines (a child's stderr) or console
                found = re.search(r'address"?[=:]\s*"?([\w.:\[\]-]+)', line)
                if found:
                    return found.group(1)
        time.sleep(0.1)
    raise RuntimeError(f"the worker logged no 'metrics serving' line in {timeout_s:g} s; "
                       f"see {worker.log_path}")


def ort_cpu_s(address: str) -> float:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    found = re.search(r"^ortserve_worker_ort_run_cpu_seconds (\S+)$", text, re.M)
    if not found:
        raise RuntimeError(f"no ortserve_worker_ort_run_cpu_seconds at http://{address}/metrics: "
                           "a worker older than the dataplane bench")
    return float(found.group(1))


# -- the clients ---------------------------------------------------------------------

INTERVAL_MS = 50  # the `interval` variant's GenerateRequest.stream_interval_ms
VARIANTS = ("relay", "direct", "interval")


def grpc_streams(client, prompt_ids: list[int], streams: int, new_tokens: int,
                 stream_interval_ms: int = 0) -> dict:
    """`streams` generation streams at once; tokens and chunk messages received, and the
    gaps between a stream's messages (seconds)."""
    counts = [(0, 0)] * streams
    gaps: list[float] = []
    errors: list[str] = []

    def one(i: int) -> None:
        tokens = messages = 0
        arrivals = []
        try:
            for chunk in client.stream(prompt_ids, max_new_tokens=new_tokens,
                                       min_new_tokens=new_tokens,
                                       stream_interval_ms=stream_interval_ms):
                arrivals.append(time.perf_counter())
                tokens += len(chunk.token_ids)
                messages += 1
        except Exception as exc:  # counted: a failed stream spoils the round
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        counts[i] = (tokens, messages)
        gaps.extend(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))

    return _run_threads(one, streams, counts, errors, gaps)


def sse_streams(address: str, model: str, streams: int, new_tokens: int) -> dict:
    """`streams` streaming /v1/completions at once through the gateway; tokens from usage,
    text events counted, and the gaps between a stream's text events (seconds)."""
    counts = [(0, 0)] * streams
    gaps: list[float] = []
    errors: list[str] = []
    host, port = address.rsplit(":", 1)
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": new_tokens,
                       "min_tokens": new_tokens, "stream": True,
                       "stream_options": {"include_usage": True}})

    def one(i: int) -> None:
        tokens = messages = 0
        arrivals = []
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=600)
            conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
            for line in response:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                doc = json.loads(line[6:])
                if doc.get("usage"):
                    tokens = doc["usage"]["completion_tokens"]
                elif doc.get("choices") and doc["choices"][0].get("text"):
                    arrivals.append(time.perf_counter())
                    messages += 1
            conn.close()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        counts[i] = (tokens, messages)
        gaps.extend(b - a for a, b in zip(arrivals, arrivals[1:], strict=False))

    return _run_threads(one, streams, counts, errors, gaps)


def _run_threads(one, streams: int, counts: list, errors: list, gaps: list) -> dict:
    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(streams)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    if errors:
        raise RuntimeError(f"dataplane: {len(errors)} of {streams} streams failed: {errors[0]}")
    return {"tokens": sum(c[0] for c in counts), "messages": sum(c[1] for c in counts),
            "wall_s": wall, "gaps_s": gaps}


def start_gateway(scheduler_address: str, log_dir: Path, args: list[str] = (),
                  timeout_s: float = 60.0) -> Service:
    gateway = start_service("gateway", [str(Path(sys.executable).with_name("ortserve-gateway")),
                                        "--port", "0", "--scheduler", scheduler_address,
                                        "--log-level", "warning", *args], log_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:  # bound and announced; wait until it answers
        try:
            with urllib.request.urlopen(f"http://{gateway.address}/health", timeout=2):
                return gateway
        except OSError:
            time.sleep(0.2)
    stop_service(gateway)
    raise RuntimeError(f"the gateway never answered /health; see {gateway.log_path}")


def served_model(address: str) -> str:
    with urllib.request.urlopen(f"http://{address}/v1/models", timeout=10) as reply:
        return json.load(reply)["data"][0]["id"]
