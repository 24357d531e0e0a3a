"""Does the `cuda` image hold every library ONNX Runtime's CUDA provider links against?

  python -m devtools.cuda_image [--dockerfile Dockerfile] [--provider PATH]

No engine, no GPU, no registry: it reads the Dockerfile's CUDA base (`ARG CUDA_BASE`, an
`nvidia/cuda:<major>.<minor>.<patch>-<flavour>-<os>` tag), knows what that flavour of
NVIDIA's images ships for that CUDA major version, and compares it with the NEEDED entries
of the installed onnxruntime-gpu's `libonnxruntime_providers_cuda.so` (its ELF dynamic
section). A soname that nothing provides is a worker that cannot start on CUDA: ORT then
falls back to the CPU, and ortserve's worker refuses to start. Exit 0 when everything
resolves; 1 with the missing sonames on stderr. tests/unit/repo/test_cuda_image.py runs it.

Why a table and not the image: no registry is reachable where the tests run, so the image
cannot be pulled; the table below is what NVIDIA's image recipes install
(gitlab.com/nvidia/container-images/cuda: `base` has the runtime, `runtime` adds the math
libraries, `cudnn-*` adds cuDNN, `devel` is `runtime` plus the toolkit).
"""

from __future__ import annotations

import argparse
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

# The driver's library: the NVIDIA container toolkit mounts it into the container at run time.
DRIVER = frozenset({"libcuda.so.1"})
# glibc and the C++ runtime: every Ubuntu/Debian base has them.
SYSTEM = frozenset({"libc.so.6", "libm.so.6", "libdl.so.2", "librt.so.1", "libpthread.so.0",
                    "libstdc++.so.6", "libgcc_s.so.1", "ld-linux-x86-64.so.2"})
_TAG = re.compile(r"^(?:[\w.-]+/)?nvidia/cuda:(\d+)\.(\d+)(?:\.(\d+))?-([a-z0-9-]+?)-"
                  r"(ubuntu|rockylinux|ubi)[\w.]*$")


@dataclass(frozen=True)
class CudaBase:
    """One NVIDIA CUDA image tag, as the Dockerfile names it."""

    tag: str
    major: int
    flavour: str  # base, runtime, cudnn-runtime, devel, cudnn-devel

    def provides(self) -> frozenset[str]:
        """The CUDA sonames this image ships (those ORT's CUDA provider may link against)."""
        m = self.major
        found = {f"libcudart.so.{m}"}
        if self.flavour != "base":
            # cuRAND kept soname 10 from CUDA 11 through 13; cuFFT is 11 in CUDA 12, 12 in 13.
            found |= {f"libcublas.so.{m}", f"libcublasLt.so.{m}", "libcurand.so.10",
                      f"libnvrtc.so.{m}", f"libcufft.so.{11 if m == 12 else 12}"}
        if self.flavour.startswith("cudnn"):
            found.add("libcudnn.so.9")
        return frozenset(found)


def parse_cuda_base(tag: str) -> CudaBase:
    match = _TAG.match(tag.strip())
    if match is None:
        raise ValueError(f"CUDA_BASE {tag!r} is not an nvidia/cuda:<major>.<minor>.<patch>-"
                         "<flavour>-<os> tag; this check reads only NVIDIA's CUDA images")
    flavour = match.group(4)
    if flavour not in ("base", "runtime", "cudnn-runtime", "devel", "cudnn-devel"):
        raise ValueError(f"CUDA_BASE {tag!r}: unknown flavour {flavour!r} "
                         "(base, runtime, cudnn-runtime, devel, cudnn-devel)")
    return CudaBase(tag.strip(), int(match.group(1)), flavour)


def dockerfile_cuda_base(text: str) -> CudaBase:
    """The default of `ARG CUDA_BASE=...` in a Dockerfile's text."""
    match = re.search(r"^ARG\s+CUDA_BASE=(\S+)", text, re.MULTILINE)
    if match is None:
        raise ValueError("the Dockerfile has no `ARG CUDA_BASE=<image>` line")
    return parse_cuda_base(match.group(1))


def needed_sonames(library: Path) -> list[str]:
    """The DT_NEEDED entries of a 64-bit little-endian ELF shared library, in order.

    Reads only the section headers, the dynamic section and its string table (the CUDA
    provider is ~300 MB; its headers are a few KiB)."""
    with open(library, "rb") as f:
        ident = f.read(64)
        if ident[:4] != b"\x7fELF" or ident[4] != 2 or ident[5] != 1:
            raise ValueError(f"{library} is not a 64-bit little-endian ELF file")
        shoff, = struct.unpack_from("<Q", ident, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", ident, 0x3A)
        f.seek(shoff)
        table = f.read(shentsize * shnum)
        # name, type, flags, addr, offset, size, link, info, addralign, entsize
        headers = [struct.unpack_from("<IIQQQQIIQQ", table, i * shentsize) for i in range(shnum)]
        dynamic = [h for h in headers if h[1] == 6]  # SHT_DYNAMIC
        if not dynamic:
            return []
        _, _, _, _, offset, size, link, *_ = dynamic[0]
        f.seek(offset)
        entries = f.read(size)
        strtab = headers[link]
        f.seek(strtab[4])
        strings = f.read(strtab[5])
    names = []
    for tag, value in struct.iter_unpack("<qQ", entries):
        if tag == 0:  # DT_NULL ends the table
            break
        if tag == 1:  # DT_NEEDED: an offset into the dynamic string table
            names.append(strings[value:strings.index(b"\0", value)].decode())
    return names


def provider_library() -> Path:
    """The installed onnxruntime-gpu's CUDA provider (found without importing onnxruntime)."""
    from importlib.util import find_spec

    spec = find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("onnxruntime is not installed in this Python")
    path = Path(next(iter(spec.submodule_search_locations))) / "capi" / \
        "libonnxruntime_providers_cuda.so"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: this onnxruntime is the CPU package "
                                "(onnxruntime-gpu has wheels for Linux x86-64 only)")
    return path


def missing(base: CudaBase, needed: list[str]) -> list[str]:
    """The needed sonames that neither the image, the driver nor the OS provides."""
    have = base.provides() | DRIVER | SYSTEM
    return [name for name in needed if name not in have]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.cuda_image",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dockerfile", type=Path, default=Path("Dockerfile"))
    parser.add_argument("--provider", type=Path, default=None,
                        help="the CUDA provider library (default: the installed onnxruntime's)")
    args = parser.parse_args(argv)
    base = dockerfile_cuda_base(args.dockerfile.read_text())
    library = args.provider or provider_library()
    needed = needed_sonames(library)
    gone = missing(base, needed)
    print(f"cuda_image: {base.tag} (CUDA {base.major}, {base.flavour}) provides "
          f"{', '.join(sorted(base.provides()))}; {library.name} needs {', '.join(needed)}",
          file=sys.stderr)
    if gone:
        print(f"cuda_image: MISSING in the cuda image: {', '.join(gone)}. Move ARG CUDA_BASE in "
              f"{args.dockerfile} to an nvidia/cuda image of the CUDA major version these "
              "sonames carry (a `runtime` flavour or richer)", file=sys.stderr)
        return 1
    print("cuda_image: every library the CUDA provider needs resolves in the image",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
