"""What a builder graph reads of its attention mask: each row's sum and the mask's width.

Why (issue 50, MODEL_NOTES.md): the onnxruntime-genai builder's GQA graphs feed the
mask only to `ReduceSum(axis 1)` (each row's length: seqlens_k = sum - 1) and `Shape`
(the total length: its width); GroupQueryAttention never sees the mask itself. A
decode bucket's mask is a fixed [bucket, row width] buffer, and writing a right-padded
row of ones (bucket x width int64 on the host, the whole buffer copied to the device
each step) only to have the graph count them is most of a step's host traffic at
full width: 2 MiB at 32 rows of 8,192.

Where the graph reads nothing else, a row's count can stand in its first column and
zeros in the rest: the same sums and the same width, so the same seqlens_k and total
length reach every GQA node, and the same floats come out (bit for bit; a test says
so). A step then writes one int64 per row, and a device copies one strided column
(decode_step.py). Any other reader of the mask (a CumSum for position ids, an
attention bias) and the buckets keep the rows of ones.

Pure graph code on the `onnx` protobufs: no session; the graph is read without its
weights.
"""

from __future__ import annotations

import functools
from pathlib import Path

import onnx
from onnx import numpy_helper


def _constant_ints(model: onnx.ModelProto, name: str) -> list[int] | None:
    """The int values of an initializer or Constant node output, or None."""
    for init in model.graph.initializer:
        if init.name == name:
            return [int(v) for v in numpy_helper.to_array(init).reshape(-1)]
    for node in model.graph.node:
        if node.op_type == "Constant" and name in node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    return [int(v) for v in numpy_helper.to_array(attr.t).reshape(-1)]
    return None


def reads_only_counts(model: onnx.ModelProto, mask_name: str) -> tuple[bool, str]:
    """Whether every reader of input `mask_name` is a row sum over axis 1 or its shape;
    (answer, why) for the log."""
    readers = [n for n in model.graph.node if mask_name in n.input]
    if not readers:
        return False, f"nothing reads {mask_name}"
    for node in readers:
        if node.op_type == "Shape":
            continue
        if node.op_type != "ReduceSum":
            return False, f"{node.op_type} {node.name!r} reads {mask_name}"
        axes = None
        if len(node.input) > 1 and node.input[1]:
            axes = _constant_ints(model, node.input[1])
        for attr in node.attribute:  # opset < 13 gives the axes as an attribute
            if attr.name == "axes":
                axes = list(attr.ints)
        if axes not in ([1], [-1]):
            return False, f"ReduceSum {node.name!r} over axes {axes}, not each row"
    return True, f"{mask_name} read only as row sums and its width"


@functools.lru_cache(maxsize=8)
def model_reads_only_counts(model_file: Path, mask_name: str) -> tuple[bool, str]:
    """`reads_only_counts` of the model file's graph (weights not read), once per file."""
    try:
        model = onnx.load(str(model_file), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - an unreadable graph keeps the rows of ones
        return False, f"graph not read: {type(exc).__name__}: {exc}"
    return reads_only_counts(model, mask_name)
