"""Parity of an fp32 ONNX model folder with transformers (runs in .venv-tools).

  .venv-tools/bin/python -m model_tools.parity --model-dir FP32_DIR --hf-dir HF_DIR [--json]

For a few fixed prompts, one prefill step each (past length 0): the largest
|difference| between the last-position logits of transformers and of plain
onnxruntime (CPU). Then a greedy generation of the chat-templated
capital-of-France prompt with plain onnxruntime and a growing KV cache, and
the same with transformers for comparison. `--json`: one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

# NOTE: before transformers is imported: it reads these at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

PROMPTS = ("The quick brown fox jumps over the lazy dog.",
           "In 1492, Columbus sailed the ocean blue.",
           "def fibonacci(n):\n    if n < 2:\n        return n")
GREEDY_PROMPT = "What is the capital of France? Answer in one sentence."
GREEDY_NEW_TOKENS = 16


class OnnxDecoder:
    """A plain onnxruntime session over the builder's decoder graph, one sequence."""

    def __init__(self, model_dir: Path) -> None:
        options = ort.SessionOptions()
        # Default ORT threading is measurably slower on these small machines.
        # sched_getaffinity is Linux-only; elsewhere every core counts.
        options.intra_op_num_threads = (len(os.sched_getaffinity(0))
                                        if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
        self.session = ort.InferenceSession(str(model_dir / "model.onnx"), options,
                                            providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        config = json.loads((model_dir / "genai_config.json").read_text())["model"]
        eos = config["eos_token_id"]
        self.eos_token_ids = set(eos if isinstance(eos, list) else [eos])
        # NOTE: the graph leaves the head dimension symbolic ('kv_cache_dim'), so the
        # cache shape comes from genai_config, not from the input metadata.
        self.past_shape = (1, config["decoder"]["num_key_value_heads"], 0,
                           config["decoder"]["head_size"])

    def empty_past(self) -> dict[str, np.ndarray]:
        """past_key_values.N.{key,value} of past length 0: [1, kv_heads, 0, head_size]."""
        return {inp.name: np.zeros(self.past_shape, dtype=np.float32)
                for inp in self.session.get_inputs() if inp.name.startswith("past_key_values.")}

    def step(self, new_ids: list[int], past: dict[str, np.ndarray], total_tokens: int
             ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Run new_ids after `past`; return the last-position logits and the next past."""
        feed = {"input_ids": np.array([new_ids], dtype=np.int64),
                # GQA derives sequence lengths from the mask: its length is the total so far.
                "attention_mask": np.ones((1, total_tokens), dtype=np.int64), **past}
        outputs = dict(zip(self.output_names, self.session.run(None, feed), strict=True))
        next_past = {"past_key_values." + name.removeprefix("present."): value
                     for name, value in outputs.items() if name.startswith("present.")}
        return outputs["logits"][0, -1], next_past

    def prefill_logits(self, ids: list[int]) -> np.ndarray:
        """Last-position logits of the whole prompt in one step."""
        logits, _ = self.step(ids, self.empty_past(), len(ids))
        return logits

    def greedy(self, ids: list[int], max_new_tokens: int) -> list[int]:
        """Greedy decoding with a growing cache (present fed back as past)."""
        logits, past = self.step(ids, self.empty_past(), len(ids))
        out: list[int] = []
        while True:
            token = int(np.argmax(logits))
            out.append(token)
            if token in self.eos_token_ids or len(out) == max_new_tokens:
                return out
            logits, past = self.step([token], past, len(ids) + len(out))


def hf_prefill_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].numpy()


def hf_greedy(model, ids: list[int], eos_token_ids: set[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                             dtype=torch.long), do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=sorted(eos_token_ids), pad_token_id=min(eos_token_ids))
    return out[0, len(ids):].tolist()


def chat_ids(tokenizer, text: str) -> list[int]:
    chat = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True, tokenize=False)
    # The template already writes every special token.
    return tokenizer.encode(chat, add_special_tokens=False)


def check_parity(model_dir: Path, hf_dir: Path) -> dict:
    """The report: logit differences per prompt, greedy ids and text from ONNX and transformers."""
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    decoder = OnnxDecoder(model_dir)
    per_prompt = []
    for text in PROMPTS:
        ids = tokenizer.encode(text)
        ref, ours = hf_prefill_logits(model, ids), decoder.prefill_logits(ids)
        per_prompt.append({"prompt": text, "prompt_tokens": len(ids),
                           "max_abs_logit_diff": float(np.abs(ref - ours).max()),
                           "argmax_matches": int(ref.argmax()) == int(ours.argmax())})
    ids = chat_ids(tokenizer, GREEDY_PROMPT)
    greedy_ids = decoder.greedy(ids, GREEDY_NEW_TOKENS)
    hf_ids = hf_greedy(model, ids, decoder.eos_token_ids, GREEDY_NEW_TOKENS)
    return {"max_abs_logit_diff": max(p["max_abs_logit_diff"] for p in per_prompt),
            "per_prompt": per_prompt,
            "greedy_prompt": GREEDY_PROMPT,
            "greedy_text": tokenizer.decode(greedy_ids, skip_special_tokens=True),
            "greedy_token_ids": greedy_ids,
            "hf_greedy_token_ids": hf_ids,
            "greedy_matches_hf": greedy_ids == hf_ids}


def print_report(report: dict) -> None:
    for p in report["per_prompt"]:
        print(f"{p['max_abs_logit_diff']:.3g} max |logit diff| at the last position, "
              f"{p['prompt_tokens']} tokens, argmax {'same' if p['argmax_matches'] else 'DIFFERS'}:"
              f" {p['prompt']!r}")
    print(f"max |logit diff|: {report['max_abs_logit_diff']:.3g}")
    print(f"greedy ({len(report['greedy_token_ids'])} tokens, "
          f"{'same as' if report['greedy_matches_hf'] else 'DIFFERENT from'} transformers): "
          f"{report['greedy_text']!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_tools.parity", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, required=True,
                        help="an fp32 model folder from model_tools.prepare")
    parser.add_argument("--hf-dir", type=Path, required=True,
                        help="the Hugging Face folder it was built from")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    for path in (args.model_dir / "model.onnx", args.hf_dir / "config.json"):
        if not path.is_file():
            print(f"parity: {path} is missing; run `.venv-tools/bin/python -m model_tools.prepare`",
                  file=sys.stderr)
            return 1
    report = check_parity(args.model_dir, args.hf_dir)
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
