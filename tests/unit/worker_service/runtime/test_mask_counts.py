"""What a graph reads of its attention mask decides how a decode step writes it
(runtime/mask_counts.py), and a device copies only the counts column (decode_step.py)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.models import prepared_model_dir
from worker_service.runtime.decode_step import _Buffer
from worker_service.runtime.device_memory import CUDA_MEMCPY_HOST_TO_DEVICE, column_copier
from worker_service.runtime.mask_counts import model_reads_only_counts, reads_only_counts


def _graph(*nodes, initializers=()) -> onnx.ModelProto:
    mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "t"])
    out = helper.make_tensor_value_info("out", TensorProto.INT64, None)
    return helper.make_model(helper.make_graph(list(nodes), "g", [mask], [out],
                                               initializer=list(initializers)))


AXIS_1 = helper.make_tensor("axis1", TensorProto.INT64, [1], [1])


def test_the_builder_graphs_read_the_mask_only_as_row_sums_and_width():
    ok, why = model_reads_only_counts(prepared_model_dir("tiny-llama") / "model.onnx",
                                      "attention_mask")
    assert ok, why


def test_any_other_reader_keeps_the_rows_of_ones():
    summed = _graph(helper.make_node("ReduceSum", ["attention_mask", "axis1"], ["out"]),
                    helper.make_node("Shape", ["attention_mask"], ["shape"]),
                    initializers=[AXIS_1])
    assert reads_only_counts(summed, "attention_mask")[0]
    # Position ids from a running sum of the mask: the ones' places matter.
    cumsum = _graph(helper.make_node("CumSum", ["attention_mask", "axis1"], ["out"]),
                    initializers=[AXIS_1])
    assert reads_only_counts(cumsum, "attention_mask") == (
        False, "CumSum '' reads attention_mask")
    axis0 = helper.make_tensor("axis0", TensorProto.INT64, [1], [0])
    over_rows = _graph(helper.make_node("ReduceSum", ["attention_mask", "axis0"], ["out"]),
                       initializers=[axis0])
    assert not reads_only_counts(over_rows, "attention_mask")[0]
    assert not reads_only_counts(_graph(), "attention_mask")[0]  # nothing reads it


class _DeviceValue:
    """A device OrtValue's stand-in: what was copied into it, and how."""

    def __init__(self) -> None:
        self.full_copies = 0

    def update_inplace(self, host: np.ndarray) -> None:
        self.full_copies += 1

    def data_ptr(self) -> int:
        return 0xD000


def test_a_device_mask_is_copied_whole_once_then_one_strided_column_per_step():
    buffer = _Buffer((4, 16), np.dtype(np.int64), "cpu", 0)
    buffer.on_host, buffer.synced, buffer.value = False, False, _DeviceValue()
    calls = []

    def copy2d(*args):
        calls.append(args)
        return 0
    copy_column = column_copier(copy2d, lambda device_id: None, 3)
    buffer.host[:, 0] = [5, 9, 1, 1]
    buffer.upload_first_column(copy_column)  # the device holds garbage: the whole array
    assert buffer.value.full_copies == 1 and calls == []
    buffer.upload_first_column(copy_column)
    # dst, dpitch, src, spitch, width (one int64), height (rows), host to device
    assert calls == [(0xD000, 16 * 8, buffer.host.ctypes.data, 16 * 8, 8, 4,
                      CUDA_MEMCPY_HOST_TO_DEVICE)]
    assert buffer.value.full_copies == 1
    failing = column_copier(lambda *args: 700, lambda device_id: None, 3)
    with pytest.raises(RuntimeError, match=r"4-row mask column to GPU 3 failed \(cudaError 700"):
        buffer.upload_first_column(failing)
    # No CUDA runtime to copy a column with: the whole array each time.
    buffer.upload_first_column(None)
    assert buffer.value.full_copies == 2
