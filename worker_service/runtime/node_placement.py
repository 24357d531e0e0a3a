"""Where ORT placed a session's nodes, and whether that placement may serve on a device.

ORT's CUDA provider leaves small shape computations (a Cast of a shape, a
Gather of one dimension, the seqlens arithmetic over the attention mask) on
the CPU provider on purpose: they produce integers the next kernels read as
shapes, so running them on the host costs nothing per step. The builder's own
`-e cuda` folders place 2 of ~310 nodes that way. What must run on the device
is what would cost per step if it did not: attention, the matmuls, the norms,
the LM head, anything that reads or writes floating-point activations or KV
(which is every node whose tensors are float). So the rule is by kind and by
data, not "every node on CUDA":

- a node is HEAVY when its op type is one of `HEAVY_OP_TYPES`, or when any
  input or output it ran with is a floating-point tensor (activations, KV,
  logits, weights);
- a heavy node off the device refuses the session, naming those nodes; the
  others off it are allowed and reported.

Pure logic over `PlacedNode` lists, so the rule is tested with recorded lists
on machines without a GPU; `nodes_from_profile` reads them from ORT's profile.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass

# Op types that cost per step wherever their tensors' types say otherwise.
HEAVY_OP_TYPES = frozenset({
    "Attention", "GroupQueryAttention", "MultiHeadAttention", "PagedAttention",
    "SparseAttention", "PackedAttention", "RotaryEmbedding",
    "MatMul", "MatMulNBits", "MatMulInteger", "MatMulIntegerToFloat", "FusedMatMul", "Gemm",
    "QMoE", "MoE", "GatherBlockQuantized",
    "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "RMSNormalization",
    "Softmax", "FastGelu", "Gelu", "BiasGelu", "QuickGelu", "Sigmoid", "Silu",
})

_FLOAT_TYPES = frozenset({"float", "float16", "bfloat16", "double", "float8e4m3fn",
                          "float8e5m2"})


@dataclass(frozen=True)
class PlacedNode:
    """One node as ORT ran it: its name, op type, provider, and the element types of the
    tensors it read and wrote (e.g. ("int64",) for a shape node)."""

    name: str
    op_type: str
    provider: str
    tensor_types: tuple[str, ...] = ()

    @property
    def heavy(self) -> bool:
        return self.op_type in HEAVY_OP_TYPES or any(t in _FLOAT_TYPES for t in self.tensor_types)

    def describe(self) -> str:
        types = "/".join(sorted(set(self.tensor_types))) or "?"
        return f"{self.op_type} {self.name} ({types}) on {self.provider}"


@dataclass(frozen=True)
class Placement:
    """A session's placement judged against the provider it was asked to run on."""

    provider: str  # the provider the device asks for
    nodes: tuple[PlacedNode, ...]

    @property
    def nodes_by_provider(self) -> dict[str, int]:
        return dict(collections.Counter(n.provider for n in self.nodes))

    @property
    def off_device(self) -> tuple[PlacedNode, ...]:
        """Nodes on another provider (allowed when none of them is heavy)."""
        return tuple(n for n in self.nodes if n.provider != self.provider)

    @property
    def heavy_off_device(self) -> tuple[PlacedNode, ...]:
        return tuple(n for n in self.off_device if n.heavy)

    @property
    def known(self) -> bool:
        return bool(self.nodes)

    @property
    def ok(self) -> bool:
        """Known, and every heavy node on the device."""
        return self.known and not self.heavy_off_device

    def off_device_report(self) -> list[str]:
        """One line per node off the device, for Info and the start log."""
        return [n.describe() for n in self.off_device]


def nodes_from_profile(events: Iterable[dict]) -> list[PlacedNode]:
    """The nodes of ORT's profile (a chrome-trace event list): one entry per node, with
    the element types of its inputs and outputs as ORT recorded them."""
    nodes: dict[str, PlacedNode] = {}
    for event in events:
        args = event.get("args", {})
        if event.get("cat") != "Node" or "provider" not in args:
            continue
        name = str(event.get("name", "?")).removesuffix("_kernel_time")
        key = str(args.get("node_index", name))
        types: list[str] = []
        for shapes in (args.get("input_type_shape") or [], args.get("output_type_shape") or []):
            for entry in shapes:
                if isinstance(entry, dict):
                    types.extend(str(t) for t in entry)
        nodes[key] = PlacedNode(name, str(args.get("op_name", "?")), str(args["provider"]),
                                tuple(types))
    return list(nodes.values())
