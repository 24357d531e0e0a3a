"""The graph signature of a model folder, read from model.onnx without the weights."""

from __future__ import annotations

import pytest

from tests.models import prepared_model_dir
from worker_service.core.errors import ModelLoadError
from worker_service.runtime.model import read_graph_header


def test_header_of_the_tiny_model_lists_its_inputs_outputs_and_ops():
    header = read_graph_header(prepared_model_dir("tiny-llama") / "model.onnx")
    assert header.inputs["input_ids"] == (7, ["batch_size", "sequence_length"])  # int64
    assert sorted(n for n in header.inputs if n.startswith("past_key_values.")) == [
        "past_key_values.0.key", "past_key_values.0.value",
        "past_key_values.1.key", "past_key_values.1.value"]
    elem, dims = header.inputs["past_key_values.0.key"]
    assert elem == 1 and len(dims) == 4 and dims[1] == 2  # float32, 2 KV heads
    assert header.outputs["logits"][1][2] == 49152
    assert "GroupQueryAttention" in header.op_types


def test_header_is_read_without_the_weights(tmp_path):
    """The graph file alone, its external weights (model.onnx.data) not beside it, gives the
    same header: the read never touches the weights (was: a 0.5 s bound)."""
    model_file = prepared_model_dir("tiny-llama") / "model.onnx"
    assert (model_file.parent / "model.onnx.data").exists()  # the weights are external
    alone = tmp_path / "model.onnx"
    alone.write_bytes(model_file.read_bytes())
    assert read_graph_header(alone) == read_graph_header(model_file)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_file_that_is_not_an_onnx_model_is_a_load_error_naming_it(tmp_path, damage):
    original = (prepared_model_dir("tiny-llama") / "model.onnx").read_bytes()
    content = {"garbage": b"\xff\xfenot a model" * 100, "truncated": original[: len(original) // 2],
               "empty": b""}[damage]
    bad = tmp_path / "model.onnx"
    bad.write_bytes(content)
    with pytest.raises(ModelLoadError, match="is not a readable ONNX model"):
        read_graph_header(bad)
