"""On the GPU machine: the bundle installed into one folder put first on PYTHONPATH.

  python3 -m devtools.gpu.install --bundle .gpu-b --stage /tmp/stage --site /tmp/site --result F

Checks every part of the packed onnxruntime-gpu against MANIFEST.json (size, sha256), looking
in the stage folder, .gpu-a and the bundle; unpacks them (cat | zstd -d | tar) into SITE, where
it shadows the image's CPU onnxruntime; installs the wheels there (pip, no index, no deps).
Writes one JSON object to F. Exit 0 when installed; 3 when a part is missing or not this
bundle's (the stage call did not run, or the machine was given back between the calls); 1
when unpacking or pip failed. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from devtools.gpu import manifest

ROOT = Path(__file__).resolve().parents[2]
STAGE_MISSING = 3


def zstd_command(bundle: Path) -> str | None:
    """The bundle's zstd if it runs here, else one on PATH."""
    carried = bundle / "bin" / "zstd"
    if carried.exists():
        carried.chmod(0o755)
        if subprocess.run([str(carried), "-V"], capture_output=True).returncode == 0:
            return str(carried)
    return shutil.which("zstd")


def unpack(found: list[Path], zstd: str, site: Path) -> None:
    site.mkdir(parents=True, exist_ok=True)
    cat = subprocess.Popen(["cat", *map(str, found)], stdout=subprocess.PIPE)
    unz = subprocess.Popen([zstd, "-d", "-q", "--long=27", "-c"], stdin=cat.stdout,
                           stdout=subprocess.PIPE)
    cat.stdout.close()
    tar = subprocess.run(["tar", "-C", str(site), "-xf", "-"], stdin=unz.stdout,
                         capture_output=True, text=True)
    unz.stdout.close()
    codes = (cat.wait(), unz.wait(), tar.returncode)
    if any(codes):
        raise RuntimeError(f"unpacking failed (cat, zstd, tar exit {codes}): {tar.stderr[-500:]}")


def install(bundle: Path, stages: list[Path], site: Path) -> tuple[int, dict]:
    t0 = time.monotonic()
    info = manifest.read(bundle)
    out: dict = {"bundle": str(bundle), "site": str(site), "built_utc": info["built_utc"],
                 "project": info["project"], "runtime": info["runtime"].get("requirement")}
    found, problems = manifest.locate_parts(info, [*stages, bundle])
    if problems:
        out["stage_missing"] = problems
        return STAGE_MISSING, out
    zstd = zstd_command(bundle)
    if zstd is None:
        out["error"] = f"no zstd: neither {bundle / 'bin' / 'zstd'} runs nor one is on PATH"
        return 1, out
    unpack(found, zstd, site)
    out["unpacked_s"] = round(time.monotonic() - t0, 1)
    wheels = sorted(str(w) for w in (bundle / "whl").glob("*.whl"))
    out["wheels"] = len(wheels)
    if not wheels:
        out["seconds"] = round(time.monotonic() - t0, 1)
        return 0, out
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                          "--no-deps", "--no-compile", "--no-cache-dir", "--upgrade",
                          "--disable-pip-version-check", "--target", str(site), *wheels],
                         capture_output=True, text=True)
    out["seconds"] = round(time.monotonic() - t0, 1)
    if pip.returncode != 0:
        out["error"] = f"pip install --target {site} failed: {pip.stderr[-2000:]}"
        return 1, out
    return 0, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gpu.install",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / ".gpu-b")
    parser.add_argument("--stage", type=Path, action="append", default=None,
                        help="a folder that may hold staged parts (repeatable; default "
                             "/tmp/stage and .gpu-a)")
    parser.add_argument("--site", type=Path, required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args(argv)
    stages = args.stage or [Path("/tmp/stage"), ROOT / ".gpu-a"]
    try:
        code, out = install(args.bundle, stages, args.site)
    except (OSError, RuntimeError, ValueError) as error:
        code, out = 1, {"error": f"{type(error).__name__}: {error}"}
    out["ok"] = code == 0
    args.result.write_text(json.dumps(out, indent=1))
    print(json.dumps(out)[:2000], file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
