"""Build a base model folder whose LoRA weights are graph inputs, and random PEFT adapters.

  .venv-tools/bin/python -m model_tools.lora [--cache-dir DIR] [--base tiny-llama|smollm2-135m-instruct]
      [--adapters 2] [--rank 4] [--force]

onnxruntime-genai's builder takes `--extra_options adapter_path=DIR` (a PEFT
folder) but bakes that one adapter into the graph: every targeted projection
becomes MatMul(x, W) + MatMul(MatMul(x, A), B * scaling) with A and B as
initializers. It writes no `.onnx_adapter` file and no LoRA graph inputs (that
step is Olive's ExtractAdapters pass, not part of the builder). So this tool
builds the base (the tiny llama, or SmolLM2's fp32 HF folder that `make model` keeps
under <cache>/hf/) once per adapter and then does the extraction itself:

1. N random adapters are made with peft over the base
   (`init_lora_weights=False`, so B is not zero and each adapter changes the
   output), seeded, saved as PEFT folders: no downloads.
2. The builder runs once per adapter with adapter_path; the graphs are the
   same but for the LoRA initializers' values (checked).
3. The first graph's LoRA initializers (names with `.lora_A.` / `.lora_B.`)
   become float inputs [in, lora_rank] and [lora_rank, out]: batch-shared, so
   one run serves one adapter. Each adapter's values go to NAME.onnx_adapter
   (onnxruntime.AdapterFormat, what onnxruntime.LoraAdapter reads).
4. Expected greedy tokens of transformers + peft (fp32) for the base and each
   adapter over fixed prompts go to lora-expected.json, for the parity test.

Output: <cache>/models/<base>-lora/ (a model folder plus adapters/). The
base is served by binding zeros of rank 1 to every LoRA input.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from model_tools.prepare import (
    PrepareError,
    complete_model_folder,
    resolve_cache_dir,
    run_builder,
    staged,
    write_manifest,
)
from model_tools.sources import SMOLLM2_HF, TINY_HF

BASES = (TINY_HF, SMOLLM2_HF)  # HF folders under <cache>/hf/ that `make tiny-model` / `make model` keep
ADAPTER_SEED = 4300
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RANK_DIM = "lora_rank"
SLOT_INPUT = "lora_slot"  # the per-row graph's row -> adapter slot input
EXPECTED_FILE = "lora-expected.json"
EXPECTED_PROMPTS = [[1, 504, 3158, 282, 4649, 314], [28, 11, 9, 500, 21, 7, 99, 1000]]
EXPECTED_NEW_TOKENS = 12


def is_lora_weight(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


def make_adapter(hf_dir: Path, out: Path, seed: int, rank: int) -> None:
    """A random PEFT LoRA adapter over the HF model in hf_dir, seeded."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGET_MODULES,
                        lora_dropout=0.0, init_lora_weights=False, task_type="CAUSAL_LM")
    torch.manual_seed(seed)
    model = get_peft_model(base, config)
    model.save_pretrained(str(out))


def expected_tokens(hf_dir: Path, adapter_dir: Path | None) -> list[list[int]]:
    """Greedy new tokens of transformers (+ peft) for EXPECTED_PROMPTS, fp32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
    if adapter_dir is not None:
        from peft import PeftModel
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    result = []
    with torch.no_grad():
        for prompt in EXPECTED_PROMPTS:
            ids = list(prompt)
            for _ in range(EXPECTED_NEW_TOKENS):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                ids.append(int(torch.argmax(logits)))
            result.append(ids[len(prompt):])
    return result


def lora_initializers(model_file: Path) -> dict:
    """name -> numpy array of every LoRA initializer in a built model."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(model_file), load_external_data=True)
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer
            if is_lora_weight(t.name)}


def extract_inputs(model_file: Path, out_dir: Path) -> dict[str, tuple[int, ...]]:
    """Turn the LoRA initializers of model_file into graph inputs; save to out_dir/model.onnx."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_file), load_external_data=True)
    graph = model.graph
    keep, shapes = [], {}
    for init in graph.initializer:
        if is_lora_weight(init.name):
            shapes[init.name] = tuple(init.dims)
        else:
            keep.append(init)
    if not shapes:
        raise PrepareError(f"{model_file} has no LoRA initializers: the builder ignored "
                           "adapter_path", "check the onnxruntime-genai version")
    del graph.initializer[:]
    graph.initializer.extend(keep)
    for name, dims in sorted(shapes.items()):
        # A is [in, rank], B is [rank, out]: the rank axis is symbolic so adapters of any rank fit.
        dim_names = [dims[0], RANK_DIM] if ".lora_A." in name else [RANK_DIM, dims[1]]
        graph.input.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, dim_names))
    onnx.save(model, str(out_dir / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data")
    return shapes


def stack_inputs(model_file: Path) -> int:
    """Per-row adapters in one run: each LoRA input X [in, rank] becomes X.stacked
    [lora_slots, in, rank] gathered by a new input `lora_slot` [batch] (row b's slot) into
    X [batch, in, rank]; MatMul broadcasts over the batch axis, so every row multiplies by
    its own adapter's weights. Rewrites model_file in place (the graph only: the weights'
    external data is untouched); returns how many inputs were stacked."""
    import onnx
    from onnx import TensorProto, helper

    model = onnx.load(str(model_file), load_external_data=False)
    graph = model.graph
    lora = [i for i in graph.input if is_lora_weight(i.name)]
    nodes = []
    for value in lora:
        dims = [d.dim_value or d.dim_param for d in value.type.tensor_type.shape.dim]
        graph.input.remove(value)
        graph.input.append(helper.make_tensor_value_info(
            f"{value.name}.stacked", TensorProto.FLOAT, ["lora_slots", *dims]))
        nodes.append(helper.make_node("Gather", [f"{value.name}.stacked", SLOT_INPUT],
                                      [value.name], name=f"{value.name}/Gather", axis=0))
    graph.input.append(helper.make_tensor_value_info(SLOT_INPUT, TensorProto.INT64,
                                                     ["batch_size"]))
    # The builder's 2-D shape notes for these names would contradict the gathered 3-D ones.
    stale = [v for v in graph.value_info if is_lora_weight(v.name)]
    for v in stale:
        graph.value_info.remove(v)
    # Before every consumer, so the nodes stay topologically sorted.
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend([*nodes, *rest])
    onnx.save(model, str(model_file))
    return len(lora)


def write_adapter(values: dict, out: Path) -> int:
    """Write one .onnx_adapter file; returns its parameter bytes."""
    import numpy as np
    import onnxruntime as ort

    adapter = ort.AdapterFormat()
    adapter.set_adapter_version(1)
    adapter.set_model_version(1)
    adapter.set_parameters({k: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(v))
                            for k, v in values.items()})
    adapter.export_adapter(str(out))
    return sum(v.nbytes for v in values.values())


def build_per_row(shared: Path, force: bool) -> Path:
    """The per-row variant of a built shared folder, beside it as <name>-rows."""
    final = shared.parent / f"{shared.name}-rows"
    if final.exists() and not force:
        print(f"{final} exists (--force rebuilds it)", file=sys.stderr)
        return final
    if final.exists():
        shutil.rmtree(final)
    with staged(final) as out:
        shutil.copytree(shared, out, dirs_exist_ok=True)
        (out / "ortserve-model.json").unlink()
        stacked = stack_inputs(out / "model.onnx")
        print(f"lora: {stacked} LoRA inputs stacked per row", file=sys.stderr)
        write_manifest(out, final.name, "fp32", f"{shared.name} with per-row LoRA inputs")
    return final


def build(cache: Path, adapters: int, rank: int, force: bool, base: str = TINY_HF) -> Path:
    hf_dir = cache / "hf" / base
    if not (hf_dir / "config.json").is_file():
        raise PrepareError(f"{hf_dir} is not there",
                           "run `make tiny-model` (tiny-llama) or `make model` first")
    lora_name = f"{base}-lora"
    final = cache / "models" / lora_name
    if final.exists() and not force:
        print(f"{final} exists (--force rebuilds it)", file=sys.stderr)
        return final
    if final.exists():
        shutil.rmtree(final)
    names = [f"random{i}" for i in range(adapters)]
    with staged(final) as out:
        work = out / "work"
        (out / "adapters").mkdir(parents=True)
        values: dict[str, dict] = {}
        for i, name in enumerate(names):
            peft_dir = work / "peft" / name
            print(f"lora: making random adapter {name} (rank {rank})", file=sys.stderr)
            make_adapter(hf_dir, peft_dir, ADAPTER_SEED + i, rank)
            built = work / "built" / name
            print(f"lora: building the base with {name} baked in (about 10 s)", file=sys.stderr)
            run_builder_with_adapter(hf_dir, built, out.parent / "builder-cache", peft_dir)
            values[name] = lora_initializers(built / "model.onnx")
            if i == 0:
                shapes = extract_inputs(built / "model.onnx", out)
                for extra in ("genai_config.json",):
                    shutil.copy2(built / extra, out / extra)
            if set(values[name]) != set(shapes):
                raise PrepareError(f"adapter {name}'s LoRA weights differ in names from the base's")
        complete_model_folder(hf_dir, out)
        report = {"base": base, "rank": rank, "target_modules": TARGET_MODULES,
                  "lora_inputs": len(shapes), "adapters": {}}
        print("lora: greedy tokens of transformers + peft (the parity reference)", file=sys.stderr)
        expected = {"prompts": EXPECTED_PROMPTS, "new_tokens": EXPECTED_NEW_TOKENS,
                    "base": expected_tokens(hf_dir, None)}
        for name in names:
            nbytes = write_adapter(values[name], out / "adapters" / f"{name}.onnx_adapter")
            shutil.copytree(work / "peft" / name, out / "adapters" / f"{name}-peft")
            report["adapters"][name] = {"file": f"adapters/{name}.onnx_adapter", "bytes": nbytes}
            expected[name] = expected_tokens(hf_dir, work / "peft" / name)
        (out / EXPECTED_FILE).write_text(json.dumps(expected, indent=1) + "\n")
        (out / "lora.json").write_text(json.dumps(report, indent=1) + "\n")
        shutil.rmtree(work)
        write_manifest(out, lora_name, "fp32",
                       f"{base} with LoRA inputs; {adapters} random peft adapters, rank {rank}, "
                       f"seeds {ADAPTER_SEED}..")
    return final


def run_builder_with_adapter(hf_dir: Path, out: Path, builder_cache: Path, adapter: Path) -> None:
    run_builder(hf_dir, out, "fp32", builder_cache,
                extra_options=[f"adapter_path={adapter}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m model_tools.lora", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--base", choices=BASES, default=TINY_HF, help="the base model")
    parser.add_argument("--adapters", type=int, default=2, help="random adapters to make")
    parser.add_argument("--rank", type=int, default=4, help="LoRA rank of each adapter")
    parser.add_argument("--force", action="store_true", help="rebuild an existing folder")
    parser.add_argument("--per-row", action="store_true",
                        help="also write <name>-rows: every row its own adapter in one run")
    args = parser.parse_args(argv)
    if args.adapters < 1 or args.rank < 1:
        parser.error("--adapters and --rank must be >= 1")
    try:
        final = build(resolve_cache_dir(args.cache_dir), args.adapters, args.rank, args.force,
                      args.base)
    except PrepareError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(final)
    if args.per_row:
        print(build_per_row(final, args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
