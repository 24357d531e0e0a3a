"""Parity of an ONNX model folder with transformers (runs in .venv-tools).

  .venv-tools/bin/python -m model_tools.parity --model-dir FP32_DIR --hf-dir HF_DIR

Prints one JSON object: the largest |logit difference| over a few prompts (one
prefill each, every position) and the greedy answer to the capital-of-France
prompt from plain onnxruntime with a growing cache.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

PROMPTS = ("The quick brown fox jumps over the lazy dog.",
           "In 1492, Columbus sailed the ocean blue.",
           "def fibonacci(n):\n    if n < 2:\n        return n")
FRANCE = "What is the capital of France? Answer in one sentence."


HEAD_DIM: dict[str, int] = {}


def empty_past(session: ort.InferenceSession) -> dict[str, np.ndarray]:
    # NOTE: the graph leaves head_dim symbolic ('kv_cache_dim'): genai_config has it.
    past = {}
    for inp in session.get_inputs():
        if inp.name.startswith("past_key_values"):
            heads = inp.shape[1]
            past[inp.name] = np.zeros((1, heads, 0, HEAD_DIM["head_size"]), dtype=np.float32)
    return past


def onnx_logits(session, ids: list[int]) -> tuple[np.ndarray, dict]:
    feed = {"input_ids": np.array([ids], dtype=np.int64),
            "attention_mask": np.ones((1, len(ids)), dtype=np.int64), **empty_past(session)}
    names = [o.name for o in session.get_outputs()]
    outs = dict(zip(names, session.run(None, feed), strict=True))
    return outs["logits"][0], outs


def greedy(session, ids: list[int], new_tokens: int, eos: int) -> list[int]:
    logits, outs = onnx_logits(session, ids)
    out: list[int] = []
    total = len(ids)
    while len(out) < new_tokens:
        token = int(np.argmax(logits[-1]))
        out.append(token)
        if token == eos:
            break
        total += 1
        feed = {"input_ids": np.array([[token]], dtype=np.int64),
                "attention_mask": np.ones((1, total), dtype=np.int64)}
        for name in list(outs):
            if name.startswith("present."):
                feed["past_key_values." + name[len("present."):]] = outs[name]
        names = [o.name for o in session.get_outputs()]
        outs = dict(zip(names, session.run(None, feed), strict=True))
        logits = outs["logits"][0]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", type=Path, required=True)
    p.add_argument("--hf-dir", type=Path, required=True)
    a = p.parse_args()
    config = json.loads((a.model_dir / "genai_config.json").read_text())
    HEAD_DIM["head_size"] = config["model"]["decoder"]["head_size"]
    tokenizer = AutoTokenizer.from_pretrained(str(a.hf_dir))
    model = LlamaForCausalLM.from_pretrained(str(a.hf_dir), dtype=torch.float32).eval()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    session = ort.InferenceSession(str(a.model_dir / "model.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    per_prompt = []
    for text in PROMPTS:
        ids = tokenizer.encode(text)
        with torch.no_grad():
            ref = model(torch.tensor([ids])).logits[0].numpy()
        ours, _ = onnx_logits(session, ids)
        per_prompt.append(float(np.abs(ref - ours).max()))
    chat = tokenizer.apply_chat_template([{"role": "user", "content": FRANCE}],
                                         add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(chat)
    out = greedy(session, ids, 24, tokenizer.eos_token_id)
    print(json.dumps({"max_abs_logit_diff": max(per_prompt), "per_prompt": per_prompt,
                      "greedy_text": tokenizer.decode(out, skip_special_tokens=True),
                      "greedy_token_ids": out}))


if __name__ == "__main__":
    main()
