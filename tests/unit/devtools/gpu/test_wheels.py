"""devtools/gpu/wheels.py: which cp312 wheels the device gets, at which versions."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

from devtools.gpu import wheels

ROOT = Path(__file__).resolve().parents[4]


def test_the_list_parses_into_names_with_or_without_a_pin():
    entries = wheels.parse_list("# comment\n\ngrpcio\nonnx-ir==1.1.0  # the builder's\n")
    assert entries == [("grpcio", None), ("onnx-ir", "1.1.0")]


@pytest.mark.parametrize(("text", "match"), [("grpcio==\n", "line 1"), ("a b\n", "line 1"),
                                             ("grpcio\nGRPCIO==1\n", "twice")])
def test_a_bad_line_or_a_repeated_name_is_refused(text, match):
    with pytest.raises(ValueError, match=match):
        wheels.parse_list(text)


def test_a_bare_name_takes_the_version_installed_here():
    installed = {"grpcio": "1.85.1"}.__getitem__
    assert wheels.pinned([("grpcio", None), ("onnx-ir", "1.1.0")], installed) == [
        "grpcio==1.85.1", "onnx-ir==1.1.0"]


def test_a_bare_name_not_installed_here_must_be_pinned():
    def installed(name):
        raise metadata.PackageNotFoundError(name)

    with pytest.raises(ValueError, match="pin it"):
        wheels.pinned([("nothing-here", None)], installed)


def test_the_shipped_list_pins_every_wheel_in_this_venv():
    pins = wheels.pinned(wheels.parse_list(wheels.LIST.read_text()))
    assert all("==" in p for p in pins)
    names = {p.split("==")[0] for p in pins}
    # what the services import and the image lacks, the gateway's included
    assert {"grpcio", "protobuf", "structlog", "fastapi", "uvicorn", "llguidance",
            "onnxruntime-genai-cuda"} <= names
    assert f"grpcio=={metadata.version('grpcio')}" in pins


def test_onnxruntime_gpu_is_taken_at_pyprojects_pin():
    assert wheels.onnxruntime_gpu_pin(ROOT / "pyproject.toml").startswith("onnxruntime-gpu==1.")


def test_a_wheel_is_found_by_its_normalised_name(tmp_path):
    (tmp_path / "grpcio_status-1.85.1-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "grpcio-1.85.1-cp312-cp312-manylinux_2_17_x86_64.whl").write_bytes(b"")
    assert wheels.wheel_for("grpcio-status==1.85.1", tmp_path).name.startswith("grpcio_status")
    assert wheels.wheel_for("grpcio==1.85.1", tmp_path).name.startswith("grpcio-1.85.1")
    with pytest.raises(FileNotFoundError, match="0 wheels for grpcio==9"):
        wheels.wheel_for("grpcio==9", tmp_path)
