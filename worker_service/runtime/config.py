"""How the runtime runs on its device: the fields factory.py builds a runtime from.

The engine's config (worker_service/engine/config.py) is this plus what only the engine
reads (the model folder, chunking, speculation, adapters), so runtime/ takes what it
needs from below and never imports the worker's edge.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """The device, the ORT session's settings, the KV layout and its memory."""

    device: str = "cpu"  # "cpu" | "cuda" (the caller resolves "auto")
    device_id: int = 0
    intra_op_threads: int = 0  # 0: the cores this process may use (default ORT threading is slow)
    inter_op_threads: int = 1
    # ORT's pool threads spin-wait for work between and after parallel sections (ORT's
    # default, and onnxruntime-genai's). Measured on the shared 2-core machine, spinning
    # off decoded fp32 1.8x faster under a load of 5 but int4 0.9-1.05x under a load of 4
    # (docs/benchmarks.md, "Engine vs genai"): not a clear win, so ORT's default stays.
    intra_op_spinning: bool = True
    kv_capacity_bytes: int = 512 * 2**20
    # runtime/factory.py builds what this names. "auto"/"rows": running sequences are
    # rows of one row store and decode in one batched run (the host arena on CPU);
    # "arena": the same, CPU only; "static": one buffer per sequence, one run each,
    # no sessions or prefix cache (only when asked for by name).
    kv_layout: str = "auto"
    max_batch_rows: int = 32  # the row store's rows: the most sequences running at once
    # Host bytes swapped-out sessions may hold (outside the KV capacity); 0: a swap-out
    # drops the session's K/V and its next turn recomputes the history.
    session_swap_bytes: int = 256 * 2**20
    # The automatic prefix cache's bound, inside kv_capacity_bytes (docs/features/prefix-cache.md);
    # None: half of it; 0: off. Arena layout only.
    prefix_cache_bytes: int | None = None
    # Arena layout: the first chunks of prompts that join in one step share one run
    # (right-padded; runtime/ort_rows.prefill_first) instead of one run each.
    batch_first_chunks: bool = True
    # The LM head only at the positions the engine reads (runtime/last_logits.py): a
    # prompt chunk computes one row of logits, not one per token. False: the graph as
    # the folder has it (for A/B runs).
    last_position_logits: bool = True
    # CUDA with device rows: decode steps replay one CUDA graph per batch-size bucket
    # (runtime/decode_step.py), captured at start on the engine thread. False: every
    # step launches its kernels (for A/B runs). No effect on the CPU (nothing to capture).
    cuda_graphs: bool = True
    # Extra ORT session config entries ((key, value), ...), e.g.
    # ("session.intra_op.allow_spinning", "0"): for A/B runs (bench/experiments/engine_ab.py).
    ort_session_config: tuple[tuple[str, str], ...] = ()
    # Bench only (runtime/rate_set_runner.py): no model runs, every running sequence gets a
    # token this many times a second; 0: the model runs. The worker refuses it outside the
    # bench (ORTSERVE_BENCH=1).
    bench_rate_set_tokens_per_s: float = 0.0
