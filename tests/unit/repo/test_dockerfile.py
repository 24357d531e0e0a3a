"""The Dockerfile and compose.yaml agree (no engine needed).

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

ROOT = Path(__file__).resolve().parents[3]
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
