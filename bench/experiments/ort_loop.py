"""A plain ORT decode loop, batch 1, one shared KV buffer per layer of `--rows-tokens` positions.

  .venv/bin/python bench/experiments/ort_loop.py MODEL_DIR [--rows-tokens 8192] [--steps 64] [--threads 2]
  .venv-tools/bin/python bench/experiments/ort_loop.py MODEL_DIR ...    (the peer's onnxruntime build)

No engine, no Python around the run but the loop itself: it separates what
the ORT build and the KV row length cost from what the engine adds. Runs in
either venv (numpy and onnxruntime only); prints one JSON line with the
median ms per decode step.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model_dir", type=Path)
    p.add_argument("--rows-tokens", type=int, default=8192)
    p.add_argument("--steps", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    options = ort.SessionOptions()
    options.intra_op_num_threads = a.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    session = ort.InferenceSession(str(a.model_dir / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    _, kv_heads, _, head_dim = past[0].shape
    if not isinstance(kv_heads, int) or not isinstance(head_dim, int):  # symbolic dims
        config = json.loads((a.model_dir / "genai_config.json").read_text())["model"]["decoder"]
        kv_heads, head_dim = config["num_key_value_heads"], config["head_size"]
    vocab = session.get_outputs()[0].shape[-1]
    binding = session.io_binding()
    buffers = []
    for item in past:
        buf = np.zeros((1, kv_heads, a.rows_tokens, head_dim), np.float32)
        buffers.append(buf)
        present = item.name.replace("past_key_values.", "present.")
        for bind, name in ((binding.bind_input, item.name), (binding.bind_output, present)):
            bind(name, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
    logits = np.empty((1, 1, vocab), np.float32)
    binding.bind_output("logits", "cpu", 0, np.float32, [1, 1, vocab], logits.ctypes.data)
    ids = np.array([[42]], np.int64)
    times = []
    for step in range(a.steps):
        binding.bind_cpu_input("input_ids", ids)
        binding.bind_cpu_input("attention_mask", np.ones((1, step + 1), np.int64))
        t0 = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append(time.perf_counter() - t0)
        ids[0, 0] = int(np.argmax(logits))
    print(json.dumps({"onnxruntime": ort.__version__, "rows_tokens": a.rows_tokens,
                      "median_step_ms": float(np.median(times[4:])) * 1e3}))


if __name__ == "__main__":
    main()
