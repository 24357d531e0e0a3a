"""The CUDA session rule: which nodes must run on the device, and the session's options.

The node lists are recorded from ORT's profile (the genai builder's `-e cuda` SmolLM2
folder placed 308 of 310 nodes on CUDA; the two left on the CPU were its attention
mask's shape nodes), so the rule is tested without a GPU.
"""

from __future__ import annotations

from pathlib import Path

import onnxruntime as ort
import pytest

from worker_service.core.errors import DeviceUnavailable
from worker_service.runtime import device
from worker_service.runtime.model import load_model_spec
from worker_service.runtime.node_placement import PlacedNode, Placement, nodes_from_profile

CUDA, CPU = device.CUDA, device.CPU


def genai_cuda_folder_nodes() -> list[PlacedNode]:
    """The builder's fp16 -e cuda placement: everything on CUDA but the mask's shape nodes."""
    on_cuda = [PlacedNode(f"/model/layers.{i}/attn/GroupQueryAttention", "GroupQueryAttention",
                          CUDA, ("float16", "int32")) for i in range(30)]
    on_cuda += [PlacedNode(f"/model/layers.{i}/attn/qkv_proj/MatMul", "MatMul", CUDA,
                           ("float16",)) for i in range(30)]
    on_cuda += [PlacedNode("/model/attn_mask_reformat/attn_mask_subgraph/ReduceSum", "ReduceSum",
                           CUDA, ("int64",)),
                PlacedNode("/lm_head/MatMul", "MatMul", CUDA, ("float16",))]
    on_cpu = [PlacedNode("/model/attn_mask_reformat/attn_mask_subgraph/Gather", "Gather", CPU,
                         ("int64", "int64", "int64")),
              PlacedNode("/model/attn_mask_reformat/attn_mask_subgraph/Gather/Cast", "Cast", CPU,
                         ("int64", "int32"))]
    return on_cuda + on_cpu


def test_the_builder_s_cuda_folder_passes_with_its_shape_nodes_reported():
    placed = Placement(CUDA, tuple(genai_cuda_folder_nodes()))
    assert placed.ok and not placed.heavy_off_device
    assert placed.nodes_by_provider == {CUDA: 62, CPU: 2}
    assert placed.off_device_report() == [
        "Gather /model/attn_mask_reformat/attn_mask_subgraph/Gather (int64) on "
        "CPUExecutionProvider",
        "Cast /model/attn_mask_reformat/attn_mask_subgraph/Gather/Cast (int32/int64) on "
        "CPUExecutionProvider"]


@pytest.mark.parametrize("node", [
    # fp32 GQA has no CUDA kernel: ORT falls back, copying KV every step.
    PlacedNode("/model/layers.0/attn/GroupQueryAttention", "GroupQueryAttention", CPU,
               ("float", "int32")),
    PlacedNode("/model/layers.3/mlp/down_proj/MatMulNBits", "MatMulNBits", CPU, ()),
    PlacedNode("/model/layers.0/input_layernorm/LayerNorm", "SimplifiedLayerNormalization", CPU,
               ("float16",)),
    PlacedNode("/lm_head/MatMul", "MatMul", CPU, ("float16",)),
    # Not a heavy op type, but over float activations (the embedding lookup).
    PlacedNode("/model/embed_tokens/Gather", "Gather", CPU, ("float16", "int64")),
])
def test_a_heavy_node_on_the_cpu_provider_is_refused_naming_it(node):
    placed = Placement(CUDA, (*genai_cuda_folder_nodes(), node))
    assert not placed.ok and placed.heavy_off_device == (node,)
    with pytest.raises(DeviceUnavailable) as info:
        device._refuse_bad_placement(_FakeSpec(), placed)
    assert node.name in str(info.value) and node.op_type in str(info.value)
    assert "--device cpu" in str(info.value)


def test_an_unknown_placement_refuses_a_cuda_start():
    with pytest.raises(DeviceUnavailable, match="could not be read"):
        device._refuse_bad_placement(_FakeSpec(), Placement(CUDA, ()))


def test_nodes_are_read_from_ort_s_profile_with_their_element_types():
    events = [
        {"cat": "Session", "name": "model_run", "args": {}},
        {"cat": "Node", "name": "/model/embed_tokens/Gather_kernel_time",
         "args": {"provider": CPU, "op_name": "Gather", "node_index": "7",
                  "input_type_shape": [{"float": [49152, 64]}, {"int64": [1, 1]}],
                  "output_type_shape": [{"float": [1, 1, 64]}]}},
        {"cat": "Node", "name": "/model/attn_mask_reformat/attn_mask_subgraph/Gather_kernel_time",
         "args": {"provider": CPU, "op_name": "Gather", "node_index": "4",
                  "input_type_shape": [{"int64": [2]}, {"int64": []}],
                  "output_type_shape": [{"int64": []}]}},
        {"cat": "Node", "name": "/model/embed_tokens/Gather_fence_before",
         "args": {"op_name": "Gather"}},
    ]
    embed, shape = nodes_from_profile(events)
    assert (embed.name, embed.op_type, embed.heavy) == ("/model/embed_tokens/Gather", "Gather", True)
    assert (shape.tensor_types, shape.heavy) == (("int64", "int64", "int64"), False)


def test_a_missing_cuda_library_is_named():
    said = ("Failed to load library .../libonnxruntime_providers_cuda.so with error: "
            "libcublasLt.so.13: cannot open shared object file: No such file or directory")
    assert device.missing_libraries(said) == ["libcublasLt.so.13"]
    assert device.missing_libraries("libcudnn.so.9: cannot open shared object file") == [
        "libcudnn.so.9"]


def _fallback_disabled(options: ort.SessionOptions) -> bool:
    try:
        return options.get_session_config_entry("session.disable_cpu_ep_fallback") == "1"
    except RuntimeError:  # not set
        return False


def test_a_cuda_session_never_lists_the_cpu_provider_with_cpu_fallback_disabled(tiny_dir,
                                                                                 monkeypatch):
    """ORT (1.31.1) refuses that combination outright ("Conflicting session configuration"),
    so a --device cuda worker could not start on any GPU."""
    made: list[tuple[ort.SessionOptions, list]] = []
    real = ort.InferenceSession

    def recording(model, options=None, providers=None, **kw):
        made.append((options, list(providers or [])))
        return real(model, options, providers=providers, **kw)

    monkeypatch.setattr(device.ort, "InferenceSession", recording)
    spec = load_model_spec(tiny_dir)
    try:
        device.create_session(spec, "cuda", 0, 1)
    except DeviceUnavailable as exc:  # no usable GPU here: refused with cause and remedy
        assert "Conflicting session configuration" not in str(exc)
        assert "--device cpu" in str(exc)
    assert made
    for options, providers in made:
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        assert not (CPU in names and _fallback_disabled(options)), names


def test_the_refused_config_entry_is_refused_by_name(tiny_dir):
    with pytest.raises(Exception, match="disable_cpu_ep_fallback"):
        device.create_session(load_model_spec(tiny_dir), "cpu", 0, 1,
                              config_entries=(("session.disable_cpu_ep_fallback", "1"),))


class _FakeSpec:
    model_file = Path("/models/smollm2/model.onnx")


def test_the_allowed_shape_nodes_reach_ortserve_info_through_the_scheduler(capsys):
    import argparse
    import time

    from ortserve_client.cli import cmd_info

    from ortserve.v1 import scheduler_pb2
    from scheduler_service.convert import budget_to_pb, geometry_from_pb
    from scheduler_service.ledger.types import WorkerSnapshot

    off = Placement(CUDA, tuple(genai_cuda_folder_nodes())).off_device_report()
    geometry = geometry_from_pb(scheduler_pb2.RegisterWorkerRequest(
        worker_id="w1", address="a:1", model="m", context_length=8, bytes_per_token=4,
        capacity_bytes=64, device="cuda:0", execution_provider=CUDA, nodes_off_device=off))
    assert geometry.nodes_off_device == tuple(off)
    snapshot = WorkerSnapshot(geometry=geometry, reserved_bytes=0, heartbeat_age_s=0.0, leases=())
    budget = budget_to_pb([snapshot], include_leases=False, now=time.monotonic())

    class _Client:
        address = "s:1"

        def budget(self, include_leases):
            return budget

    assert cmd_info(_Client(), argparse.Namespace(json=False)) == 0
    out = capsys.readouterr().out
    assert "2 shape node(s) off the device, allowed" in out and "attn_mask_subgraph/Gather" in out
