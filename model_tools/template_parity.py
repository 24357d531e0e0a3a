"""Chat templates rendered by transformers, for the serving side's parity test (runs in .venv-tools).

  .venv-tools/bin/python -m model_tools.template_parity < REQUEST.json > RENDERED.json

REQUEST: {"folders": [DIR, ...], "conversations": [[[role, content], ...], ...]}.
RENDERED: {DIR: [text or {"error": message}, ...]}: each conversation through
`AutoTokenizer.from_pretrained(DIR).apply_chat_template(..., tokenize=False,
add_generation_prompt=True)`, the call worker_service.core.tokenizer must match byte for byte.
"""

from __future__ import annotations

import json
import os
import sys

# NOTE: before transformers is imported: it reads these at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from transformers import AutoTokenizer  # noqa: E402


def render(folder: str, conversations: list[list[list[str]]]) -> list[object]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    out: list[object] = []
    for turns in conversations:
        messages = [{"role": role, "content": content} for role, content in turns]
        try:
            out.append(tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True))
        except Exception as exc:  # a template's raise_exception, or a jinja error
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


def main() -> int:
    request = json.load(sys.stdin)
    result = {folder: render(folder, request["conversations"]) for folder in request["folders"]}
    json.dump(result, sys.stdout, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
