"""What fits one device call: sizes, the split of a packed file into parts, the refusal.

A call to the GPU machine carries at most 64 MiB: the working tree (tracked and untracked
files that git does not ignore) plus the ignored folders it names in `carry`. The bundle is
two such folders, one per call, each checked here against what the tree leaves.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

CALL_LIMIT_BYTES = 64 * 1024 * 1024
# Room left unused in every call: the tree may grow by a commit between the bundle and the
# call (a changed doc, a new test), and the transfer names every file.
SLACK_BYTES = 1_500_000
_COPY_CHUNK_BYTES = 1 << 20


class BundleTooLarge(RuntimeError):
    """A folder would not fit one device call beside the working tree."""


@dataclass(frozen=True)
class CallSize:
    """One device call's load: a carried folder and the working tree that travels with it."""

    name: str
    folder_bytes: int
    tree_bytes: int
    limit_bytes: int = CALL_LIMIT_BYTES

    @property
    def total_bytes(self) -> int:
        return self.folder_bytes + self.tree_bytes

    def fits(self) -> bool:
        return self.total_bytes + SLACK_BYTES <= self.limit_bytes

    def sentence(self) -> str:
        return (f"{self.name}: {mib(self.folder_bytes)} + working tree {mib(self.tree_bytes)} = "
                f"{mib(self.total_bytes)} of {mib(self.limit_bytes)} per call "
                f"({mib(SLACK_BYTES)} kept free)")


def mib(n_bytes: int) -> str:
    return f"{n_bytes / (1024 * 1024):.1f} MiB"


def room_beside_tree(tree_bytes: int, limit_bytes: int = CALL_LIMIT_BYTES) -> int:
    """Bytes a carried folder may hold in one call beside a working tree of tree_bytes."""
    room = limit_bytes - tree_bytes - SLACK_BYTES
    if room <= 0:
        raise BundleTooLarge(
            f"the working tree alone is {mib(tree_bytes)}, leaving nothing of a device call's "
            f"{mib(limit_bytes)} for the bundle; ignore or remove large untracked files "
            "(git status) and run make gpu-bundle again")
    return room


def check_fits(size: CallSize) -> None:
    """Raise BundleTooLarge, with the numbers and a next step, when `size` does not fit."""
    if not size.fits():
        over = size.total_bytes + SLACK_BYTES - size.limit_bytes
        raise BundleTooLarge(
            f"{size.sentence()}: {mib(over)} too many. A device call carries at most "
            f"{mib(size.limit_bytes)}; shrink the working tree (untracked files travel too) "
            "or the folder's contents (devtools/gpu/device_wheels.txt) and run make gpu-bundle "
            "again")


def split_sizes(total_bytes: int, first_bytes: int, rest_bytes: int) -> list[int]:
    """Part sizes for a file of total_bytes: the first part at most first_bytes, every later
    one at most rest_bytes. An empty file is one empty part."""
    if first_bytes <= 0 or rest_bytes <= 0:
        raise ValueError(f"part sizes must be positive (first {first_bytes}, rest {rest_bytes})")
    sizes = [min(total_bytes, first_bytes)]
    left = total_bytes - sizes[0]
    while left > 0:
        sizes.append(min(left, rest_bytes))
        left -= sizes[-1]
    return sizes


def write_parts(source: Path, destinations: list[Path], sizes: list[int]) -> None:
    """Copy `source` into consecutive parts (destinations[i] gets sizes[i] bytes)."""
    if len(destinations) != len(sizes):
        raise ValueError(f"{len(destinations)} destinations for {len(sizes)} parts")
    if sum(sizes) != source.stat().st_size:
        raise ValueError(f"parts of {sum(sizes)} bytes for {source} of {source.stat().st_size}")
    with open(source, "rb") as src:
        for dest, size in zip(destinations, sizes, strict=True):
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(dest, "wb") as out:
                left = size
                while left:
                    chunk = src.read(min(left, _COPY_CHUNK_BYTES))
                    out.write(chunk)
                    left -= len(chunk)


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def working_tree_bytes(root: Path) -> int:
    """What every device call carries: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, check=True).stdout
    total = 0
    for name in filter(None, listed.split(b"\0")):
        path = root / name.decode()
        if path.is_file() and not path.is_symlink():  # a deleted tracked file does not travel
            total += path.stat().st_size
    return total
