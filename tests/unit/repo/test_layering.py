"""The layering rules that matter, read from the imports themselves (ast, no import runs).

- worker_service/runtime/ and core/ import no worker edge module (anything else in
  worker_service/: the engine, the servicer, the configs): the runtime is built from
  what it is given, never reaches up;
- the gateway imports nothing from the client library (what both need lives in ortserve/);
- ortserve/ (shared by every service) imports no service package.

An import inside a function or under TYPE_CHECKING counts too: it is still an arrow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ("scheduler_service", "worker_service", "gateway", "ortserve_client", "clients")
WORKER_INNER = ("runtime", "core")  # worker_service/'s floors below its edge


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[:2] == ["clients", "python"]:
        parts = parts[2:]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path, root: Path = ROOT) -> Iterator[tuple[int, str]]:
    """(line, module) for each module `path` imports; `from a import b` yields a and a.b
    (b may be a submodule), relative imports resolved against the file's package."""
    package = module_name(path, root).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def arrows(folder: str, refused, root: Path = ROOT) -> list[str]:
    found = []
    for path in sorted((root / folder).rglob("*.py")):
        for line, module in imported(path, root):
            if refused(module):
                found.append(f"{path.relative_to(root)}:{line} imports {module}")
    return sorted(set(found))


def is_worker_edge(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "worker_service" and len(parts) > 1 and parts[1] not in WORKER_INNER


@pytest.mark.parametrize("inner", WORKER_INNER)
def test_worker_runtime_and_core_import_no_worker_edge_module(inner):
    assert arrows(f"worker_service/{inner}", is_worker_edge) == []


def test_gateway_imports_nothing_from_the_client_library():
    assert arrows("gateway", lambda m: m.split(".")[0] in ("ortserve_client", "clients")) == []


def test_ortserve_imports_no_service_package():
    assert arrows("ortserve", lambda m: m.split(".")[0] in SERVICES) == []


def test_the_rules_see_an_arrow(tmp_path):
    """The reader catches what the rules refuse: absolute, from-package and relative."""
    folder = tmp_path / "worker_service" / "runtime"
    folder.mkdir(parents=True)
    (folder / "probe.py").write_text("from worker_service.engine.config import EngineConfig\n"
                                     "from worker_service import server\n"
                                     "from .. import servicer\n"
                                     "from . import kv_pool\n"
                                     "import worker_service.core.errors\n")
    found = arrows("worker_service/runtime", is_worker_edge, tmp_path)
    assert [a.split(" imports ")[1] for a in found] == [
        "worker_service.engine.config", "worker_service.engine.config.EngineConfig",
        "worker_service.server", "worker_service.servicer"]
