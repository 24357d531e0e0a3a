"""The LM head only where logits are read: a graph edit made as the model loads.

A builder graph computes logits at every position it runs, [batch, sequence,
vocab]; the engine reads one position per row (a prompt chunk's last token,
a decode step's one token). On SmolLM2-135M the LM head (576 x 49,152) is
about a fifth of a token's weights, so a prompt of n tokens ran n - 1 rows of
it, and wrote n x 49,152 floats, for nothing.

The edit gathers the final norm's output at the read positions before the
LM head: a new int64 input `logits_positions` [batch, positions, 1] (row b's
positions within this run; one per row, except a speculative verification,
which reads every position it runs) feeds GatherND(batch_dims=1), and logits
become [batch, positions, vocab]. The model folder is left as it is (onnxruntime-genai reads the same
folder); the edited graph is handed to ORT as bytes, its weights read from
the folder (ORT's external-initializers folder option).

On CUDA the same edit appends the greedy choice to the graph: `next_ids` int64
[batch, positions] = ArgMax over the vocabulary of the logits (the first
maximum, numpy's argmax's choice), so a greedy row's token leaves the device as
one int64 and its logits never have to (DESIGN.md, "On the GPU": numpy has no
SIMD argmax for half floats, ~0.8 ms per 49,152-entry row). fp16 logits are
cast to float32 first (exact), so the choice is the host's float32 one. The
logits stay an output: sampled and constrained rows read them. Not on the CPU:
ORT's CPU ArgMax scans a 49,152-entry float32 row in ~0.5 ms where numpy's
SIMD argmax takes ~4 us (measured here, one thread); the logits are host
memory there anyway, so the runner takes numpy's float32 argmax instead
(ort_rows.py, the same ids).

Pure graph code on the `onnx` protobufs: no session, no I/O but the read.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import TensorProto, helper

LOGITS_POSITIONS = "logits_positions"
NEXT_IDS = "next_ids"  # the greedy choice per read position, int64 [batch, positions]
POSITIONS_DIM = "logits_positions_per_row"  # the symbolic dimension: positions read per row
# An ORT session config key (onnxruntime_session_options_config_keys.h): where a model
# loaded from bytes finds its external initializers.
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"
# Nodes that may stand between the LM head's product and the graph's logits output.
_PASS_THROUGH = {"Cast", "Identity"}
_LM_HEADS = {"MatMul", "MatMulNBits", "Gemm"}


def edited_graph(model_file: Path, logits_name: str, next_ids: bool = False
                 ) -> tuple[bytes | None, Path | None, str]:
    """The model's graph with logits at the gathered positions (and, with `next_ids`, the
    greedy choice as an output), serialized, the folder ORT reads its weights from, and a
    note; (None, None, why) when the graph is not one this edit knows or its weights are
    not in one place (the engine runs it unedited)."""
    model = onnx.load(str(model_file), load_external_data=False)
    folder, why = _weights_folder(model, model_file.parent)
    if folder is None:
        return None, None, why
    why = gather_logits_rows(model, logits_name)
    if why:
        return None, None, why
    if not next_ids:
        return model.SerializeToString(), folder, f"LM head at {LOGITS_POSITIONS} only"
    append_next_ids(model, logits_name)
    return model.SerializeToString(), folder, f"LM head at {LOGITS_POSITIONS} only, {NEXT_IDS}"


def _weights_folder(model: onnx.ModelProto, model_dir: Path) -> tuple[Path | None, str]:
    """The folder holding the graph's external data files, symlinks resolved.

    NOTE: ORT refuses an external data path that resolves outside the folder it was
    given ("escapes model directory"), and it resolves symlinks: a folder of symlinks
    (the bench's variants) must be named by where the files really are.
    """
    locations = {entry.value for tensor in model.graph.initializer
                 for entry in tensor.external_data if entry.key == "location"}
    if not locations:
        return model_dir.resolve(), ""
    real = {(model_dir / name).resolve() for name in locations}
    folders = {path.parent for path in real}
    if len(folders) != 1 or any((model_dir / name).resolve().name != Path(name).name
                                for name in locations):
        return None, "the graph's weights are not files of one folder under their own names"
    return folders.pop(), ""


def gather_logits_rows(model: onnx.ModelProto, logits_name: str) -> str:
    """Edit `model` in place (see the module docstring); '' when done, else why not (and
    `model` is untouched)."""
    graph = model.graph
    if any(i.name == LOGITS_POSITIONS for i in graph.input):
        return f"the graph already has an input {LOGITS_POSITIONS!r}"
    producers = {out: node for node in graph.node for out in node.output}
    head = producers.get(logits_name)
    while head is not None and head.op_type in _PASS_THROUGH:
        head = producers.get(head.input[0])
    if head is None or head.op_type not in _LM_HEADS:
        return f"no MatMul produces {logits_name!r}"
    hidden = head.input[0]
    if sum(hidden in node.input for node in graph.node) != 1 or hidden in {
            o.name for o in graph.output}:
        return f"the LM head's input {hidden!r} has other readers"
    output = next((o for o in graph.output if o.name == logits_name), None)
    if output is None or len(output.type.tensor_type.shape.dim) != 3:
        return f"{logits_name!r} is not a [batch, sequence, vocab] graph output"
    if not any(op.domain in ("", "ai.onnx") and op.version >= 12 for op in model.opset_import):
        return "the graph's ONNX opset is older than 12 (GatherND's batch_dims)"

    gathered = f"{hidden}/{LOGITS_POSITIONS}"
    graph.input.append(helper.make_tensor_value_info(
        LOGITS_POSITIONS, TensorProto.INT64, ["batch_size", POSITIONS_DIM, 1]))
    gather = helper.make_node("GatherND", [hidden, LOGITS_POSITIONS], [gathered],
                              name=f"/{LOGITS_POSITIONS}/GatherND", batch_dims=1)
    # Topological order: right before the LM head, after everything `hidden` needs.
    nodes = list(graph.node)
    at = nodes.index(head)
    head.input[0] = gathered
    graph.node.insert(at, gather)
    dim = output.type.tensor_type.shape.dim[1]
    dim.Clear()
    dim.dim_param = POSITIONS_DIM
    return ""


def append_next_ids(model: onnx.ModelProto, logits_name: str) -> None:
    """Add the output `next_ids` [batch, positions] int64: the first maximum of `logits_name`
    over its last axis (float32, a cast first where the logits are half floats)."""
    graph = model.graph
    output = next(o for o in graph.output if o.name == logits_name)
    source = logits_name
    if output.type.tensor_type.elem_type != TensorProto.FLOAT:
        source = f"{logits_name}/{NEXT_IDS}/float"
        graph.node.append(helper.make_node("Cast", [logits_name], [source], to=TensorProto.FLOAT,
                                           name=f"/{NEXT_IDS}/Cast"))
    # select_last_index=0: the first maximum, as numpy's argmax and the host sampler choose.
    graph.node.append(helper.make_node("ArgMax", [source], [NEXT_IDS], axis=-1, keepdims=0,
                                       select_last_index=0, name=f"/{NEXT_IDS}/ArgMax"))
    dims = output.type.tensor_type.shape.dim
    graph.output.append(helper.make_tensor_value_info(
        NEXT_IDS, TensorProto.INT64, [d.dim_param or d.dim_value for d in dims[:2]]))
