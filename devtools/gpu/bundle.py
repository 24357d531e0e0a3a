"""make gpu-bundle: what a GPU machine without network needs, in folders of one call each.

  python -m devtools.gpu.bundle [--tokenizer-dir DIR] [--keep-sm 90]

Writes two folders at the repository root, ignored by git (.gitignore):
  .gpu-a/  ort.part_00: the first part of onnxruntime-gpu packed small (pack_ort.py), as large
           as one call allows beside the working tree. The STAGE call carries it.
  .gpu-b/  the other part(s), whl/ (the cp312 wheels the device lacks: device_wheels.txt),
           tok/ (SmolLM2's tokenizer, for the random-weight models), bin/zstd, MANIFEST.json.
           The RUN call carries it.
The device scripts and the model shapes (devtools/gpu/) are part of the working tree, which
travels with every call. docs/operations/gpu-proof.md has the two calls.

pip downloads ~290 MB the first time (kept in $ORTSERVE_MODEL_CACHE/gpu-wheels). Every step
says on stderr what it does; at the end, each part's and each call's size. A folder that would
not fit its call (64 MiB with the working tree) is refused, with the numbers.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from devtools.gpu import manifest, pack_ort, parts, wheels

ROOT = Path(__file__).resolve().parents[2]
STAGE_FOLDER = ".gpu-a"  # carried by the stage call
RUN_FOLDER = ".gpu-b"  # carried by the run call
PART_PREFIX = "ort.part_"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                   "special_tokens_map.json")
REQUIRED_TOKENIZER_FILES = TOKENIZER_FILES[:3]


def say(message: str) -> None:
    print(f"gpu-bundle: {message}", file=sys.stderr, flush=True)


def model_cache() -> Path:
    return Path(os.environ.get("ORTSERVE_MODEL_CACHE", Path.home() / ".cache" / "ortserve"))


def find_tokenizer(explicit: Path | None) -> Path:
    """SmolLM2's tokenizer folder: the one given, else the ones `make model` writes."""
    hf = model_cache() / "hf"
    candidates = [explicit] if explicit else [hf / "smollm2-tokenizer",
                                              hf / "smollm2-135m-instruct"]
    for folder in candidates:
        if all((folder / f).is_file() for f in REQUIRED_TOKENIZER_FILES):
            return folder
    raise SystemExit(f"gpu-bundle: no SmolLM2 tokenizer ({', '.join(REQUIRED_TOKENIZER_FILES)}) "
                     f"in {' or '.join(str(c) for c in candidates)}: run `make model` first, or "
                     "pass --tokenizer-dir")


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def build(tokenizer_dir: Path, keep_sm: set[int]) -> dict:
    t0 = time.monotonic()
    downloads = model_cache() / "gpu-wheels"
    ort_pin = wheels.onnxruntime_gpu_pin(ROOT / "pyproject.toml")
    device_pins = wheels.pinned(wheels.parse_list(wheels.LIST.read_text()))
    say(f"downloading {ort_pin} and {len(device_pins)} more cp312 wheels into {downloads} "
        "(expected: about 1 min the first time, ~290 MB; seconds when cached)")
    (ort_wheel,) = wheels.download([ort_pin], downloads)
    device_wheels = wheels.download(device_pins, downloads)

    stage, run = ROOT / STAGE_FOLDER, ROOT / RUN_FOLDER
    for folder in (stage, run):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
    packed = run / "ort.tar.zst"
    say(f"packing {ort_wheel.name}: machine code for sm {sorted(keep_sm)} only, zstd "
        f"-{pack_ort.ZSTD_LEVEL} (expected: about 1 min)")
    runtime = pack_ort.pack(ort_wheel, packed, keep_sm, pack_ort.zstd_binary())
    say(f"packed: {parts.mib(runtime['packed_bytes'])} (zeroed "
        f"{parts.mib(runtime['machine_code_zeroed_bytes'])} of other GPUs' machine code)")

    for sub in ("whl", "tok", "bin"):
        (run / sub).mkdir()
    for wheel in device_wheels:
        shutil.copy2(wheel, run / "whl" / wheel.name)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy2(tokenizer_dir / name, run / "tok" / name)
    shutil.copy2(pack_ort.zstd_binary(), run / "bin" / "zstd")  # the device image may lack one

    # The first part as large as the stage call allows; the rest beside the run call's files.
    tree = parts.working_tree_bytes(ROOT)
    room = parts.room_beside_tree(tree)
    run_fixed = parts.folder_bytes(run) - packed.stat().st_size
    sizes = parts.split_sizes(packed.stat().st_size, room, max(room - run_fixed, 1))
    if len(sizes) > 2:
        raise parts.BundleTooLarge(
            f"onnxruntime packs to {parts.mib(packed.stat().st_size)}; with the working tree "
            f"({parts.mib(tree)}) and the run call's wheels ({parts.mib(run_fixed)}) it needs "
            f"{len(sizes)} calls, and the proof stages one part only. Shrink the working tree "
            "or device_wheels.txt")
    destinations = [stage / f"{PART_PREFIX}00"] + [run / f"{PART_PREFIX}{i:02d}"
                                                   for i in range(1, len(sizes))]
    parts.write_parts(packed, destinations, sizes)
    packed.unlink()

    entries = [manifest.part_entry(p, "stage" if p.parent == stage else "run")
               for p in destinations]
    calls = [parts.CallSize(f"stage call ({STAGE_FOLDER})", parts.folder_bytes(stage), tree),
             parts.CallSize(f"run call ({RUN_FOLDER})", parts.folder_bytes(run) + 4096, tree)]
    info = manifest.build(
        built_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        project={"commit": git("rev-parse", "HEAD"),
                 "subject": git("log", "-1", "--format=%s")[:200],
                 "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))},
        runtime={**runtime, "requirement": ort_pin},
        parts=entries, wheels=[w.name for w in device_wheels],
        tokenizer=[p.name for p in (run / "tok").iterdir()],
        calls=[{"name": c.name, "folder_bytes": c.folder_bytes, "tree_bytes": c.tree_bytes,
                "limit_bytes": c.limit_bytes} for c in calls])
    manifest.write(run, info)
    for entry in entries:
        say(f"part {entry['name']} ({entry['call']} call): {parts.mib(entry['bytes'])}")
    for call in calls:
        say(call.sentence())
        parts.check_fits(call)
    say(f"done in {time.monotonic() - t0:.0f} s; project commit {info['project']['commit'][:10]}"
        f"{' (with uncommitted changes: the working tree travels as it is)' if info['project']['dirty'] else ''}; "
        "next: docs/operations/gpu-proof.md (two calls)")
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.gpu.bundle",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer-dir", type=Path, default=None)
    parser.add_argument("--keep-sm", type=int, nargs="+", default=[90],
                        help="GPU archs whose machine code stays (90: H100, H200)")
    args = parser.parse_args(argv)
    try:
        build(find_tokenizer(args.tokenizer_dir), set(args.keep_sm))
    except parts.BundleTooLarge as error:
        for folder in (STAGE_FOLDER, RUN_FOLDER):  # a half bundle must not be carried
            shutil.rmtree(ROOT / folder, ignore_errors=True)
        say(f"REFUSED: {error}; {STAGE_FOLDER} and {RUN_FOLDER} removed")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
