"""onnxruntime-gpu packed small enough for a GPU machine without network.

The wheel's CUDA provider holds machine code for every GPU generation (sm_75 ... sm_120):
219 MB of its 284 MB. A process loads only its GPU's, so the others' payloads are zeroed in
place (the fatbin headers stay, every offset stays), and the unpacked package tree is tar'ed
and zstd-compressed into one file: onnxruntime-gpu 1.31.1 for sm_90 (H100, H200) is ~74 MB
instead of 255. devtools/gpu/parts.py splits it into parts that fit the calls.

On the device (devtools/gpu/install.py): cat the parts | zstd -d | tar -C SITE -xf -.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PROVIDER = "onnxruntime/capi/libonnxruntime_providers_cuda.so"
FATBIN_MAGIC = 0xBA55ED50
# One fatbin entry's header: kind, version, header size, padded payload size, ..., sm arch.
_ENTRY = struct.Struct("<HHIIIIIIIIIQQQ")
ZSTD_LEVEL = 12


def elf_section(elf: bytes, name: str) -> tuple[int, int]:
    """(offset, size) of a named section of a 64-bit little-endian ELF file."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    for name_off, _type, _flags, _addr, off, size in headers:
        end = elf.index(b"\0", strtab + name_off)
        if elf[strtab + name_off:end].decode() == name:
            return off, size
    raise ValueError(f"no {name} section")


def zero_other_archs(lib: bytearray, keep_sm: set[int]) -> tuple[int, int]:
    """Zero every fatbin payload whose sm arch is not in keep_sm; (bytes zeroed, bytes kept)."""
    off, size = elf_section(bytes(lib), ".nv_fatbin")
    pos, end, zeroed, kept = off, off + size, 0, 0
    while pos < end:
        magic, _version, header, fat = struct.unpack_from("<IHHQ", lib, pos)
        if magic != FATBIN_MAGIC:  # padding between fatbins
            if lib[pos:pos + 8] != bytes(8):
                raise ValueError(f"unexpected bytes at fatbin offset {pos - off}: the "
                                 "format changed; pack_ort.py needs a look")
            pos += 8
            continue
        entry, last = pos + header, pos + header + fat
        while entry < last:
            fields = _ENTRY.unpack_from(lib, entry)
            entry_header, padded, sm = fields[2], fields[3], fields[8]
            payload = entry + entry_header
            if sm in keep_sm:
                kept += padded
            else:
                lib[payload:payload + padded] = bytes(padded)
                zeroed += padded
            entry = payload + padded
        if entry != last:
            raise ValueError("fatbin entries do not end where the header says: the format "
                             "changed; pack_ort.py needs a look")
        pos = last
    return zeroed, kept


def pack(wheel: Path, out: Path, keep_sm: set[int], zstd: str = "zstd") -> dict:
    """Unpack `wheel`, keep only keep_sm's machine code, write out (tar + zstd). Returns what
    it did, for the manifest."""
    with tempfile.TemporaryDirectory(prefix="pack-ort-") as tmp:
        tree = Path(tmp) / "tree"
        zipfile.ZipFile(wheel).extractall(tree)
        lib_path = tree / PROVIDER
        lib = bytearray(lib_path.read_bytes())
        zeroed, kept = zero_other_archs(lib, keep_sm)
        lib_path.write_bytes(lib)
        del lib
        with open(out, "wb") as packed:
            tar = subprocess.Popen(["tar", "-C", str(tree), "-cf", "-", "."],
                                   stdout=subprocess.PIPE)
            # --long: the zeroed runs and repeated kernels compress across a wide window
            subprocess.run([zstd, f"-{ZSTD_LEVEL}", "-T0", "--long=27", "-q", "-c"],
                           stdin=tar.stdout, stdout=packed, check=True)
            tar.stdout.close()
            if tar.wait() != 0:
                raise RuntimeError(f"tar of {tree} failed (exit {tar.returncode})")
    return {"wheel": wheel.name, "kept_sm": sorted(keep_sm),
            "machine_code_zeroed_bytes": zeroed, "machine_code_kept_bytes": kept,
            "packed_bytes": out.stat().st_size,
            "unpack": "cat the parts in order | zstd -d --long=27 | tar -C SITE -xf -"}


def zstd_binary() -> str:
    found = shutil.which("zstd")
    if found is None:
        sys.exit("pack_ort: no zstd on PATH; install it (Debian/Ubuntu: apt-get install zstd)")
    return found
