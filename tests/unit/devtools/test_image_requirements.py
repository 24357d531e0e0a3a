"""The image requirement lists: every runtime dependency in pyproject goes to the
images that need it, and only to those (no engine needed)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from devtools.image_requirements import NEEDED_BY, ROLES, dependency_name, requirements

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_every_runtime_dependency_is_assigned_to_an_image_role():
    names = {dependency_name(d) for d in PYPROJECT["dependencies"]}
    assert names == set(NEEDED_BY), "pyproject and image_requirements.NEEDED_BY differ"
    for role in ROLES:
        requirements(role, PYPROJECT["dependencies"])  # raises on an unassigned one


def test_the_scheduler_image_carries_no_model_runtime():
    scheduler = {dependency_name(r) for r in requirements("scheduler", PYPROJECT["dependencies"])}
    assert not scheduler & {"onnxruntime", "onnxruntime-gpu", "numpy", "onnx", "tokenizers"}
    assert {"grpcio", "fastapi", "prometheus-client"} <= scheduler


def test_the_cpu_worker_gets_the_cpu_package_at_the_gpu_packages_pin():
    pins = {dependency_name(r): r for r in PYPROJECT["dependencies"]}
    gpu_pin = pins["onnxruntime-gpu"].split(";")[0].strip()[len("onnxruntime-gpu"):]
    cpu = requirements("worker-cpu", PYPROJECT["dependencies"])
    cuda = requirements("worker-cuda", PYPROJECT["dependencies"])
    assert "onnxruntime" + gpu_pin in cpu and not any("onnxruntime-gpu" in r for r in cpu)
    assert "onnxruntime-gpu" + gpu_pin in cuda and "onnxruntime" + gpu_pin not in cuda
    assert all(";" not in r for r in cpu + cuda)  # markers resolved by the role


def test_an_unassigned_dependency_is_an_error_naming_it():
    with pytest.raises(ValueError, match="'left-pad'.*NEEDED_BY"):
        requirements("scheduler", ["left-pad>=1"])
