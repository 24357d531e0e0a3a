"""The layering rules that matter, read from the imports themselves (ast, no import runs).

- the worker's floors, each importing only from itself and the floors below it:
  core/ (pure: sequences, scheduling, sampling, the tokenizer, errors) imports only core/;
  runtime/ (ORT and KV memory) imports only runtime/ and core/: it is built from what it is
  given (runtime/config.py) and never reaches up into the engine or the edge; engine/ (the
  engine thread over the runtime) imports only engine/, runtime/ and core/: never the edge
  (the servicer, the server, the lease and session lifecycles, the worker's config);
- the worker's top level is its edge only, at most 14 modules (issue 53: it had 20, the
  engine's among them);
- the gateway imports nothing from the client library (what both need lives in ortserve/);
- ortserve/ (shared by every service) imports no service package;
- no service imports another, nor the client library another service: they meet only
  on the wire (protos/) and in ortserve/.

An import inside a function or under TYPE_CHECKING counts too: it is still an arrow.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SERVICES = ("scheduler_service", "worker_service", "gateway", "ortserve_client", "clients")
WORKER_INNER = ("runtime", "core")  # worker_service/'s floors below the engine
# Each floor of worker_service/ below its edge -> the floors it may import (itself included).
WORKER_FLOORS = {"core": ("core",), "runtime": ("runtime", "core"),
                 "engine": ("engine", "runtime", "core")}
WORKER_EDGE_MODULES_MAX = 14  # *.py files at worker_service/'s top level


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


def outside(floors: tuple[str, ...]):
    """A refusal of every worker_service module outside `floors` (the edge included)."""
    def refused(module: str) -> bool:
        parts = module.split(".")
        return parts[0] == "worker_service" and len(parts) > 1 and parts[1] not in floors
    return refused


@pytest.mark.parametrize("inner", WORKER_INNER)
def test_worker_runtime_and_core_import_no_worker_edge_module(inner):
    assert arrows(f"worker_service/{inner}", is_worker_edge) == []


@pytest.mark.parametrize("floor", WORKER_FLOORS)
def test_each_worker_floor_imports_only_itself_and_the_floors_below(floor):
    assert (ROOT / "worker_service" / floor / "__init__.py").is_file(), f"worker_service/{floor}/"
    assert arrows(f"worker_service/{floor}", outside(WORKER_FLOORS[floor])) == []


def test_the_workers_top_level_is_its_edge_only():
    modules = sorted(p.name for p in (ROOT / "worker_service").glob("*.py"))
    assert len(modules) <= WORKER_EDGE_MODULES_MAX, (
        f"worker_service/ has {len(modules)} modules at its top level, at most "
        f"{WORKER_EDGE_MODULES_MAX}: {', '.join(modules)}; what the engine or the runtime "
        "uses belongs in engine/ or runtime/")


def test_gateway_imports_nothing_from_the_client_library():
    assert arrows("gateway", lambda m: m.split(".")[0] in ("ortserve_client", "clients")) == []


def test_ortserve_imports_no_service_package():
    assert arrows("ortserve", lambda m: m.split(".")[0] in SERVICES) == []


@pytest.mark.parametrize("folder", ["scheduler_service", "worker_service", "gateway",
                                    "clients/python"])
def test_no_service_imports_another(folder):
    own = "ortserve_client" if folder == "clients/python" else folder
    others = {"scheduler_service", "worker_service", "gateway", "ortserve_client",
              "clients"} - {own}
    assert arrows(folder, lambda m: m.split(".")[0] in others) == []


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


def test_the_floor_rules_see_an_arrow(tmp_path):
    """The engine may reach the runtime but not the edge; core reaches nothing above it."""
    engine = tmp_path / "worker_service" / "engine"
    core = tmp_path / "worker_service" / "core"
    engine.mkdir(parents=True)
    core.mkdir(parents=True)
    (engine / "probe.py").write_text("from worker_service.runtime.runner import Runner\n"
                                     "from worker_service.lease_lifecycle import LeaseLifecycle\n")
    (core / "probe.py").write_text("from worker_service.runtime import model\n")
    assert [a.split(" imports ")[1] for a in arrows(
        "worker_service/engine", outside(WORKER_FLOORS["engine"]), tmp_path)] == [
        "worker_service.lease_lifecycle", "worker_service.lease_lifecycle.LeaseLifecycle"]
    assert [a.split(" imports ")[1] for a in arrows(
        "worker_service/core", outside(WORKER_FLOORS["core"]), tmp_path)] == [
        "worker_service.runtime", "worker_service.runtime.model"]
