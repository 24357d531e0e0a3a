"""cuda_check's `graph_id_vs_sessions`: the two ways ORT replays a CUDA graph per decode
bucket, measured side by side, so the first GPU run says which to keep (issue 50).

- "id": one session (the engine's), one graph per bucket picked by the run option
  `gpu_graph_id` (what the worker does: runtime/decode_buckets.py);
- "sessions": one session per bucket, each capturing its one graph (what ORT's docs
  describe first; it loads the weights once per session, so the device memory each
  takes is reported beside the speed).

Each arm decodes the same prompts teacher-forced on the same ids, over scratch device rows,
at each bucket; reported per bucket: the median milliseconds per step, the tokens equal
between the arms (bit for bit on the CPU, where nothing is captured and both arms run
the same code: the dry run only proves the path runs), and on CUDA the free memory each
arm's sessions and captures took.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from worker_service.cuda_check.harness import Context
from worker_service.runtime import device as devices
from worker_service.runtime import device_memory
from worker_service.runtime.decode_step import DecodeShapes
from worker_service.runtime.device_rows import DeviceRows
from worker_service.runtime.ort_rows import OrtRows

GRAPH_IDS_FROM = 2000  # apart from the engine's buckets (1...) and captured_equals_uncaptured's
PROMPT = "Name three rivers of Europe and say which is longest."
STEPS = 8  # timed decode steps per bucket (after the warm-up capture)


def _buckets(ctx: Context) -> tuple[int, ...]:
    return (1, 4) if ctx.dry_run else (1, 8, 32)


def _decode(runner: OrtRows, store: DeviceRows, prompt: list[int], rows: int,
            forced: list[int]) -> tuple[list[float], list[list[int]]]:
    """`rows` copies of `prompt` prefilled, then STEPS decode steps fed `forced[step]` in
    every row; each step's milliseconds and greedy ids. The rows are freed after."""
    for _ in range(rows):
        runner.prefill(store.allocate(len(prompt) + STEPS + 1), 0, prompt)
    past = [len(prompt)] * rows
    ms, ids = [], []
    try:
        for step in range(STEPS):
            started = time.perf_counter()
            decoded = runner.decode_rows(rows, past, [forced[step]] * rows)
            chosen = decoded.next_ids.tolist()
            ms.append((time.perf_counter() - started) * 1e3)
            ids.append(chosen)
            past = [p + 1 for p in past]
    finally:
        for row in reversed(range(store.rows)):
            store.free(row)
    return ms, ids


def graph_id_vs_sessions(ctx: Context) -> dict:
    """The check's result (see the module docstring)."""
    engine = ctx.engine
    spec, config = engine.spec, engine.config
    buckets = _buckets(ctx)
    prompt = list(engine.tokenizer.encode(PROMPT))
    forced = [int(t) for t in engine.tokenizer.encode(" Danube Rhine Volga Loire Elbe Oder")]
    forced = (forced * STEPS)[:STEPS]
    free_bytes = (device_memory.cuda_free_bytes(ctx.device_id) if ctx.device == "cuda"
                  else None)
    capture = ctx.device == "cuda" and engine.runner.batch.graphs
    store = DeviceRows(spec, max(buckets), config.device, config.device_id)
    arms: dict[str, dict] = {}
    runner: OrtRows | None = None
    sessions: dict[int, OrtRows] = {}
    try:
        # "id": the engine's session, a graph per bucket by gpu_graph_id.
        before = free_bytes() if free_bytes else None
        runner = OrtRows(engine.runner.batch.session, spec, store, max_chunk_tokens=64,
                             shapes=DecodeShapes(buckets, True, capture),
                             graph_ids_from=GRAPH_IDS_FROM)
        runner.warm_graphs()
        arms["id"] = {"by_bucket": {b: _decode(runner, store, prompt, b, forced)
                                    for b in buckets}}
        if before is not None:
            arms["id"]["device_bytes"] = before - free_bytes()
        # "sessions": a session per bucket, each with its one graph.
        before = free_bytes() if free_bytes else None
        for bucket in buckets:
            session = devices.create_session(spec, config.device, config.device_id,
                                             engine.intra_op_threads,
                                             cuda_graphs=capture)
            sessions[bucket] = OrtRows(session, spec, store, max_chunk_tokens=64,
                                           shapes=DecodeShapes((bucket,), True, capture))
            sessions[bucket].warm_graphs()
        arms["sessions"] = {"by_bucket": {b: _decode(sessions[b], store, prompt, b, forced)
                                          for b in buckets}}
        if before is not None:
            arms["sessions"]["device_bytes"] = before - free_bytes()
    finally:
        runner = None  # their bindings go before the rows' memory
        sessions.clear()
        store.close()
    out: dict = {"captured": capture, "buckets": list(buckets), "steps": STEPS}
    same = True
    for name, arm in arms.items():
        out[name] = {"ms_per_step": {str(b): round(statistics.median(ms), 3)
                                     for b, (ms, _) in arm["by_bucket"].items()}}
        if "device_bytes" in arm:
            out[name]["device_bytes"] = arm["device_bytes"]
    for b in buckets:
        same = same and arms["id"]["by_bucket"][b][1] == arms["sessions"]["by_bucket"][b][1]
    out["same_greedy_ids"] = same
    out["sessions_over_id"] = {str(b): round(
        statistics.median(arms["sessions"]["by_bucket"][b][0])
        / max(statistics.median(arms["id"]["by_bucket"][b][0]), 1e-9), 3) for b in buckets}
    # Bit for bit on the CPU (the same code both ways); on CUDA a measurement, reported
    # (the two captures may pick other kernels: the ids are said, not judged).
    out["ok"] = same if ctx.device == "cpu" else bool(np.isfinite(
        list(out["sessions_over_id"].values())).all())
    return out
