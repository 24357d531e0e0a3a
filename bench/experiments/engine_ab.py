"""A/B of engine variants against onnxruntime-genai on one model folder, interleaved.

  .venv/bin/python -m bench.experiments.engine_ab --model fp32 --arm base: --arm small:seq_tokens=256 \
      [--streams 1 8 16] [--rounds 6] [--tokens 32] [--threads 2]

Every arm is an in-process engine (EngineConfig fields as key=value, plus
`context`: a folder of symlinks whose genai_config declares that context
length, so the arena's rows are that long; and `ort.KEY=VALUE`: the ORT
session config entry session.KEY, e.g. ort.intra_op.allow_spinning=0) and the peer (onnxruntime-genai, in its own venv) always runs too.
Per round and stream count every arm and the peer run once, the order
rotating, so a shared machine's load hits all alike. Printed, per arm and
stream count: decode tokens/s (the bench's window) median and range, the
median of the per-round ratios to the peer, tokens per CPU second of the
process (all its threads: ORT's pool included), which load disturbs less, and
for engine arms the time to first token of the burst's last stream.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.common.measure import process_cpu_s
from bench.peers.engine_peers import GenaiPeer, InProcessEngine
from devtools.cluster import model_cache
from ortserve.process.logs import configure_logging


def _with_context(model_dir: Path, context: int) -> Path:
    out = Path(tempfile.mkdtemp(prefix="engine-ab-"))
    for item in model_dir.iterdir():
        if item.name != "genai_config.json":
            os.symlink(item, out / item.name)
    config = json.loads((model_dir / "genai_config.json").read_text())
    config["model"]["context_length"] = context
    (out / "genai_config.json").write_text(json.dumps(config))
    return out


def _value(text: str):
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _engine(model_dir: Path, threads: int, settings: dict) -> InProcessEngine:
    from worker_service.engine.config import EngineConfig
    from worker_service.engine.engine import Engine

    settings = dict(settings)
    entries = [(f"session.{k[4:]}", str(settings.pop(k))) for k in list(settings) if k.startswith("ort.")]
    if entries:
        settings["ort_session_config"] = tuple(entries)
    if "context" in settings:
        model_dir = _with_context(model_dir, int(settings.pop("context")))
    arm = InProcessEngine.__new__(InProcessEngine)
    arm.engine = Engine(EngineConfig(model_dir=model_dir, device="cpu", intra_op_threads=threads,
                                     kv_capacity_bytes=4 * 2**30, **settings))
    arm.ids = tuple(arm.engine.tokenizer.encode("Write a long story about a dragon who learns to paint."))
    arm._serial = 0
    return arm


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="fp32")
    p.add_argument("--arm", action="append", default=[], help="NAME:field=value,field=value")
    p.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--no-peer", action="store_true", help="engine arms only")
    a = p.parse_args()
    configure_logging("warning")
    path = model_cache() / "models" / f"smollm2-135m-instruct-{a.model}"
    arms = {}
    for text in a.arm or ["base:"]:
        name, _, rest = text.partition(":")
        arms[name] = _engine(path, a.threads, {k: _value(v) for k, v in
                                               (kv.split("=", 1) for kv in rest.split(",") if kv)})
    peer = None if a.no_peer else GenaiPeer(path, a.threads)
    names = [*arms, *([] if peer is None else ["genai"])]
    ids = next(iter(arms.values())).ids
    rate = {(n, s): [] for n in names for s in a.streams}
    per_cpu = {(n, s): [] for n in names for s in a.streams}
    loads = []

    ttft = {(n, s): [] for n in arms for s in a.streams}

    def run(name: str, streams: int, tokens: int) -> tuple[float, float]:
        pid = os.getpid() if name != "genai" else peer.proc.pid
        c0 = process_cpu_s(pid)
        if name == "genai":
            r = peer.decode(streams, tokens, ids)
        else:
            out = arms[name].decode(streams, tokens)
            r = out["decode"]
            ttft.setdefault((name, streams), []).append(out["ttft_max_ms"])
        cpu = process_cpu_s(pid) - c0
        return r, streams * tokens / cpu if cpu else float("nan")

    for n in names:  # warm-up
        run(n, max(a.streams), 8)
    try:
        for r in range(a.rounds):
            loads.append(os.getloadavg()[0])
            for s in a.streams:
                order = names[r % len(names):] + names[:r % len(names)]
                for n in order:
                    x, c = run(n, s, a.tokens)
                    rate[(n, s)].append(x)
                    per_cpu[(n, s)].append(c)
            print(f"round {r + 1}/{a.rounds} (load {loads[-1]:.1f}): " + ", ".join(
                f"{n}@{s} {rate[(n, s)][-1]:.1f}" for s in a.streams for n in names),
                file=sys.stderr, flush=True)
    finally:
        if peer is not None:
            peer.close()
        for arm in arms.values():
            arm.close()
    base = "genai" if peer is not None else names[0]
    for s in a.streams:
        for n in names:
            v, c = rate[(n, s)], per_cpu[(n, s)]
            ratios = [x / y for x, y in zip(v, rate[(base, s)], strict=True)]
            cpu_ratios = [x / y for x, y in zip(c, per_cpu[(base, s)], strict=True)]
            print(json.dumps({
                "arm": n, "streams": s, "tokens_per_s": round(statistics.median(v), 1),
                "range": [round(min(v), 1), round(max(v), 1)],
                f"ratio_to_{base}": round(statistics.median(ratios), 3),
                "ratio_range": [round(min(ratios), 3), round(max(ratios), 3)],
                "tokens_per_cpu_s": round(statistics.median(c), 1),
                "cpu_ratio": round(statistics.median(cpu_ratios), 3),
                "cpu_ratio_range": [round(min(cpu_ratios), 3), round(max(cpu_ratios), 3)],
                **({"ttft_last_ms": round(statistics.median(ttft[(n, s)][1:] or ttft[(n, s)]), 1)}
                   if n in arms else {})}))
    print(json.dumps({"model": a.model, "rounds": a.rounds, "tokens": a.tokens, "threads": a.threads,
                      "load_average_1m": [round(x, 1) for x in loads]}))


if __name__ == "__main__":
    main()
