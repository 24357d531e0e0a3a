"""The Dockerfile, the image requirement lists and compose.yaml agree (no engine needed).

The images themselves are built and run by `make compose-test` (devtools/compose_test.py).
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from devtools.compose_cluster import documented_commands
from devtools.image_requirements import NEEDED_BY, ROLES, dependency_name, requirements

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SERVICE_TARGETS = ("scheduler", "cpu", "cuda")


def stages() -> dict[str, list[tuple[str, str]]]:
    """Dockerfile target -> its instructions as (KEYWORD, rest), continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    found: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, rest = line.partition(" ")
        if keyword == "FROM":
            current = rest.split(" AS ")[-1].strip() if " AS " in rest else rest
            found[current] = []
        found[current].append((keyword, rest.strip()))
    return found


def instruction(stage: str, keyword: str) -> list[str]:
    return [rest for kw, rest in stages()[stage] if kw == keyword]


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


def test_the_version_label_default_is_pyprojects_version():
    args = dict(a.split("=", 1) for a in instruction("", "ARG") if "=" in a)
    assert args["ORTSERVE_VERSION"] == PYPROJECT["version"]
    assert args["BASE"] == "python:3.11-slim-bookworm"


@pytest.mark.parametrize("target", SERVICE_TARGETS)
def test_service_images_run_as_the_non_root_user_with_labels(target):
    assert instruction(target, "USER")[-1] == "ortserve"
    labels = " ".join(instruction(target, "LABEL") or instruction("python-base", "LABEL"))
    assert 'org.opencontainers.image.version="${ORTSERVE_VERSION}"' in labels


def _dockerfile_healthcheck(target: str) -> dict:
    (line,) = instruction(target, "HEALTHCHECK")
    options = dict(re.findall(r"--(\w+)=(\S+)", line))
    return {"test": ["CMD", *json.loads(line[line.index("CMD") + 3:])],
            "interval": options["interval"], "timeout": options["timeout"],
            "retries": int(options["retries"])}


@pytest.mark.parametrize(("target", "service"),
                         [("scheduler", "scheduler"), ("cpu", "worker-cpu"), ("cuda", "worker")])
def test_each_images_healthcheck_is_composes(target, service):
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"][service]
    assert _dockerfile_healthcheck(target) == compose["healthcheck"]
    assert compose["build"]["target"] == target
    assert compose["image"] == f"ortserve:{target}"


def test_the_readme_builds_the_images_compose_runs():
    commands = documented_commands("compose-commands")
    built = {c[c.index("-t") + 1]: c[c.index("--target") + 1]
             for c in commands if c[:2] == ["docker", "build"]}
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    cpu_profile = [s for name, s in services.items()
                   if "gpu" not in s.get("profiles", []) and name != "model"]
    for service in cpu_profile:
        assert service["image"] in built, f"{service['image']} is run but the README never builds it"
    assert built == {f"ortserve:{t}": t for t in built.values()}
    ups = [c for c in commands if "up" in c]
    assert ups == [["docker", "compose", "-f", "compose.yaml", "-f", "compose.seed.yaml",
                    "--profile", "cpu", "up", "--scale", "worker-cpu=2"]]
    assert documented_commands("compose-tls-commands") == [
        ["docker", "compose", "-f", "compose.yaml", "-f", "compose.seed.yaml", "-f", "compose.tls.yaml",
         "--profile", "cpu", "up"]]
