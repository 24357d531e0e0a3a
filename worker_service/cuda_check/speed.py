"""cuda_check's decode_speed (GPU only): the engine's decode tokens/s at several stream
counts, beside onnxruntime-genai's Generator on the same folder where it is installed.

Every wait is bounded by what is left of cuda_check's deadline; a round whose
streams do not all finish, or a stream that ends with no token, is reported with
its numbers instead of raising (the other stream counts still run).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest, TokenDelta
from worker_service.cuda_check.harness import Context

SPEED_PROMPT = "Write a long story about a dragon."


def decode_speed(ctx: Context) -> dict:
    engine = ctx.engine
    ids = tuple(engine.tokenizer.encode_chat([("user", SPEED_PROMPT)]))
    out: dict = {"prompt_tokens": len(ids), "new_tokens": ctx.speed_tokens}
    problems = []
    for n in ctx.streams:
        if n > engine.max_batch_rows:
            out[f"streams_{n}"] = {"skipped": f"more than the {engine.max_batch_rows} rows"}
            continue
        if ctx.remaining_s() < 5:
            out[f"streams_{n}"] = {"skipped": "the deadline is near"}
            continue
        entry = _one_count(ctx, engine, ids, n)
        out[f"streams_{n}"] = entry
        if "error" in entry:
            problems.append(f"streams_{n}: {entry['error']}")
    out["genai"] = genai_speed(ctx, list(ids), tuple(s for s in ctx.streams if s <= 64))
    out["ok"] = not problems
    out["why"] = "; ".join(problems)
    return out


def _one_count(ctx: Context, engine, ids: tuple[int, ...], n: int) -> dict:
    """Two rounds of n streams submitted at once, exactly speed_tokens each; the second's
    figures (the first warms kernels and the allocator)."""
    entry: dict = {}
    for round_ in range(2):
        times: dict[str, list[float]] = {}
        ended: list = []
        done = threading.Event()
        reqs = [SequenceRequest(f"speed-{n}-{i}-{time.monotonic_ns()}", ids, ctx.speed_tokens,
                                min_new_tokens=ctx.speed_tokens) for i in range(n)]
        for r in reqs:
            times[r.sequence_id] = []

        def on_event(event, times=times, ended=ended, done=done, n=n) -> None:
            if isinstance(event, TokenDelta):
                times[event.sequence_id].append(time.perf_counter())
            elif isinstance(event, TERMINAL):
                ended.append(event)
                if len(ended) == n:
                    done.set()

        start = time.perf_counter()
        handles = [engine.submit(r, on_event) for r in reqs]
        if not done.wait(ctx.wait_s(600)):
            for h in handles:
                h.cancel()
            return {"error": f"round {round_ + 1}: {n - len(ended)} of {n} streams did not "
                             f"finish within the time left"}
        failed = [e for e in ended if not isinstance(e, Completed)]
        if failed:
            return {"error": f"round {round_ + 1}: {len(failed)} of {n} streams failed; the "
                             f"first: {failed[0]}"}
    empty = [sid for sid, ts in times.items() if not ts]
    if empty:
        return {"error": f"{len(empty)} of {n} streams produced no token"}
    first_all = max(ts[0] for ts in times.values())
    last = max(ts[-1] for ts in times.values())
    after = sum(1 for ts in times.values() for t in ts if t > first_all)
    entry["decode_tokens_per_s"] = round(after / (last - first_all), 1) if last > first_all else None
    entry["ttft_ms_max"] = round((first_all - start) * 1e3, 1)
    return entry


def genai_speed(ctx: Context, prompt_ids: list[int], batches: tuple[int, ...]) -> dict:
    """onnxruntime-genai's Generator on the same folder, greedy, at each batch size."""
    try:
        import numpy as np
        import onnxruntime_genai as og
    except ImportError as exc:
        return {"skipped": f"onnxruntime-genai is not installed ({exc})"}
    try:
        model = og.Model(og.Config(str(Path(ctx.model_dir))))
    except Exception as exc:  # noqa: BLE001 - the engine's figures stand without the peer's
        return {"error": f"onnxruntime-genai could not load the folder: "
                         f"{type(exc).__name__}: {exc}"[:300]}
    ids = np.array(prompt_ids, dtype=np.int32)
    out: dict = {"genai_version": og.__version__}
    for batch in batches:
        if ctx.remaining_s() < 5:
            out[f"batch_{batch}"] = {"skipped": "the deadline is near"}
            continue
        try:
            rates = []
            for _ in range(2):
                params = og.GeneratorParams(model)
                params.set_search_options(max_length=len(ids) + ctx.speed_tokens,
                                          min_length=len(ids) + ctx.speed_tokens,
                                          batch_size=batch, do_sample=False)
                gen = og.Generator(model, params)
                gen.append_tokens(np.tile(ids, (batch, 1)))
                gen.generate_next_token()
                t, steps = time.perf_counter(), 0
                while not gen.is_done():
                    gen.generate_next_token()
                    steps += 1
                rates.append(batch * steps / (time.perf_counter() - t))
            out[f"batch_{batch}"] = {"decode_tokens_per_s": round(rates[-1], 1)}
        except Exception as exc:  # noqa: BLE001 - genai refuses batches past its config's largest
            out[f"batch_{batch}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out
