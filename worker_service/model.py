"""What the engine needs to know about a model folder, read from the folder itself.

A folder in the layout the onnxruntime-genai model builder writes:
genai_config.json, model.onnx (+ model.onnx.data), tokenizer.json,
tokenizer_config.json, chat_template.jinja. `load_model_spec` reads the geometry
from genai_config.json and checks it against the ONNX graph's declared inputs
and outputs, read from the model file's protobuf header (a few MB even for a
large model, since the weights live in the external data file), so a folder
whose config and graph disagree fails at load, not mid-generation.
"""

from __future__ import annotations

import json
import mmap
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from worker_service.errors import ModelLoadError

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


# --- a minimal reader of the ONNX ModelProto header --------------------------
# Only the graph's input/output declarations and node op types are decoded;
# everything else (initializers included) is skipped by length, so the cost is
# one pass over model.onnx without loading any weights or needing the onnx package.


@dataclass(frozen=True)
class GraphHeader:
    """Declared graph inputs/outputs as name -> (ONNX elem type, dims), and the op types used."""

    inputs: dict[str, tuple[int, list[int | str]]]
    outputs: dict[str, tuple[int, list[int | str]]]
    op_types: frozenset[str]


def read_graph_header(model_file: Path) -> GraphHeader:
    """Decode the graph signature of an ONNX file; ModelLoadError when it is not one."""
    try:
        with open(model_file, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _read_graph_header(memoryview(buf))
    except (ValueError, IndexError, OSError) as exc:
        raise ModelLoadError(f"{model_file} is not a readable ONNX model ({exc}); "
                             "rebuild the folder") from exc


def _read_graph_header(buf: memoryview) -> GraphHeader:
    inputs: dict = {}
    outputs: dict = {}
    op_types: set[str] = set()
    graph = next((v for f, v in _fields(buf, 0, len(buf)) if f == 7), None)  # ModelProto.graph
    if graph is None:
        raise ValueError("no graph in the ModelProto")
    for field, value in _fields(buf, *graph):
        if field == 1:  # GraphProto.node -> NodeProto.op_type (4)
            op_types.update(bytes(buf[a:b]).decode() for f, (a, b) in _fields(buf, *value) if f == 4)
        elif field in (11, 12):  # GraphProto.input / output: ValueInfoProto
            name, elem, dims = _value_info(buf, value)
            (inputs if field == 11 else outputs)[name] = (elem, dims)
    return GraphHeader(inputs, outputs, frozenset(op_types))


def _value_info(buf: memoryview, span: tuple[int, int]) -> tuple[str, int, list[int | str]]:
    name, elem, dims = "", 0, []
    for field, value in _fields(buf, *span):
        if field == 1:
            name = bytes(buf[value[0]:value[1]]).decode()
        elif field == 2:  # TypeProto.tensor_type (1): elem_type (1), shape (2)
            for tf, tensor in _fields(buf, *value):
                if tf != 1:
                    continue
                for ef, ev in _fields(buf, *tensor):
                    if ef == 1:
                        elem = ev
                    elif ef == 2:  # TensorShapeProto.dim (1): dim_value (1) | dim_param (2)
                        for _, dim in _fields(buf, *ev):
                            d: int | str = "?"
                            for df, dv in _fields(buf, *dim):
                                d = dv if df == 1 else bytes(buf[dv[0]:dv[1]]).decode()
                            dims.append(d)
    return name, elem, dims


def _fields(buf: memoryview, start: int, end: int) -> Iterator[tuple[int, object]]:
    """Yield (field number, value) of a protobuf message; value is an int or a (start, end) span."""
    i = start
    while i < end:
        key, i = _varint(buf, i)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, i = _varint(buf, i)
            yield field, value
        elif wire_type == 2:
            length, i = _varint(buf, i)
            yield field, (i, i + length)
            i += length
        elif wire_type == 1:
            i += 8
        elif wire_type == 5:
            i += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire_type} at byte {i}")
    if i != end:
        raise ValueError("truncated protobuf message")


def _varint(buf: memoryview, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = buf[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, i
        shift += 7
