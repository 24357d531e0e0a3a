"""The cp312 wheels a GPU machine lacks: which (device_wheels.txt) and how pip fetches them.

pip downloads for the device's Python and platform, not this machine's: `--python-version
3.12 --implementation cp --only-binary=:all:` and the manylinux tags below (pip matches a
manylinux_2_N tag exactly, so several are named).
"""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

LIST = Path(__file__).with_name("device_wheels.txt")
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64",
             "manylinux_2_35_x86_64")
ONNXRUNTIME_GPU = "onnxruntime-gpu"


def parse_list(text: str) -> list[tuple[str, str | None]]:
    """(name, pinned version or None) per line of device_wheels.txt; comments dropped."""
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not name.strip() or (sep and not version.strip()) or " " in name.strip():
            raise ValueError(f"device_wheels.txt line {number}: {raw!r} is not NAME or "
                             "NAME==VERSION")
        entries.append((name.strip(), version.strip() or None))
    names = [n.lower() for n, _ in entries]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"device_wheels.txt names {repeated} twice: keep one version of each")
    return entries


def pinned(entries: list[tuple[str, str | None]],
           installed=metadata.version) -> list[str]:
    """NAME==VERSION for every entry: a bare name takes the version installed here (the
    serving venv: what the tests ran)."""
    pins = []
    for name, version in entries:
        if version is None:
            try:
                version = installed(name)
            except metadata.PackageNotFoundError:
                raise ValueError(f"device_wheels.txt names {name} without a version and it is "
                                 "not installed in this venv; pin it (NAME==VERSION)") from None
        pins.append(f"{name}=={version}")
    return pins


def onnxruntime_gpu_pin(pyproject: Path) -> str:
    """onnxruntime-gpu==VERSION as pyproject.toml pins it."""
    import tomllib

    for dep in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        spec = dep.split(";", 1)[0].strip()
        if spec.startswith(ONNXRUNTIME_GPU + "=="):
            return spec
    raise ValueError(f"{pyproject} pins no {ONNXRUNTIME_GPU}==VERSION")


def download(requirements: list[str], dest: Path) -> list[Path]:
    """pip download the cp312 manylinux x86-64 wheels (no dependencies) into dest; pip keeps
    a file already there. Returns the wheels dest holds for these requirements."""
    dest.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
            "--python-version", DEVICE_PYTHON, "--implementation", "cp",
            "--disable-pip-version-check", "-d", str(dest)]
    for platform in PLATFORMS:
        argv += ["--platform", platform]
    subprocess.run([*argv, *requirements], check=True, stdout=sys.stderr)
    return [wheel_for(req, dest) for req in requirements]


def wheel_for(requirement: str, folder: Path) -> Path:
    """The wheel in folder for NAME==VERSION (wheel names normalise '-' to '_')."""
    name, _, version = requirement.partition("==")
    stem = name.replace("-", "_").lower()
    found = [w for w in folder.glob("*.whl")
             if w.name.lower().startswith(f"{stem}-{version}-")]
    if len(found) != 1:
        raise FileNotFoundError(f"{len(found)} wheels for {requirement} in {folder}: "
                                f"{[w.name for w in found]}")
    return found[0]
