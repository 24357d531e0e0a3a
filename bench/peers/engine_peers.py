"""The engine in this process beside onnxruntime-genai in its own venv, on the same model.

`InProcessEngine` keeps one Engine loaded and times n identical streams;
`GenaiPeer` keeps the peer loaded in .venv-tools, answering one request line
at a time; `engine_vs_genai` interleaves the two per repeat and stream count.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from bench.common.measure import PROMPT, ForeignLoad, progress, window_rate
from bench.common.roofline import read_bandwidth

ROOT = Path(__file__).resolve().parents[2]
TOOLS_PYTHON = ROOT / ".venv-tools" / "bin" / "python"


class InProcessEngine:
    """One Engine, kept loaded; `decode(n)` runs n identical streams and times their tokens."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        from worker_service.engine.config import EngineConfig
        from worker_service.engine.engine import Engine

        self.engine = Engine(EngineConfig(model_dir=model_dir, device="cpu", intra_op_threads=threads,
                                          kv_capacity_bytes=4 * 2**30))
        self.ids = tuple(self.engine.tokenizer.encode(PROMPT))
        self._serial = 0

    def decode(self, streams: int, new_tokens: int) -> dict:
        """Decode tokens/s of `streams` sequences submitted at once (the bench's window)."""
        from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest, TokenDelta

        times: dict[str, list[float]] = {}
        done: list = []
        finished = threading.Event()

        def on_event(event) -> None:  # the engine thread: keep it cheap
            if isinstance(event, TokenDelta):
                times[event.sequence_id].append(time.perf_counter())
            elif isinstance(event, TERMINAL):
                done.append(event)
                if len(done) == streams:
                    finished.set()

        self._serial += 1
        for i in range(streams):
            sid = f"b{self._serial}-{i}"
            times[sid] = []
            self.engine.submit(SequenceRequest(sequence_id=sid, prompt_ids=self.ids,
                                               max_new_tokens=new_tokens, min_new_tokens=new_tokens),
                               on_event)
        if not finished.wait(900):
            raise RuntimeError("engine bench: streams did not finish in 900 s")
        failed = [e for e in done if not isinstance(e, Completed)]
        if failed:
            raise RuntimeError(f"engine bench sequence failed: {failed[0]}")
        if any(e.generated_tokens != new_tokens for e in done):
            raise RuntimeError("engine bench: a stream did not produce exactly new_tokens tokens")
        return {"decode": window_rate(list(times.values())),
                "ttft_ms": min(e.ttft_ms for e in done),
                "ttft_max_ms": max(e.ttft_ms for e in done)}

    def close(self) -> None:
        self.engine.close()


class GenaiPeer:
    """onnxruntime-genai in its own venv, kept loaded, answering one request line at a time."""

    def __init__(self, model_dir: Path, threads: int) -> None:
        self.proc = subprocess.Popen(
            [str(TOOLS_PYTHON), str(ROOT / "bench" / "peers" / "genai_peer.py"), "--model-dir", str(model_dir),
             "--threads", str(threads), "--serve"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        hello = self._read()
        self.version = hello["genai_version"]

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"genai peer exited: {self.proc.stderr.read()[-2000:]}")
        return json.loads(line)

    def decode(self, batch: int, new_tokens: int, prompt_ids) -> float:
        self.proc.stdin.write(json.dumps({"batch": batch, "new_tokens": new_tokens,
                                          "prompt_ids": list(prompt_ids)}) + "\n")
        self.proc.stdin.flush()
        return self._read()["decode_tokens_per_s"]

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def engine_vs_genai(name: str, path: Path, threads: int, stream_counts, new_tokens: int,
                    repeats: int, probe_bytes: int) -> dict:
    """Interleaved: per repeat, per stream count, one engine run and one peer run;
    per repeat, one bandwidth probe (the roofline) next to the 1-stream pair."""
    ours = InProcessEngine(path, threads)
    peer = GenaiPeer(path, threads)
    try:
        progress(f"{name}: warm-up (engine and onnxruntime-genai, {max(stream_counts)} streams)")
        ours.decode(max(stream_counts), 8)
        peer.decode(max(stream_counts), 8, ours.ids)
        rates = {n: {"engine": [], "genai": []} for n in stream_counts}
        loads = {n: {"engine": [], "genai": []} for n in stream_counts}
        ttfts, bandwidth = [], []
        for r in range(repeats):
            for n in stream_counts:
                progress(f"{name}: repeat {r + 1}/{repeats}, {n} stream(s), {new_tokens} tokens each")
                order = ("engine", "genai") if r % 2 == 0 else ("genai", "engine")
                if n == 1:  # the probe brackets the 1-stream pair: the limit is the faster
                    before = read_bandwidth(probe_bytes, threads, repeats=3)
                for side in order:
                    with ForeignLoad((peer.proc.pid,)) as load:
                        if side == "engine":
                            out = ours.decode(n, new_tokens)
                        else:
                            rate = peer.decode(n, new_tokens, ours.ids)
                    loads[n][side].append(load.cores)
                    if side == "engine":
                        rates[n]["engine"].append(out["decode"])
                        if n == 1:
                            ttfts.append(out["ttft_ms"])
                    else:
                        rates[n]["genai"].append(rate)
                if n == 1:
                    after = read_bandwidth(probe_bytes, threads, repeats=3)
                    bandwidth.append(max(before, after, key=lambda b: b["bytes_per_s"]))
        return {"rates": rates, "loads": loads, "ttft_ms": ttfts, "bandwidth": bandwidth, "version": peer.version,
                "prompt_tokens": len(ours.ids)}
    finally:
        peer.close()
        ours.close()
