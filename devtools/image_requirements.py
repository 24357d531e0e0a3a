"""The pip requirements of one container image role, read from pyproject.toml.

  python3 image_requirements.py --role scheduler [--pyproject pyproject.toml] > req.txt

pyproject.toml stays the one place versions are written; this only says which
image needs which dependency, so the scheduler image carries no ONNX Runtime,
numpy or tokenizers (the Dockerfile runs it at build time, with the base
image's Python and the standard library only: no imports of ortserve here).

Roles:
  scheduler   ortserve-scheduler, ortserve-gateway, ortserve-probe and the CLI
  worker-cpu  ortserve-worker on CPU: the `onnxruntime` package at the pinned version
  worker-cuda ortserve-worker on CUDA: `onnxruntime-gpu`, as pyproject pins it
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

ROLES = ("scheduler", "worker-cpu", "worker-cuda")
# Every runtime dependency -> the roles that install it. A dependency missing here is an
# error (tests/unit/devtools/test_image_requirements.py), so a new one cannot silently skip
# an image.
NEEDED_BY: dict[str, frozenset[str]] = {
    **{name: frozenset(ROLES) for name in (
        "grpcio", "grpcio-status", "grpcio-health-checking", "grpcio-reflection",
        "protobuf", "googleapis-common-protos", "structlog", "prometheus-client",
        # output constraints: the scheduler compiles them to refuse a bad one before
        # admission; the worker masks tokens with them
        "llguidance",
        # tracing (ortserve/process/tracing.py), off unless asked for
        "opentelemetry-api", "opentelemetry-sdk", "opentelemetry-exporter-otlp-proto-grpc",
        "opentelemetry-instrumentation-grpc")},
    # the OpenAI-compatible gateway ships in the scheduler image
    **{name: frozenset({"scheduler"}) for name in (
        "fastapi", "uvicorn", "sse-starlette", "opentelemetry-instrumentation-fastapi")},
    **{name: frozenset({"worker-cpu", "worker-cuda"}) for name in (
        "numpy", "onnx", "tokenizers", "jinja2")},
    "onnxruntime-gpu": frozenset({"worker-cuda"}),
    # pyproject's non-x86-64 fallback; worker-cpu installs it at onnxruntime-gpu's pin
    "onnxruntime": frozenset(),
}
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def dependency_name(requirement: str) -> str:
    """The normalised distribution name at the start of a PEP 508 requirement string."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(role: str, dependencies: list[str]) -> list[str]:
    """The requirement lines for `role`, in pyproject's order, environment markers dropped."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)}")
    lines = []
    for requirement in dependencies:
        name = dependency_name(requirement)
        if name not in NEEDED_BY:
            raise ValueError(f"pyproject dependency {name!r} is not assigned to an image role "
                             f"in devtools/image_requirements.py NEEDED_BY; add it there")
        # Markers pick the package by platform; an image's role already has.
        spec = requirement.split(";", 1)[0].strip()
        if name == "onnxruntime-gpu" and role == "worker-cpu":
            lines.append("onnxruntime" + spec[len(name):])  # the CPU package, same version
        elif role in NEEDED_BY[name]:
            lines.append(spec)
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", required=True, choices=ROLES)
    p.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    a = p.parse_args(argv)
    project = tomllib.loads(a.pyproject.read_text())["project"]
    try:
        print("\n".join(requirements(a.role, project["dependencies"])))
    except ValueError as error:
        sys.exit(f"image_requirements: {error}")


if __name__ == "__main__":
    main()
