"""cuda_check's `captured_equals_uncaptured`: decode through the bucketed path (padded rows,
full-width masks, fixed buffers, a CUDA graph per bucket where the session has graphs)
gives the logits of plain decode (every size, the step's own mask width, no graph).

Bit for bit on the CPU (the dry run); on CUDA within `CUDA_TOLERANCE`, since cuBLAS
and attention kernels choose their splits by batch size (a bucket of 4 is not a batch
of 3) and fp16 rounds differently with them (DESIGN.md, "On the GPU"). Both arms are
teacher-forced on the same ids (the plain arm's greedy choices), so one last-bit
difference cannot send the arms down different continuations.

It runs its own two runners on the engine's session over scratch device rows (4 rows:
3 live, a bucket of 4), on the calling thread, with graph ids apart from the engine's.
"""

from __future__ import annotations

import numpy as np

from worker_service.runtime.decode_step import DecodeShapes, bucket_ladder
from worker_service.runtime.device_rows import DeviceRows
from worker_service.runtime.ort_rows import OrtRows

CUDA_TOLERANCE = 0.05  # fp16 logits, batch-size-dependent kernel splits
PROMPTS = ("What is the capital of France?", "Write a haiku about the sea.",
           "List three colours of the rainbow, then stop.")
GRAPH_IDS_FROM = 1000  # the engine's runner numbers its buckets' graphs from 1
STEPS = 8


def _decode(engine, shapes: DecodeShapes, prompts: list[list[int]],
            forced: list[list[int]] | None) -> tuple[list[np.ndarray], list[list[int]]]:
    spec, session = engine.spec, engine.runner.batch.session
    store = DeviceRows(spec, 4, engine.config.device, engine.config.device_id)
    try:
        runner = OrtRows(session, spec, store, max_chunk_tokens=64, shapes=shapes,
                             graph_ids_from=GRAPH_IDS_FROM)
        runner.warm_graphs()  # captures on this thread where shapes.capture; else nothing
        past, ids = [], []
        for prompt in prompts:
            row = store.allocate(len(prompt) + STEPS + 1)
            logits = runner.prefill(row, 0, prompt)
            past.append(len(prompt))
            ids.append(int(np.argmax(logits[0])))
        out_logits, out_ids = [], []
        for step in range(STEPS):
            if forced is not None:
                ids = forced[step]
            decoded = runner.decode_rows(len(prompts), past, ids)
            out_logits.append(decoded.logits().astype(np.float32).copy())
            chosen = decoded.next_ids.tolist()
            out_ids.append(ids)
            ids = chosen
            past = [p + 1 for p in past]
        return out_logits, out_ids
    finally:
        store.close()


def captured_equals_uncaptured(engine) -> dict:
    """The check's result (see the module docstring)."""
    prompts = [list(engine.tokenizer.encode(p)) for p in PROMPTS]
    graphs = engine.runner.batch.graphs
    plain = DecodeShapes(bucket_ladder(4, pads=False), full_width=False, capture=False)
    bucketed = DecodeShapes(bucket_ladder(4, pads=True), full_width=True,
                            capture=graphs and engine.config.device == "cuda")
    want_logits, fed = _decode(engine, plain, prompts, None)
    got_logits, _ = _decode(engine, bucketed, prompts, fed)
    difference = max(float(np.abs(g - w).max()) for g, w in zip(got_logits, want_logits,
                                                                strict=True))
    same_ids = all(np.array_equal(np.argmax(g, axis=1), np.argmax(w, axis=1))
                   for g, w in zip(got_logits, want_logits, strict=True))
    exact = engine.config.device == "cpu"
    return {"ok": difference == 0.0 if exact else difference <= CUDA_TOLERANCE,
            "rule": "bit for bit" if exact else f"max logit difference <= {CUDA_TOLERANCE}",
            "max_logit_difference": difference, "same_greedy_ids": same_ids,
            "captured": bucketed.capture, "rows": len(prompts), "bucket": 4, "steps": STEPS}
