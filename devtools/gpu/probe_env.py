"""What the GPU proof runs on: the GPU, the driver, the packages, and a CUDA smoke test.

  python -m devtools.gpu.probe_env --result env.json [--no-cuda]
  python -m devtools.gpu.probe_env --nvidia-lib-dirs        (prints LD_LIBRARY_PATH's addition)

The smoke test runs one Identity node on the CUDA provider over a device OrtValue: the
provider's libraries load and a kernel really runs (ORT would otherwise fall back to the CPU
silently). --no-cuda (the dry run) records the rest and skips it. Exit 0 when the smoke test
passed or was skipped, 1 when it failed (the JSON says why).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import json
import os
import site
import subprocess
import sys
import traceback
from importlib import metadata
from pathlib import Path

DISTRIBUTIONS = ("onnxruntime-gpu", "onnxruntime", "onnxruntime-genai-cuda",
                 "onnxruntime-genai", "numpy", "onnx", "onnx-ir", "torch", "transformers",
                 "tokenizers", "grpcio", "protobuf", "fastapi", "pydantic", "uvicorn",
                 "structlog", "llguidance")
CUDA_LIBRARIES = ("libcublasLt.so", "libcublas.so", "libcudart.so", "libcurand.so",
                  "libcudnn.so.")


def command(argv: list[str], timeout_s: float = 30) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        return (done.stdout + done.stderr).strip()
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"{type(error).__name__}: {error}"


def nvidia_lib_dirs() -> list[str]:
    """The lib folders of the nvidia-* CUDA wheels in this Python (torch's CUDA 13 libraries)."""
    dirs = []
    for base in [*site.getsitepackages(), *sys.path]:
        for folder in sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib"))):
            if glob.glob(os.path.join(folder, "lib*.so*")) and folder not in dirs:
                dirs.append(folder)
    return dirs


def cuda_smoke() -> dict:
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["n"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "smoke", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=[("CUDAExecutionProvider", {"device_id": 0}),
                                              "CPUExecutionProvider"])
    host = np.arange(8, dtype=np.float16)
    value = ort.OrtValue.ortvalue_from_numpy(host, "cuda", 0)
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", value)
    binding.bind_output("y", "cuda", 0)
    session.run_with_iobinding(binding)
    got = binding.get_outputs()[0].numpy()
    return {"providers": session.get_providers(), "device": value.device_name(),
            "ok": bool(np.array_equal(got, host)) and
            session.get_providers()[0] == "CUDAExecutionProvider"}


def probe(with_cuda: bool) -> dict:
    out: dict = {"python": sys.version, "executable": sys.executable,
                 "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", ""),
                 "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                 "nvidia_smi": command(["nvidia-smi", "--query-gpu=name,memory.total,"
                                        "memory.used,driver_version,compute_cap",
                                        "--format=csv,noheader"]),
                 "ldconfig_cuda": [line.strip() for line in command(["ldconfig", "-p"]).splitlines()
                                   if any(k in line for k in CUDA_LIBRARIES)][:16],
                 "nvidia_lib_dirs": nvidia_lib_dirs()}
    versions = {}
    for dist in DISTRIBUTIONS:
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    out["versions"] = versions
    try:
        import onnxruntime as ort

        out["onnxruntime"] = {"file": ort.__file__, "version": ort.__version__,
                              "providers": ort.get_available_providers()}
        said = io.StringIO()
        with contextlib.redirect_stdout(said), contextlib.suppress(Exception):
            ort.preload_dlls()
        out["preload_dlls_said"] = said.getvalue()[-2000:]
    except Exception as error:  # noqa: BLE001 - recorded; the smoke test says the rest
        out["onnxruntime"] = {"error": f"{type(error).__name__}: {error}"}
    if with_cuda:
        try:
            out["cuda_smoke"] = cuda_smoke()
        except Exception as error:  # noqa: BLE001 - the reason is the result
            out["cuda_smoke"] = {"ok": False, "error": f"{type(error).__name__}: {error}",
                                 "trace": traceback.format_exc()[-3000:]}
    else:
        out["cuda_smoke"] = {"ok": True, "skipped": "dry run: no GPU asked for"}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gpu.probe_env",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--result", type=Path)
    parser.add_argument("--no-cuda", action="store_true")
    parser.add_argument("--nvidia-lib-dirs", action="store_true")
    args = parser.parse_args(argv)
    if args.nvidia_lib_dirs:
        print(":".join(nvidia_lib_dirs()))
        return 0
    if args.result is None:
        parser.error("--result is required")
    out = probe(not args.no_cuda)
    args.result.write_text(json.dumps(out, indent=1, default=str))
    print(f"probe_env: {out['nvidia_smi'][:120]!r}; smoke {out['cuda_smoke']}", file=sys.stderr)
    return 0 if out["cuda_smoke"].get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
