"""What the bench records about the machine and the model: the CPU, the versions, the weights' bytes."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np


def weight_bytes(model_dir: Path) -> int:
    return sum(f.stat().st_size for f in model_dir.iterdir() if f.name.startswith("model.onnx"))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def versions() -> dict:
    import grpc
    import onnxruntime

    return {"python": platform.python_version(), "onnxruntime": onnxruntime.__version__,
            "grpcio": grpc.__version__, "numpy": np.__version__}
