"""How the engine runs one model folder: its config (engine.py runs it).

The runtime's fields (device, ORT session, KV layout and memory) are
runtime/config.RuntimeConfig's; this adds what only the engine reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from worker_service.runtime.config import RuntimeConfig


@dataclass(frozen=True, kw_only=True)
class EngineConfig(RuntimeConfig):
    """How to run one model folder: the runtime's config and the engine's own fields."""

    model_dir: Path
    # Prompt tokens one step may prefill (batch 1 chunks): bounds the host logits of a
    # run and how long a long prompt delays the decoding streams.
    prefill_chunk_tokens: int = 512
    # The context this worker serves, at most the model's (0: the model's). Rows are
    # this long, so a shorter context holds more device rows (allocated whole); the
    # worker reports it as its context_length.
    max_context_tokens: int = 0
    # Constrained rows: compute the next tokens' masks beside the ORT run (both release
    # the GIL) instead of after it.
    constraint_mask_overlap: bool = True
    # Speculative decoding: "ngram" (prompt lookup: proposals from the sequence's own
    # earlier tokens, verified in one run; core/ngram.py) or "off".
    speculative: str = "off"
    # The most tokens one proposal may hold (each sequence's size adapts below it).
    speculative_max_tokens: int = 8
    # Speculation runs only where a verification run's logits differ from single-token
    # runs' by at most this (measured at start-up: Engine.verify_drift), so greedy output
    # stays the non-speculative output; beyond it the engine runs "off" and says why.
    speculative_max_logit_drift: float = 1e-3
    # LoRA adapters loaded at start, (served name, .onnx_adapter path) each (--lora NAME=PATH);
    # the base folder must take its LoRA weights as inputs (model_tools/lora.py).
    lora_adapters: tuple[tuple[str, str], ...] = ()
    # The disk tier of parked sessions (--session-dir; runtime/session_disk.py): "" off.
    session_dir: str = ""
    # The bytes its files may take (--session-disk-bytes).
    session_disk_bytes: int = 4 * 2**30
