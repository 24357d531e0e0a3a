"""MANIFEST.json: what a GPU bundle holds, written here and checked on the device.

The device checks every part's size and sha256 before unpacking, so a part left from an
older bundle, or a stage copied from another call, is named instead of failing inside zstd.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

MANIFEST = "MANIFEST.json"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def part_entry(path: Path, call: str) -> dict:
    """One part of the packed runtime: its name, the call that carries it, size and digest."""
    return {"name": path.name, "call": call, "bytes": path.stat().st_size,
            "sha256": sha256(path)}


def build(*, built_utc: str, project: dict, runtime: dict, parts: list[dict],
          wheels: list[str], tokenizer: list[str], calls: list[dict]) -> dict:
    """The manifest as a dict (pure: the caller gathers the facts)."""
    names = [p["name"] for p in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"part names repeat: {names}")
    return {"built_utc": built_utc, "project": project, "runtime": runtime,
            "parts": parts, "wheels": sorted(wheels), "tokenizer": sorted(tokenizer),
            "calls": calls}


def write(folder: Path, manifest: dict) -> Path:
    path = folder / MANIFEST
    path.write_text(json.dumps(manifest, indent=1) + "\n")
    return path


def read(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.exists():
        raise FileNotFoundError(f"no {path}: carry the bundle's second folder (make gpu-bundle "
                                "writes it) in the call that runs the proof")
    return json.loads(path.read_text())


def locate_parts(manifest: dict, folders: list[Path]) -> tuple[list[Path], list[str]]:
    """Every part, in order, found in the first of `folders` holding a file of its size and
    digest; and a sentence per part that is missing or differs."""
    found: list[Path] = []
    problems: list[str] = []
    for part in manifest["parts"]:
        candidates = [f / part["name"] for f in folders if (f / part["name"]).is_file()]
        good = [c for c in candidates
                if c.stat().st_size == part["bytes"] and sha256(c) == part["sha256"]]
        if good:
            found.append(good[0])
        elif candidates:
            problems.append(f"{part['name']} in {candidates[0].parent} is not this bundle's "
                            f"({candidates[0].stat().st_size} bytes, expected {part['bytes']} "
                            f"with sha256 {part['sha256'][:12]}...): stage it again")
        else:
            problems.append(f"{part['name']} ({part['call']}) is in none of "
                            f"{', '.join(str(f) for f in folders)}: run the stage call, then "
                            "this one at once")
    return found, problems
