"""A tiny stand-in for onnxruntime-gpu's wheel: an ELF file with a .nv_fatbin section whose
entries carry machine code for two GPU archs (the layout pack_ort.py reads)."""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

from devtools.gpu import manifest, pack_ort, parts

PAYLOAD_BYTES = 32


def fatbin(archs: list[int]) -> bytes:
    entries = b""
    for sm in archs:
        # kind, version, then 9 words: header size, padded size, ..., the 7th is the sm
        # arch (pack_ort's field 8), then 3 quads
        words = [64, PAYLOAD_BYTES, 0, 0, 0, 0, sm, 0, 0]
        entries += struct.pack("<HH" + "I" * 9 + "QQQ", 2, 1, *words, 0, 0, 0)
        entries += bytes([sm]) * PAYLOAD_BYTES
    header = struct.pack("<IHHQ", pack_ort.FATBIN_MAGIC, 1, 16, len(entries))
    return header + entries + bytes(8)  # padding after the fatbin


def elf_with_fatbin(archs: list[int]) -> bytes:
    names = b"\0.nv_fatbin\0.shstrtab\0"
    body = fatbin(archs)
    fat_off = 64
    str_off = fat_off + len(body)
    sh_off = str_off + len(names)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, sh_off)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 2)
    sections = b""
    for name, off, size in ((0, 0, 0), (1, fat_off, len(body)), (12, str_off, len(names))):
        sections += struct.pack("<IIQQQQIIQQ", name, 1, 0, 0, off, size, 0, 0, 1, 0)
    return bytes(header) + body + names + sections


def fake_wheel(folder: Path, archs: list[int]) -> Path:
    wheel = folder / "onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(pack_ort.PROVIDER, elf_with_fatbin(archs))
        z.writestr("onnxruntime/__init__.py", "__version__ = 'fake'\n")
    return wheel


def fake_bundle(tmp_path: Path) -> tuple[Path, Path]:
    """(.gpu-a, .gpu-b) as make gpu-bundle writes them, around the fake wheel packed and split
    across both; no wheels, no tokenizer."""
    packed = tmp_path / "ort.tar.zst"
    pack_ort.pack(fake_wheel(tmp_path, [90, 80]), packed, {90})
    stage, run = tmp_path / ".gpu-a", tmp_path / ".gpu-b"
    sizes = parts.split_sizes(packed.stat().st_size, packed.stat().st_size // 2 + 1, 10**9)
    dests = [stage / "ort.part_00", run / "ort.part_01"]
    parts.write_parts(packed, dests, sizes)
    entries = [manifest.part_entry(dests[0], "stage"), manifest.part_entry(dests[1], "run")]
    manifest.write(run, manifest.build(built_utc="now", project={"commit": "abc"},
                                       runtime={"requirement": "onnxruntime-gpu==1.31.1"},
                                       parts=entries, wheels=[], tokenizer=[], calls=[]))
    return stage, run
