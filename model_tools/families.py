"""Random-weight Hugging Face folders of small shapes, one per family the onnxruntime-genai
builder converts, each with a chat template in its family's shape (for tests: no downloads).

  .venv-tools/bin/python -m model_tools.families TOKENIZER_DIR OUT_DIR [FAMILY ...]

Every folder has SmolLM2's tokenizer (the only one here offline) under the family's own
architecture, config and chat template: the template's turn markers, its tool-call
format (Llama 3.1's <|python_tag|> JSON, Mistral's [TOOL_CALLS], Hermes' <tool_call>
in Qwen's) or none (Phi-3's and Gemma's: ortserve's fallback), and Qwen3's <think>.
The templates follow each family's shape, not its every branch. One folder per line on
stdout.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024)
SEED = 0

_TOOLS_JSON = "{% for t in tools %}{{ t | tojson }}\n{% endfor %}"


def _chatml(think: bool) -> str:
    """Qwen's ChatML with Hermes tool calls; Qwen3's also strips past reasoning and closes it
    in the prompt under enable_thinking false."""
    past = ("{% if m.role == 'assistant' and '</think>' in content %}"
            "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% endif %}"
            if think else "")
    closed = ("{% if enable_thinking is defined and enable_thinking is false %}"
              "{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}" if think else "")
    return (
        "{% if tools %}{{ '<|im_start|>system\\n# Tools\\n<tools>\\n' }}" + _TOOLS_JSON +
        "{{ '</tools>\\nFor each call return <tool_call>\\n{\"name\": <name>, \"arguments\": "
        "<args>}\\n</tool_call><|im_end|>\\n' }}{% endif %}"
        "{% for m in messages %}{% if m.tool_calls %}{{ '<|im_start|>assistant\\n' }}"
        "{% for c in m.tool_calls %}{{ '<tool_call>\\n{\"name\": \"' + c.function.name + "
        "'\", \"arguments\": ' + (c.function.arguments | tojson) + '}\\n</tool_call>' }}"
        "{% endfor %}{{ '<|im_end|>\\n' }}{% elif m.role == 'tool' %}"
        "{{ '<|im_start|>user\\n<tool_response>\\n' + m.content + "
        "'\\n</tool_response><|im_end|>\\n' }}"
        "{% else %}{% set content = m.content %}" + past +
        "{{ '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}" + closed +
        "{% endif %}")


TEMPLATES = {
    "llama": (
        "{{ bos_token }}{% if tools %}{{ '<|start_header_id|>system<|end_header_id|>\\n\\n"
        "Respond with a JSON for a function call: {\"name\": function name, \"parameters\": "
        "dictionary of argument name and its value}.\\n' }}" + _TOOLS_JSON +
        "{{ '<|eot_id|>' }}{% endif %}{% for m in messages %}"
        "{% set role = 'ipython' if m.role == 'tool' else m.role %}"
        "{{ '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' }}{% if m.tool_calls %}"
        "{{ '<|python_tag|>' }}{% for c in m.tool_calls %}{{ '{\"name\": \"' + c.function.name "
        "+ '\", \"parameters\": ' + (c.function.arguments | tojson) + '}' }}{% endfor %}"
        "{% else %}{{ m.content }}{% endif %}{{ '<|eot_id|>' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
        "{% endif %}"),
    "qwen2": _chatml(think=False),
    "qwen3": _chatml(think=True),
    "mistral": (
        "{{ bos_token }}{% if tools %}{{ '[AVAILABLE_TOOLS] ' + (tools | tojson) + "
        "'[/AVAILABLE_TOOLS]' }}{% endif %}{% for m in messages %}{% if m.role == 'user' or "
        "m.role == 'system' %}{{ '[INST] ' + m.content + '[/INST]' }}{% elif m.tool_calls %}"
        "{{ '[TOOL_CALLS] ' + (m.tool_calls | map(attribute='function') | list | tojson) }}"
        "{{ eos_token }}{% elif m.role == 'tool' %}{{ '[TOOL_RESULTS] ' + m.content + "
        "'[/TOOL_RESULTS]' }}{% else %}{{ m.content + eos_token }}{% endif %}{% endfor %}"),
    "phi3": (
        "{% for m in messages %}{{ '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"),
    "gemma": (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{% set role = 'model' if m.role == 'assistant' else m.role %}"
        "{{ '<start_of_turn>' + role + '\\n' + m.content + '<end_of_turn>\\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"),
}
# (config class, model class, the family's own config keys at this shape)
CLASSES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 16, "sliding_window": None}),
    # The builder takes LongRoPE unless the original window is the window.
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": None,
                                               "original_max_position_embeddings": 1024}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 16}),
}


def save(family: str, tokenizer_dir: Path, out: Path) -> None:
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config_name, model_name, extra = CLASSES[family]
    config = getattr(transformers, config_name)(**{
        **SHAPE, "vocab_size": len(tokenizer), "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id, **extra})
    torch.manual_seed(SEED)
    getattr(transformers, model_name)(config).to(torch.float32).save_pretrained(str(out))
    shutil.copy2(tokenizer_dir / "tokenizer.json", out / "tokenizer.json")
    # The family's template in both places a tokenizer reads one (the builder saves the
    # tokenizer again, and that copy is what the model folder gets).
    config = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = TEMPLATES[family]
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "chat_template.jinja").write_text(TEMPLATES[family])


def main(argv: list[str]) -> None:
    tokenizer_dir, out_dir, *families = argv
    for family in families or list(CLASSES):
        out = Path(out_dir) / f"tiny-{family}"
        save(family, Path(tokenizer_dir), out)
        print(out, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
