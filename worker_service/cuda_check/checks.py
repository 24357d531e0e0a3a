"""cuda_check's checks: one function each, taking the Context and returning its JSON entry
(`ok` and its numbers). CHECKS lists them in the order they run: a new check is a
function here and one line in CHECKS.

Equality checks run TEACHER-FORCED (forcing.py): both runs take the same tokens
and their logits are judged by compare.py within a stated tolerance
(SAME_DEVICE; ACROSS_DEVICES against the CPU). On the dry run (CPU) the sampled
tokens must also be bit-exact, as before; byte moves (a session's K/V out to the
host and back) are bit-exact on both.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from worker_service.core.sampling import SamplingConfig
from worker_service.core.sequence import TERMINAL, Completed, SequenceRequest
from worker_service.cuda_check import compare, forcing, speed
from worker_service.cuda_check.graph_modes import graph_id_vs_sessions
from worker_service.cuda_check.harness import Check, Context, Unmet
from worker_service.cuda_check.memory import kv_memory_as_charged
from worker_service.engine.config import EngineConfig
from worker_service.engine.engine import Engine
from worker_service.runtime.decode_step import bucket_buffer_bytes_bound
from worker_service.runtime.device_rows import DeviceRows
from worker_service.runtime.graph_check import captured_equals_uncaptured
from worker_service.runtime.model import load_model_spec

PROMPTS = (
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about the sea.",
)
# The dry run's token rule: sampled with a seed, any logit difference shows in the tokens.
SAMPLED = SamplingConfig(temperature=1.0, seed=7)
# The continuation every forced run takes (cut and offset per sequence).
FORCED_TEXT = (" The quick brown fox jumps over the lazy dog, then it runs across the green "
               "field to the river, drinks, and walks slowly back home before the evening rain.")
# Rows of 2,048 tokens: 128 of them fit beside a 1.2B model.
ROW_TOKENS = 2048
DRY_RUN_ROWS = 10  # 8 sequences batched, and room to spare


def forced_tokens(engine: Engine, n: int, offset: int = 0) -> tuple[int, ...]:
    ids = engine.tokenizer.encode(FORCED_TEXT)
    return tuple(ids[(offset + k) % len(ids)] for k in range(n))


def engine_config(ctx: Context) -> EngineConfig:
    """The device engine's config, its KV sized from the model: rows x the model's bytes
    per row (at ROW_TOKENS) plus a prefix-cache block area, never a constant."""
    spec = load_model_spec(ctx.model_dir)
    spec = dataclasses.replace(spec, context_length=min(spec.context_length, ROW_TOKENS))
    rows = DRY_RUN_ROWS if ctx.dry_run else max(ctx.streams)
    row, block = DeviceRows.row_bytes_for(spec), DeviceRows.block_bytes_for(spec)
    cache = max(256 * block, rows * row // 8)
    # The decode buckets' fixed buffers are charged out of the capacity (engine/engine.py): the
    # block area is allocated that much larger, so the rows' and the cache's room stays.
    cache += bucket_buffer_bytes_bound(spec, rows, spec.context_length)
    return EngineConfig(model_dir=ctx.model_dir, device=ctx.device, device_id=ctx.device_id,
                        kv_layout="device-rows", max_batch_rows=rows,
                        max_context_tokens=spec.context_length,
                        kv_capacity_bytes=rows * row + cache, prefix_cache_bytes=cache,
                        session_swap_bytes=256 * 2**20)


# --- the engine ------------------------------------------------------------------------


def session_starts(ctx: Context) -> dict:
    config = engine_config(ctx)
    try:
        engine = Engine(config)
    except Exception as exc:
        ctx.engine_error = f"{type(exc).__name__}: {exc}"[:500]
        raise
    ctx.closers.append(engine.close)
    forcing.install(engine)
    ctx._engine = engine
    provider = "CPUExecutionProvider" if ctx.dry_run else "CUDAExecutionProvider"
    return {"ok": engine.provider == provider, "providers": list(engine.providers),
            "capacity_bytes": engine.capacity_bytes, "rows": engine.max_batch_rows,
            "row_tokens": engine.spec.context_length,
            "row_bytes": DeviceRows.row_bytes_for(engine.spec),
            "prefix_cache_bytes": config.prefix_cache_bytes}


def heavy_nodes_on_the_device(ctx: Context) -> dict:
    engine = ctx.engine
    provider = engine.provider
    return {"ok": provider in engine.nodes_by_provider and (
                ctx.dry_run or provider == "CUDAExecutionProvider"),
            "nodes_by_provider": engine.nodes_by_provider,
            "allowed_off_device": engine.nodes_off_device}


def kv_on_device(ctx: Context) -> dict:
    engine = ctx.engine
    names = sorted(engine.runtime.kv_device_names())
    return {"ok": names == [ctx.device] and engine.kv_layout == "device-rows",
            "device_names": names, "kv_layout": engine.kv_layout, "rows": engine.max_batch_rows}


# --- equality, teacher-forced ------------------------------------------------------------


def _forced_alone(ctx: Context, engine: Engine, sid: str, prompt, forced) -> np.ndarray:
    runner = forcing.install(engine)
    runner.force(sid, forced)
    engine.generate(forcing.forced_request(sid, prompt, forced), timeout_s=ctx.wait_s())
    return runner.logits(sid)


def batched_equals_solo(ctx: Context) -> dict:
    """8 sequences of different lengths, joining and leaving at different steps, each
    equal to its batch-1 run (teacher-forced logits); the ledger is sampled meanwhile."""
    engine = ctx.engine
    runner = forcing.install(engine)
    tok = engine.tokenizer
    prompts = [tuple(tok.encode("Tell me about the number " + "seven " * (1 + 3 * i)))
               for i in range(8)]
    forced = [forced_tokens(engine, 6 + 2 * i, offset=i) for i in range(8)]
    ledger = ctx.shared.setdefault("ledger", {})
    pool, rows = engine.kv, engine.runtime.rows

    def sample() -> None:  # the engine thread, between steps
        held, charged = rows.held_bytes(), rows.charged_bytes()
        ledger["max_held_bytes"] = max(ledger.get("max_held_bytes", 0), held)
        ledger["max_charged_bytes"] = max(ledger.get("max_charged_bytes", 0), charged)
        ledger["held_above_charged"] = ledger.get("held_above_charged", 0) + (held > charged)
        ledger["charged_above_capacity"] = ledger.get("charged_above_capacity", 0) + (
            pool.held_bytes() > pool.capacity_bytes)

    requests = []
    for i in range(8):
        runner.force(f"batch-{i}", forced[i])
        requests.append(forcing.forced_request(f"batch-{i}", prompts[i], forced[i]))
    forcing.run_together(engine, requests, ctx.wait_s(), between=sample)
    largest = engine.runner.largest_batch
    together = [runner.logits(f"batch-{i}") for i in range(8)]
    alone = [_forced_alone(ctx, engine, f"solo-{i}", prompts[i], forced[i]) for i in range(8)]
    logits = compare.compare_runs(alone, together, compare.SAME_DEVICE)
    out = {"ok": logits["ok"] and largest >= 5, "sequences": 8, "largest_batch": largest,
           "prompt_tokens": [len(p) for p in prompts], "new_tokens": [len(f) for f in forced],
           "logits": logits}
    if ctx.dry_run:
        out["tokens"] = _sampled_batched_equals_solo(ctx, engine, prompts)
        out["ok"] = out["ok"] and out["tokens"]["ok"]
    return out


def _sampled_batched_equals_solo(ctx: Context, engine: Engine, prompts) -> dict:
    reqs = [SequenceRequest(f"sampled-batch-{i}", p, 6 + 2 * i, min_new_tokens=6 + 2 * i,
                            sampling=SamplingConfig(temperature=1.0, seed=100 + i))
            for i, p in enumerate(prompts)]
    together = forcing.run_together(engine, reqs, ctx.wait_s())
    differ = []
    for r in reqs:
        solo = engine.generate(dataclasses.replace(r, sequence_id=r.sequence_id + "-solo"),
                               timeout_s=ctx.wait_s())
        if solo.token_ids != together[r.sequence_id].token_ids:
            differ.append(r.sequence_id)
    return {"ok": not differ, "rule": "sampled tokens bit-exact (dry run)", "differ": differ}


def _turn(ctx: Context, engine: Engine, session_id: str, req: SequenceRequest) -> Completed:
    out: list = []
    done = threading.Event()

    def on_event(event) -> None:
        if isinstance(event, TERMINAL):
            out.append(event)
            done.set()

    handle = engine.submit(req, on_event, session_id=session_id)
    if not done.wait(ctx.wait_s()):
        handle.cancel()
        raise TimeoutError(f"session turn {req.sequence_id} did not finish in "
                           f"{ctx.wait_s():.0f} s")
    if not isinstance(out[0], Completed):
        raise RuntimeError(f"session turn {req.sequence_id} did not complete: {out[0]}")
    return out[0]


def _forced_session(ctx: Context, engine: Engine, sid: str, first, f1, f2, swap: bool) -> dict:
    """Two teacher-forced turns of one conversation in session `sid`, swapped out between
    them when `swap`: turn 2's logits, its prompt, the K/V kept after each turn."""
    runner = forcing.install(engine)
    engine.open_session(sid)
    try:
        runner.force(f"{sid}-1", f1)
        _turn(ctx, engine, sid, forcing.forced_request(f"{sid}-1", first, f1))
        runner.logits(f"{sid}-1")
        kept = engine.session_turns.held_kv(sid)
        swapped = engine.swap_out_session(sid) if swap else 0
        state = engine.session_info(sid).state.value
        second = (*first, *f1, *engine.tokenizer.encode(" And three in Asia?"))
        runner.force(f"{sid}-2", f2)
        t2 = _turn(ctx, engine, sid, forcing.forced_request(f"{sid}-2", second, f2))
        return {"logits": runner.logits(f"{sid}-2"), "second": second, "kept": kept,
                "after": engine.session_turns.held_kv(sid), "swapped": swapped,
                "state": state, "reused": t2.reused_prompt_tokens}
    finally:
        engine.close_session(sid)


def session_swap_equals_fresh(ctx: Context) -> dict:
    """A session turn after swap-out and swap-in equals the same turn without the swap
    (SAME_DEVICE; the swap moves bytes only) and a fresh run of the whole conversation
    (RECOMPUTED: the history computed in one prefill, not a token at a time); the K/V
    the session kept came back bit-exact."""
    engine = ctx.engine
    first = tuple(engine.tokenizer.encode_chat([("user", "Name three rivers in Europe.")]))
    f1, f2 = forced_tokens(engine, 12, offset=3), forced_tokens(engine, 12, offset=9)
    swapped = _forced_session(ctx, engine, "check-session", first, f1, f2, swap=True)
    kept_in = _forced_session(ctx, engine, "check-session-kept", first, f1, f2, swap=False)
    fresh = _forced_alone(ctx, engine, "fresh-2", swapped["second"], f2)
    kept, after = swapped["kept"], swapped["after"]
    n = len(kept.tokens) if kept is not None else 0
    moved = compare.exact_arrays(
        [*kept.keys, *kept.values] if kept else [],
        [a[:, :n] for a in (*after.keys, *after.values)] if after and kept else [])
    moved.update(rule="the kept K/V bit-exact after swap-out, swap-in and a turn", tokens=n)
    unswapped = compare.compare_logits(kept_in["logits"], swapped["logits"], compare.SAME_DEVICE)
    recomputed = compare.compare_logits(fresh, swapped["logits"], compare.RECOMPUTED)
    out = {"ok": (unswapped["ok"] and recomputed["ok"] and moved["ok"] and n > 0
                  and swapped["reused"] > 0 and swapped["state"] == "swapped"),
           "state_after_swap_out": swapped["state"], "swapped_out_bytes": swapped["swapped"],
           "reused_prompt_tokens": swapped["reused"],
           "host_budget_used_bytes": engine.kv.host.used_bytes,
           "logits": unswapped, "logits_vs_fresh": recomputed, "kept_kv": moved,
           "stale_past_control": _stale_past_control(ctx, engine, fresh, f2)}
    if ctx.dry_run:
        out["tokens"] = _sampled_session(ctx, engine, first)
        out["ok"] = out["ok"] and out["tokens"]["ok"]
    return out


def _stale_past_control(ctx: Context, engine: Engine, reference: np.ndarray, forced) -> dict:
    """How far a stale past would move this model's logits: the same forced tokens after
    another conversation, judged like the real comparison. Information, not a verdict: on
    random (or tiny) weights the logits may hardly depend on the past, and then only the
    byte checks (kept_kv) can see a stale one; `caught` false says so."""
    tok = engine.tokenizer
    other = (*tok.encode_chat([("user", "Name three mountains in Africa.")]),
             *forced_tokens(engine, 12, offset=20), *tok.encode(" And three in Asia?"))
    stale = _forced_alone(ctx, engine, "stale-control", other, forced)
    judged = compare.compare_logits(reference, stale, compare.SAME_DEVICE)
    return {"caught": not judged["ok"], "max_abs_diff": judged.get("max_abs_diff"),
            "tolerance": judged.get("tolerance"), "argmax_agree": judged.get("argmax_agree"),
            "positions": judged.get("positions")}


def _sampled_turns(ctx: Context, engine: Engine, sid: str, first, swap: bool) -> Completed:
    engine.open_session(sid)
    try:
        t1 = _turn(ctx, engine, sid, SequenceRequest(f"{sid}-1", tuple(first), 12,
                                                     min_new_tokens=12, sampling=SAMPLED))
        if swap:
            engine.swap_out_session(sid)
        second = (*first, *t1.token_ids, *engine.tokenizer.encode(" And three in Asia?"))
        return _turn(ctx, engine, sid, SequenceRequest(f"{sid}-2", second, 12,
                                                       min_new_tokens=12, sampling=SAMPLED))
    finally:
        engine.close_session(sid)


def _sampled_session(ctx: Context, engine: Engine, first) -> dict:
    """The dry run's token rule: seeded sampled turns, swapped or not, bit-exact."""
    swapped = _sampled_turns(ctx, engine, "sampled-swapped", first, swap=True)
    kept = _sampled_turns(ctx, engine, "sampled-kept", first, swap=False)
    return {**compare.exact_tokens(kept.token_ids, swapped.token_ids),
            "rule": "sampled tokens bit-exact, swapped or not (dry run)"}


def prefix_cache_hit_equals_miss(ctx: Context) -> dict:
    """A prompt served from the prefix cache equals its first (missed) run."""
    engine = ctx.engine
    if engine.prefix_cache is None:
        return {"ok": False, "error": "this runtime has no prefix cache"}
    tok = engine.tokenizer
    prompt = tuple(tok.encode("A long shared system prompt about the sea and ships. " * 12))
    forced = forced_tokens(engine, 10, offset=5)
    miss = _forced_alone(ctx, engine, "cache-miss", prompt, forced)
    cached_before = engine.cached_bytes()
    runner = forcing.install(engine)
    runner.force("cache-hit", forced)
    hit = engine.generate(forcing.forced_request("cache-hit", prompt, forced),
                          timeout_s=ctx.wait_s())
    logits = compare.compare_logits(miss, runner.logits("cache-hit"), compare.SAME_DEVICE)
    blocks = engine.runtime.rows.blocks
    out = {"ok": logits["ok"] and hit.cached_prompt_tokens > 0 and blocks.free_slots < blocks.slots,
           "prompt_tokens": len(prompt), "cached_prompt_tokens": hit.cached_prompt_tokens,
           "cached_bytes": cached_before, "device_block_slots": blocks.slots,
           "device_block_slots_used": blocks.slots - blocks.free_slots, "logits": logits}
    if ctx.dry_run:
        other = tuple(tok.encode("A long shared system prompt about hills and rivers. " * 12))
        runs = [engine.generate(SequenceRequest(f"sampled-cache-{k}", other, 10, min_new_tokens=10,
                                                sampling=SAMPLED), timeout_s=ctx.wait_s())
                for k in ("miss", "hit")]
        out["tokens"] = {**compare.exact_tokens(runs[0].token_ids, runs[1].token_ids),
                         "cached_prompt_tokens": runs[1].cached_prompt_tokens,
                         "rule": "sampled tokens bit-exact (dry run)"}
        out["ok"] = out["ok"] and out["tokens"]["ok"] and runs[1].cached_prompt_tokens > 0
    return out


def ledger(ctx: Context) -> dict:
    """The device memory allocated is the pool's capacity plus what the decode path holds
    beside it (bucket buffers, captured graphs: charged out of the capacity at start); what
    the rows held never exceeded what was charged, nor the charge the capacity (sampled in
    batched_equals_solo)."""
    engine = ctx.engine
    seen = ctx.shared.get("ledger")
    if not seen:
        raise Unmet("batched_equals_solo did not run: nothing was sampled")
    allocated = engine.runtime.allocated_bytes
    decode = engine.decode_buffer_bytes + engine.decode_graph_bytes
    return {"ok": (allocated == engine.capacity_bytes + decode and engine.capacity_bytes > 0
                   and seen.get("held_above_charged") == 0
                   and seen.get("charged_above_capacity") == 0
                   and seen.get("max_charged_bytes", 0) > 0),
            "allocated_bytes": allocated, "capacity_bytes": engine.capacity_bytes,
            "decode_buffer_bytes": engine.decode_buffer_bytes,
            "decode_graph_bytes": engine.decode_graph_bytes,
            "held_bytes_now": engine.held_bytes(), **seen}


def equal_to_cpu(ctx: Context) -> dict:
    """The device's teacher-forced logits against the CPU provider's on the same folder
    (ACROSS_DEVICES); on the dry run the sampled tokens are bit-exact too."""
    engine = ctx.engine
    prompts = [tuple(engine.tokenizer.encode_chat([("user", p)])) for p in PROMPTS]
    forced = [forced_tokens(engine, ctx.new_tokens, offset=11 * i) for i in range(len(PROMPTS))]
    device = [_forced_alone(ctx, engine, f"device-{i}", p, f)
              for i, (p, f) in enumerate(zip(prompts, forced, strict=True))]
    cpu = Engine(EngineConfig(model_dir=ctx.model_dir, device="cpu",
                              max_context_tokens=engine.spec.context_length))
    ctx.closers.append(cpu.close)
    try:
        on_cpu = [_forced_alone(ctx, cpu, f"cpu-{i}", p, f)
                  for i, (p, f) in enumerate(zip(prompts, forced, strict=True))]
        logits = compare.compare_runs(on_cpu, device, compare.ACROSS_DEVICES)
        out = {"ok": logits["ok"], "prompts": list(PROMPTS), "new_tokens": ctx.new_tokens,
               "logits": logits}
        if ctx.dry_run:
            tokens = []
            for i, p in enumerate(prompts):
                runs = [e.generate(SequenceRequest(f"sampled-{where}-{i}", p, ctx.new_tokens,
                                                   sampling=SAMPLED), timeout_s=ctx.wait_s())
                        for where, e in (("device", engine), ("cpu", cpu))]
                tokens.append({**compare.exact_tokens(runs[1].token_ids, runs[0].token_ids),
                               "device_text": runs[0].text, "cpu_text": runs[1].text})
            out["tokens"] = {"ok": all(t["ok"] for t in tokens), "prompts": tokens,
                             "rule": "sampled tokens bit-exact (dry run)"}
            out["ok"] = out["ok"] and out["tokens"]["ok"]
    finally:
        cpu.close()
        ctx.closers.remove(cpu.close)
    return out


# --- speed (GPU only) ----------------------------------------------------------------------


def decode_speed(ctx: Context) -> dict:
    """Decode tokens/s at 1, 8, 32, 64, 128 streams, beside onnxruntime-genai on the same
    folder where it is installed (GPU only: a CPU figure says nothing about a GPU)."""
    if ctx.dry_run:
        return {"ok": True, "status": "not_applicable", "skipped": "dry run: no GPU figure"}
    return speed.decode_speed(ctx)


CHECKS: list[Check] = [
    ("session_starts", session_starts),
    ("heavy_nodes_on_the_device", heavy_nodes_on_the_device),
    ("kv_on_device", kv_on_device),
    ("kv_memory_as_charged", kv_memory_as_charged),
    ("batched_equals_solo", batched_equals_solo),
    ("session_swap_equals_fresh", session_swap_equals_fresh),
    ("prefix_cache_hit_equals_miss", prefix_cache_hit_equals_miss),
    ("captured_equals_uncaptured", lambda ctx: captured_equals_uncaptured(ctx.engine)),
    ("graph_id_vs_sessions", graph_id_vs_sessions),
    ("ledger", ledger),
    # Before equal_to_cpu: the CPU engine on a large fp16 folder is slow, and the deadline
    # should skip the CPU comparison rather than the GPU's figures.
    ("decode_speed", decode_speed),
    ("equal_to_cpu", equal_to_cpu),
]
