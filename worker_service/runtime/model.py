"""What the engine needs to know about a model folder, read from the folder itself.

A folder in the layout the onnxruntime-genai model builder writes:
genai_config.json, model.onnx (+ model.onnx.data), tokenizer.json,
tokenizer_config.json, chat_template.jinja. `load_model_spec` reads the geometry
from genai_config.json and checks it against the ONNX graph's declared inputs
and outputs, read from model.onnx by the onnx package (a few MB even for a
large model, since the weights live in the external data file), so a folder
whose config and graph disagree fails at load, not mid-generation.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx

from worker_service.core.errors import ModelLoadError

# ONNX TensorProto.DataType values the KV cache may have, and their numpy types.
_ONNX_KV_DTYPES = {1: np.dtype(np.float32), 10: np.dtype(np.float16)}
_ONNX_TYPE_NAMES = {1: "float32", 10: "float16", 16: "bfloat16", 7: "int64", 6: "int32"}
_ONNX_INT64 = 7

# The static shared KV cache relies on this op reading past and writing present
# in one buffer (past_present_share_buffer); other attention ops copy instead.
_SHARED_KV_ATTENTION_OP = "GroupQueryAttention"


@dataclass(frozen=True)
class ModelSpec:
    """Geometry and I/O names of one decoder-only model folder."""

    name: str  # the folder's name
    model_dir: Path
    num_layers: int
    kv_heads: int
    head_dim: int
    num_heads: int
    kv_dtype: np.dtype  # the graph's past_key_values input element type
    context_length: int  # genai_config model.context_length
    eos_token_ids: tuple[int, ...]
    vocab_size: int
    # Format strings with an {i} field for the layer index.
    past_key_name: str
    past_value_name: str
    present_key_name: str
    present_value_name: str
    model_file: Path = Path("model.onnx")  # absolute after load_model_spec
    input_ids_name: str = "input_ids"
    attention_mask_name: str = "attention_mask"
    position_ids_name: str | None = None  # set when the graph takes position ids
    logits_name: str = "logits"

    @property
    def bytes_per_token(self) -> int:
        """KV bytes one token holds: 2 (key, value) x layers x kv_heads x head_dim x itemsize."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * self.kv_dtype.itemsize


def load_model_spec(model_dir: str | Path) -> ModelSpec:
    """Read a builder-written model folder; raise ModelLoadError naming what is wrong."""
    model_dir = Path(model_dir).expanduser().resolve()
    config_path = model_dir / "genai_config.json"
    if not config_path.is_file():
        raise ModelLoadError(
            f"{config_path} not found: a model folder needs the onnxruntime-genai builder layout "
            "(genai_config.json, model.onnx, tokenizer.json); prepare it with `make model`"
        )
    try:
        config = json.loads(config_path.read_text())
        model = config["model"]
        decoder = model["decoder"]
        inputs = decoder.get("inputs", {})
        outputs = decoder.get("outputs", {})
        num_layers = int(decoder["num_hidden_layers"])
        num_heads = int(decoder["num_attention_heads"])
        kv_heads = int(decoder.get("num_key_value_heads", num_heads))
        head_dim = int(decoder.get("head_size") or int(decoder["hidden_size"]) // num_heads)
        context_length = int(model["context_length"])
        vocab_size = int(model["vocab_size"])
        eos = model["eos_token_id"]
        eos_token_ids = tuple(int(t) for t in (eos if isinstance(eos, list) else [eos]))
        model_file = model_dir / decoder.get("filename", "model.onnx")
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(
            f"{config_path} lacks or mangles a field the engine needs ({type(exc).__name__}: "
            f"{exc}); rebuild the folder with the onnxruntime-genai model builder"
        ) from exc

    def name_format(table: dict, key: str, default: str) -> str:
        # genai_config writes printf-style names ("past_key_values.%d.key").
        return table.get(key, default).replace("%d", "{i}")

    spec = ModelSpec(
        name=model_dir.name,
        model_dir=model_dir,
        num_layers=num_layers,
        kv_heads=kv_heads,
        head_dim=head_dim,
        num_heads=num_heads,
        kv_dtype=np.dtype(np.float32),  # replaced from the graph below
        context_length=context_length,
        eos_token_ids=eos_token_ids,
        vocab_size=vocab_size,
        past_key_name=name_format(inputs, "past_key_names", "past_key_values.%d.key"),
        past_value_name=name_format(inputs, "past_value_names", "past_key_values.%d.value"),
        present_key_name=name_format(outputs, "present_key_names", "present.%d.key"),
        present_value_name=name_format(outputs, "present_value_names", "present.%d.value"),
        model_file=model_file,
        input_ids_name=inputs.get("input_ids", "input_ids"),
        attention_mask_name=inputs.get("attention_mask", "attention_mask"),
        logits_name=outputs.get("logits", "logits"),
    )
    return _checked_against_graph(spec)


def _checked_against_graph(spec: ModelSpec) -> ModelSpec:
    """Compare the config with the graph header; return the spec with graph-derived fields."""
    if not spec.model_file.is_file():
        raise ModelLoadError(f"{spec.model_file} not found (named by genai_config.json); "
                             "rebuild the model folder")
    graph = read_graph_header(spec.model_file)
    where = f"{spec.model_file.name} of {spec.name}"

    def need(table: dict, name: str, kind: str) -> tuple[int, list]:
        if name not in table:
            raise ModelLoadError(f"the graph {where} has no {kind} {name!r} (it has "
                                 f"{sorted(table)[:8]}...); the engine serves decoder graphs "
                                 "from the onnxruntime-genai builder")
        return table[name]

    for name in (spec.input_ids_name, spec.attention_mask_name):
        elem, _ = need(graph.inputs, name, "input")
        if elem != _ONNX_INT64:
            raise ModelLoadError(f"{where}: input {name!r} is {_ONNX_TYPE_NAMES.get(elem, elem)}, "
                                 "the engine feeds int64")
    key_pattern = re.compile(re.escape(spec.past_key_name).replace(r"\{i\}", r"\d+"))
    past_names = [n for n in graph.inputs if key_pattern.fullmatch(n)]
    if len(past_names) != spec.num_layers:
        raise ModelLoadError(f"{where}: genai_config.json says {spec.num_layers} layers but the "
                             f"graph has {len(past_names)} past key inputs; rebuild the folder")
    kv_elem, kv_dims = need(graph.inputs, spec.past_key_name.format(i=0), "input")
    if kv_elem not in _ONNX_KV_DTYPES:
        raise ModelLoadError(f"{where}: KV cache type {_ONNX_TYPE_NAMES.get(kv_elem, kv_elem)} is "
                             "not supported (float32 or float16); rebuild with -p fp32/fp16/int4")
    for i in range(spec.num_layers):
        for fmt, table, kind in ((spec.past_key_name, graph.inputs, "input"),
                                 (spec.past_value_name, graph.inputs, "input"),
                                 (spec.present_key_name, graph.outputs, "output"),
                                 (spec.present_value_name, graph.outputs, "output")):
            elem, dims = need(table, fmt.format(i=i), kind)
            if elem != kv_elem or len(dims) != 4:
                raise ModelLoadError(f"{where}: {fmt.format(i=i)} is not a 4-D "
                                     f"{_ONNX_TYPE_NAMES[kv_elem]} tensor like layer 0's")
    for axis, expected, label in ((1, spec.kv_heads, "num_key_value_heads"),
                                  (3, spec.head_dim, "head_size")):
        if isinstance(kv_dims[axis], int) and kv_dims[axis] != expected:
            raise ModelLoadError(f"{where}: past key axis {axis} is {kv_dims[axis]} but "
                                 f"genai_config.json {label} is {expected}; rebuild the folder")
    _, logits_dims = need(graph.outputs, spec.logits_name, "output")
    if len(logits_dims) == 3 and isinstance(logits_dims[2], int) and logits_dims[2] != spec.vocab_size:
        raise ModelLoadError(f"{where}: logits have {logits_dims[2]} entries but genai_config.json "
                             f"vocab_size is {spec.vocab_size}")
    if _SHARED_KV_ATTENTION_OP not in graph.op_types:
        raise ModelLoadError(
            f"{where} has no {_SHARED_KV_ATTENTION_OP} node: the engine's static KV cache binds "
            "past and present to one buffer, which only that op supports; rebuild with the "
            "onnxruntime-genai builder (it emits GroupQueryAttention for llama-family models)")
    position_ids = "position_ids" if "position_ids" in graph.inputs else None
    return replace(spec, kv_dtype=_ONNX_KV_DTYPES[kv_elem], position_ids_name=position_ids)


# --- the graph's signature, read by the onnx package ---------------------------
# Only model.onnx is parsed: the weights stay in the external data file, unread, so
# this takes milliseconds even for a large model.


@dataclass(frozen=True)
class GraphHeader:
    """Declared graph inputs/outputs as name -> (ONNX elem type, dims), and the op types used."""

    inputs: dict[str, tuple[int, list[int | str]]]
    outputs: dict[str, tuple[int, list[int | str]]]
    op_types: frozenset[str]


def read_graph_header(model_file: Path) -> GraphHeader:
    """Read the graph signature of an ONNX file; ModelLoadError when it is not one."""
    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except Exception as exc:  # DecodeError, OSError, onnx's own errors: all mean "not usable"
        raise ModelLoadError(f"{model_file} is not a readable ONNX model "
                             f"({type(exc).__name__}: {exc}); rebuild the folder") from exc
    graph = model.graph
    if not graph.input:
        raise ModelLoadError(f"{model_file} is not a readable ONNX model (no graph inputs); "
                             "rebuild the folder")
    return GraphHeader(inputs={v.name: _value_info(v) for v in graph.input},
                       outputs={v.name: _value_info(v) for v in graph.output},
                       op_types=frozenset(node.op_type for node in graph.node))


def _value_info(value: onnx.ValueInfoProto) -> tuple[int, list[int | str]]:
    tensor = value.type.tensor_type
    dims: list[int | str] = []
    for dim in tensor.shape.dim:
        kind = dim.WhichOneof("value")
        dims.append(dim.dim_value if kind == "dim_value" else
                    dim.dim_param if kind == "dim_param" else "?")
    return tensor.elem_type, dims
