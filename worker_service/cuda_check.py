"""Check the engine on an NVIDIA GPU: `python -m worker_service.cuda_check --model-dir DIR`.

Runs the CUDA runtime (device rows, runtime/device_rows.py) through what a GPU
user needs to know, and prints ONE JSON summary on stdout, check by check:

- session_starts: the CUDA provider is active (else the cause and the remedy);
- heavy_nodes_on_the_device: ORT's placement, the allowed shape nodes listed;
- kv_on_device: the KV rows are OrtValues on the device;
- batched_equals_solo: 8 sequences of different lengths, joining and leaving
  at different steps, each equal to its batch-1 run;
- session_swap_equals_fresh: a session turn after swap-out and swap-in equals
  a fresh run of the same conversation;
- prefix_cache_hit_equals_miss: a prompt served from the prefix cache equals
  its first (missed) run;
- captured_equals_uncaptured: decode in a padded bucket with fixed buffers (a CUDA
  graph where the session has them) equals plain decode: bit for bit on the CPU,
  within a tolerance on CUDA (runtime/graph_check.py);
- ledger: the device memory the runtime allocated is the pool's capacity, and
  what the rows hold never exceeded what was charged, nor the charge capacity;
- equal_to_cpu: sampled tokens (seeded) equal the CPU arena's for two prompts;
- decode_speed (GPU only): decode tokens/s at 1, 8, 32, 64, 128 streams, beside
  onnxruntime-genai on the same folder where it is installed.

Exit status 0 when every check passes, 1 otherwise. `--dry-run` runs every
check on CPU through the same device-rows code, bound to CPU OrtValues (the
test suite runs it); decode_speed is then skipped (a CPU figure says nothing
about a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ortserve.process.logs import configure_logging
from worker_service.core.errors import EngineError
from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest, TokenDelta
from worker_service.engine import Engine, EngineConfig
from worker_service.runtime.graph_check import captured_equals_uncaptured

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
)
# Sampled with a seed: any logit difference shows in the tokens (greedy on a small model
# repeats itself and would hide one).
SAMPLED = SamplingConfig(temperature=1.0, seed=7)
STREAMS = (1, 8, 32, 64, 128)


def _run_all(engine: Engine, requests: list[SequenceRequest], timeout_s: float,
             between: Callable[[], None] | None = None) -> dict[str, Completed]:
    """Submit half the requests, the rest once the first token is out (they join a batch
    already decoding); `between` runs on the engine thread at every event. Returns the
    terminal events by sequence id (raises on a failure or a timeout)."""
    done: dict[str, Completed] = {}
    finished = threading.Event()
    first = threading.Event()

    def on_event(event) -> None:
        if isinstance(event, TokenDelta) and not first.is_set():
            first.set()
        if between is not None:
            between()
        if isinstance(event, TERMINAL):
            done[event.sequence_id] = event
            if len(done) == len(requests):
                finished.set()

    half = len(requests) // 2
    for req in requests[:half]:
        engine.submit(req, on_event)
    if half and not first.wait(timeout_s):
        raise EngineError("no first token within the check's time")
    for req in requests[half:]:  # these join a batch already decoding
        engine.submit(req, on_event)
    if not finished.wait(timeout_s):
        raise EngineError(f"{len(requests) - len(done)} sequences did not finish in {timeout_s} s")
    bad = [e for e in done.values() if not isinstance(e, Completed)]
    if bad:
        raise EngineError(f"a sequence ended with {bad[0]}")
    return done


def _batched_equals_solo(engine: Engine, ledger: dict) -> dict:
    tok = engine.tokenizer
    reqs = [SequenceRequest(f"batch-{i}", tuple(tok.encode("Tell me about the number "
                                                           + "seven " * (1 + 3 * i))),
                            6 + 2 * i, min_new_tokens=6 + 2 * i,
                            sampling=SamplingConfig(temperature=1.0, seed=100 + i))
            for i in range(8)]
    pool, rows = engine.kv, engine.runtime.rows

    def sample() -> None:  # the engine thread, between steps: the rows are still
        if rows is None:
            return
        held, charged = rows.held_bytes(), rows.charged_bytes()
        ledger["max_held_bytes"] = max(ledger.get("max_held_bytes", 0), held)
        ledger["max_charged_bytes"] = max(ledger.get("max_charged_bytes", 0), charged)
        ledger["held_above_charged"] = ledger.get("held_above_charged", 0) + (held > charged)
        ledger["charged_above_capacity"] = ledger.get("charged_above_capacity", 0) + (
            pool.held_bytes() > pool.capacity_bytes)

    together = _run_all(engine, reqs, 300, between=sample)
    largest = engine.runner.largest_batch
    alone = {r.sequence_id: engine.generate(SequenceRequest(r.sequence_id + "-solo", r.prompt_ids,
                                                            r.max_new_tokens,
                                                            min_new_tokens=r.min_new_tokens,
                                                            sampling=r.sampling), timeout_s=300)
             for r in reqs}
    differ = [sid for sid, e in together.items() if e.token_ids != alone[sid].token_ids]
    return {"ok": not differ and largest >= 5, "sequences": len(reqs), "largest_batch": largest,
            "prompt_tokens": [r.prompt_tokens for r in reqs],
            "new_tokens": [r.max_new_tokens for r in reqs], "differ": differ}


def _session_swap_equals_fresh(engine: Engine) -> dict:
    tok = engine.tokenizer
    history = [("user", "Name three rivers in Europe.")]
    first = tok.encode_chat(history)
    engine.open_session("check-session")
    t1 = _turn(engine, "check-session", first, "turn-1")
    swapped = engine.swap_out_session("check-session")
    state = engine.session_info("check-session").state.value
    second = [*first, *t1.token_ids, *tok.encode(" And three in Asia?")]
    t2 = _turn(engine, "check-session", second, "turn-2")
    fresh = engine.generate(SequenceRequest("fresh-2", tuple(second), 12, min_new_tokens=12,
                                            sampling=SAMPLED), timeout_s=300)
    engine.close_session("check-session")
    return {"ok": t2.token_ids == fresh.token_ids and t2.reused_prompt_tokens > 0,
            "state_after_swap_out": state, "swapped_out_bytes": swapped,
            "reused_prompt_tokens": t2.reused_prompt_tokens,
            "host_budget_used_bytes": engine.kv.host.used_bytes}


def _turn(engine: Engine, session_id: str, prompt, lease: str) -> Completed:
    out: list = []
    done = threading.Event()

    def on_event(event) -> None:
        if isinstance(event, TERMINAL):
            out.append(event)
            done.set()

    engine.submit(SequenceRequest(lease, tuple(prompt), 12, min_new_tokens=12, sampling=SAMPLED),
                  on_event, session_id=session_id)
    if not done.wait(300) or not isinstance(out[0], Completed):
        raise EngineError(f"session turn {lease} did not complete: {out[:1]}")
    return out[0]


def _prefix_cache_hit_equals_miss(engine: Engine) -> dict:
    if engine.prefix_cache is None:
        return {"ok": False, "error": "this runtime has no prefix cache"}
    tok = engine.tokenizer
    prompt = tuple(tok.encode("A long shared system prompt about the sea and ships. " * 12))
    miss = engine.generate(SequenceRequest("cache-miss", prompt, 10, min_new_tokens=10,
                                           sampling=SAMPLED), timeout_s=300)
    hit = engine.generate(SequenceRequest("cache-hit", prompt, 10, min_new_tokens=10,
                                          sampling=SAMPLED), timeout_s=300)
    rows = engine.runtime.rows
    blocks = getattr(rows, "blocks", None)
    on_device = blocks is None or blocks.slots == 0 or blocks.free_slots < blocks.slots
    return {"ok": hit.token_ids == miss.token_ids and hit.cached_prompt_tokens > 0 and on_device,
            "prompt_tokens": len(prompt), "cached_prompt_tokens": hit.cached_prompt_tokens,
            "cached_bytes": engine.cached_bytes(),
            "device_block_slots": blocks.slots if blocks is not None else 0,
            "device_block_slots_used": blocks.slots - blocks.free_slots if blocks else 0}


def _sampled_run(engine: Engine, prompt: str, new_tokens: int, label: str) -> Completed:
    ids = engine.tokenizer.encode_chat([("user", prompt)])
    return engine.generate(SequenceRequest(f"{label}-{time.monotonic_ns()}", tuple(ids),
                                           new_tokens, sampling=SAMPLED), timeout_s=300)


def _decode_speed(engine: Engine, new_tokens: int, streams: tuple[int, ...]) -> dict:
    """Decode tokens/s with N streams submitted at once, exactly new_tokens each (the second
    of two rounds: the first warms kernels and the allocator)."""
    ids = tuple(engine.tokenizer.encode_chat([("user", "Write a long story about a dragon.")]))
    out: dict = {"prompt_tokens": len(ids), "new_tokens": new_tokens}
    for n in streams:
        if n > engine.max_batch_rows:
            out[f"streams_{n}"] = {"skipped": f"more than the {engine.max_batch_rows} rows"}
            continue
        for _ in range(2):
            times: dict[str, list[float]] = {}
            reqs = [SequenceRequest(f"speed-{n}-{i}-{time.monotonic_ns()}", ids, new_tokens,
                                    min_new_tokens=new_tokens) for i in range(n)]
            for r in reqs:
                times[r.sequence_id] = []
            start = time.perf_counter()
            done = threading.Event()
            ended: list = []

            def on_event(event, times=times, ended=ended, done=done, n=n) -> None:
                if isinstance(event, TokenDelta):
                    times[event.sequence_id].append(time.perf_counter())
                elif isinstance(event, TERMINAL):
                    ended.append(event)
                    if len(ended) == n:
                        done.set()

            for r in reqs:
                engine.submit(r, on_event)
            done.wait(600)
        first_all = max(ts[0] for ts in times.values())
        last = max(ts[-1] for ts in times.values())
        after = sum(1 for ts in times.values() for t in ts if t > first_all)
        out[f"streams_{n}"] = {
            "decode_tokens_per_s": round(after / (last - first_all), 1) if last > first_all else None,
            "ttft_ms_max": round((first_all - start) * 1e3, 1)}
    return out


def _genai_speed(model_dir: Path, prompt_ids: list[int], new_tokens: int,
                 batches: tuple[int, ...]) -> dict:
    try:
        import numpy as np
        import onnxruntime_genai as og
    except ImportError as exc:
        return {"skipped": f"onnxruntime-genai is not installed ({exc})"}
    model = og.Model(og.Config(str(model_dir)))
    ids = np.array(prompt_ids, dtype=np.int32)
    out: dict = {"genai_version": og.__version__}
    for batch in batches:
        try:
            rates = []
            for _ in range(2):
                params = og.GeneratorParams(model)
                params.set_search_options(max_length=len(ids) + new_tokens,
                                          min_length=len(ids) + new_tokens, batch_size=batch,
                                          do_sample=False)
                gen = og.Generator(model, params)
                gen.append_tokens(np.tile(ids, (batch, 1)))
                gen.generate_next_token()
                t, steps = time.perf_counter(), 0
                while not gen.is_done():
                    gen.generate_next_token()
                    steps += 1
                rates.append(batch * steps / (time.perf_counter() - t))
            out[f"batch_{batch}"] = {"decode_tokens_per_s": round(rates[-1], 1)}
        except Exception as exc:  # genai refuses batches past its config's largest
            out[f"batch_{batch}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def run_checks(model_dir: Path, device_id: int, new_tokens: int, dry_run: bool = False,
               speed_tokens: int = 128, streams: tuple[int, ...] = STREAMS) -> dict:
    """Every check; `dry_run` runs them on CPU through the device-rows code path."""
    device, provider = ("cpu", "CPUExecutionProvider") if dry_run else (
        "cuda", "CUDAExecutionProvider")
    summary: dict = {"model_dir": str(model_dir), "device": device, "dry_run": dry_run,
                     "checks": {}, "ok": False}
    checks = summary["checks"]
    config = EngineConfig(model_dir=model_dir, device=device, device_id=device_id,
                          kv_layout="device-rows", max_batch_rows=16 if dry_run else max(streams),
                          # Rows of 2,048 tokens: 128 of them fit beside a 1.2B model.
                          max_context_tokens=2048,
                          kv_capacity_bytes=(64 if dry_run else 48 * 1024) * 2**20,
                          session_swap_bytes=256 * 2**20)
    try:
        engine = Engine(config)
    except EngineError as exc:
        checks["session_starts"] = {"ok": False, "error": str(exc)}
        return summary
    outputs = []
    try:
        checks["session_starts"] = {"ok": engine.provider == provider,
                                    "providers": list(engine.providers)}
        checks["heavy_nodes_on_the_device"] = {
            "ok": provider in engine.nodes_by_provider,
            "nodes_by_provider": engine.nodes_by_provider,
            "allowed_off_device": engine.nodes_off_device}
        names = sorted(engine.runtime.kv_device_names())
        checks["kv_on_device"] = {"ok": names == [device] and engine.kv_layout == "device-rows",
                                  "device_names": names, "kv_layout": engine.kv_layout,
                                  "rows": engine.max_batch_rows}
        ledger: dict = {}
        for name, check in (("batched_equals_solo", lambda: _batched_equals_solo(engine, ledger)),
                            ("session_swap_equals_fresh", lambda: _session_swap_equals_fresh(engine)),
                            ("prefix_cache_hit_equals_miss",
                             lambda: _prefix_cache_hit_equals_miss(engine)),
                            ("captured_equals_uncaptured", lambda: captured_equals_uncaptured(engine))):
            try:
                checks[name] = check()
            except Exception as exc:  # noqa: BLE001 - one check's failure is reported
                checks[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        allocated = engine.runtime.allocated_bytes
        checks["ledger"] = {
            "ok": (allocated == engine.capacity_bytes > 0 and ledger.get("held_above_charged") == 0
                   and ledger.get("charged_above_capacity") == 0
                   and ledger.get("max_charged_bytes", 0) > 0),
            "allocated_bytes": allocated, "capacity_bytes": engine.capacity_bytes,
            "held_bytes_now": engine.held_bytes(), **ledger}
        outputs = [_sampled_run(engine, p, new_tokens, "device") for p in PROMPTS]
        if dry_run:
            checks["decode_speed"] = {"ok": True, "skipped": "dry run: no GPU figure"}
        else:
            speed = _decode_speed(engine, speed_tokens, streams)
            ids = engine.tokenizer.encode_chat([("user", "Write a long story about a dragon.")])
            speed["genai"] = _genai_speed(model_dir, list(ids), speed_tokens,
                                          tuple(s for s in streams if s <= 64))
            checks["decode_speed"] = {"ok": True, **speed}
    finally:
        engine.close()
    with Engine(EngineConfig(model_dir=model_dir, device="cpu")) as cpu:
        cpu_out = [_sampled_run(cpu, p, new_tokens, "cpu") for p in PROMPTS]
    for i, (on_device, on_cpu) in enumerate(zip(outputs, cpu_out, strict=False)):
        same = on_device.token_ids == on_cpu.token_ids
        first_diff = next((j for j, (a, b) in enumerate(
            zip(on_device.token_ids, on_cpu.token_ids, strict=False)) if a != b), None)
        checks[f"equal_to_cpu_prompt_{i}"] = {
            "ok": same, "prompt": PROMPTS[i], "first_difference_at": first_diff,
            "device_text": on_device.text, "cpu_text": on_cpu.text,
            "device_decode_tokens_per_s": round(on_device.decode_tokens_per_s, 1),
            "cpu_decode_tokens_per_s": round(on_cpu.decode_tokens_per_s, 1)}
    summary["ok"] = all(c["ok"] for c in checks.values())
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker_service.cuda_check",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--device-id", type=int, default=0)
    parser.add_argument("--tokens", type=int, default=32, help="new tokens per prompt in equal_to_cpu")
    parser.add_argument("--speed-tokens", type=int, default=128,
                        help="new tokens per stream in decode_speed")
    parser.add_argument("--dry-run", action="store_true",
                        help="every check on CPU through the device-rows code (no GPU needed)")
    args = parser.parse_args(argv)
    configure_logging(json=False)  # log lines to stderr: stdout is the JSON summary only
    summary = run_checks(args.model_dir, args.device_id, args.tokens, args.dry_run,
                         args.speed_tokens)
    print(json.dumps(summary, indent=2, ensure_ascii=False))
    if not summary["ok"]:
        failed = [name for name, c in summary["checks"].items() if not c["ok"]]
        first = summary["checks"][failed[0]] if failed else {}
        print(f"cuda_check FAILED: {', '.join(failed)}: {first.get('error', '')}", file=sys.stderr)
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
