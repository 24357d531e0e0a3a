"""The `cuda` image holds every library the installed CUDA provider links against.

No engine, no GPU, no registry (devtools/cuda_image.py): the Dockerfile's CUDA base tag,
what that NVIDIA image ships, and the NEEDED entries of onnxruntime-gpu's provider library.
"""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest

from devtools import cuda_image

ROOT = Path(__file__).resolve().parents[3]


def installed_provider() -> Path:
    try:
        return cuda_image.provider_library()
    except FileNotFoundError as error:  # the CPU package: onnxruntime-gpu is Linux x86-64 only
        pytest.skip(str(error))


def test_the_cuda_images_base_provides_every_library_the_cuda_provider_needs():
    base = cuda_image.dockerfile_cuda_base((ROOT / "Dockerfile").read_text())
    needed = cuda_image.needed_sonames(installed_provider())
    assert "libcublasLt.so.13" in needed or "libcublasLt.so.12" in needed, needed
    assert cuda_image.missing(base, needed) == [], (
        f"{base.tag} (CUDA {base.major}) lacks what onnxruntime-gpu's CUDA provider links "
        f"against; python -m devtools.cuda_image says which")


def test_the_provider_read_is_the_version_pyproject_pins():
    """The check reads the venv's library: it must be the onnxruntime-gpu the image installs."""
    installed_provider()
    pins = [d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
            ["dependencies"] if d.startswith("onnxruntime-gpu")]
    assert pins, "pyproject.toml pins no onnxruntime-gpu"
    assert f"=={metadata.version('onnxruntime-gpu')}" in pins[0].split(";")[0]


def test_a_cuda_12_base_lacks_what_a_cuda_13_provider_needs():
    needed = ["libcublasLt.so.13", "libcublas.so.13", "libcurand.so.10", "libcudart.so.13",
              "libcuda.so.1", "libc.so.6"]
    old = cuda_image.parse_cuda_base("nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04")
    assert cuda_image.missing(old, needed) == ["libcublasLt.so.13", "libcublas.so.13",
                                               "libcudart.so.13"]
    new = cuda_image.parse_cuda_base("nvidia/cuda:13.0.2-runtime-ubuntu24.04")
    assert cuda_image.missing(new, needed) == []
    # the `base` flavour has the runtime only: no cuBLAS
    bare = cuda_image.parse_cuda_base("nvcr.io/nvidia/cuda:13.0.2-base-ubuntu24.04")
    assert cuda_image.missing(bare, needed) == ["libcublasLt.so.13", "libcublas.so.13",
                                                "libcurand.so.10"]


@pytest.mark.parametrize("tag", ["python:3.11-slim", "nvidia/cuda:13.0.2-weird-ubuntu24.04",
                                 "nvidia/cuda:latest"])
def test_a_base_that_is_not_a_known_cuda_image_is_refused_by_name(tag):
    with pytest.raises(ValueError, match="CUDA_BASE"):
        cuda_image.parse_cuda_base(tag)


def test_the_elf_reader_finds_needed_entries_of_a_real_library():
    import onnxruntime

    capi = Path(onnxruntime.__file__).parent / "capi"
    lib = next(capi.glob("onnxruntime_pybind11_state*.so"))
    assert "libc.so.6" in cuda_image.needed_sonames(lib)


def test_the_cli_names_what_is_missing(tmp_path, capsys):
    installed_provider()
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG CUDA_BASE=nvidia/cuda:11.8.0-runtime-ubuntu22.04\n")
    assert cuda_image.main(["--dockerfile", str(dockerfile)]) == 1
    assert "MISSING in the cuda image: libcublasLt.so." in capsys.readouterr().err
