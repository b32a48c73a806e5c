"""Build ggml's CPU backend from the llama-cpp-python sdist and our driver over it (the ggml peer).

    .venv/bin/python benchmarks/ggml_peer/build.py            # fetch, verify, build; prints the .so
    .venv/bin/python benchmarks/ggml_peer/build.py --jobs 2   # more compile jobs (default 1)

Steps, each skipped when already done (idempotent), all under ``paths.build_dir() / "ggml"``:

1. ``pip download`` the pinned llama-cpp-python sdist (it vendors llama.cpp and ggml; PyPI is the
   only source reachable here) into ``sdist/`` and check its sha256 against :data:`SDIST_SHA256`.
2. Extract only ``vendor/llama.cpp/ggml/`` and llama.cpp's ``LICENSE`` into ``src/``.
3. cmake-configure ggml alone (ggml-base + ggml-cpu, static, PIC, ``GGML_NATIVE=ON`` so this CPU's
   AVX-512/VNNI/BF16 paths are compiled in, OpenMP as ggml defaults, no BLAS/GPU backends, no tests
   or examples) and build it with ``nice -n 19`` and one job.
4. Compile ``driver.cpp`` and link it with the two static libraries into ``libggml_peer.so``.

Nothing here runs at import of moespec; ``peer.py`` only loads the finished library.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from moespec import paths

HERE = Path(__file__).resolve().parent

SDIST_VERSION = "0.3.36"  # vendors llama.cpp ggml-org/llama.cpp@0c1e57098 (its CHANGELOG), ggml 0.25.3
SDIST_NAME = f"llama_cpp_python-{SDIST_VERSION}.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
_VENDOR = f"llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp/"
DRIVER = HERE / "driver.cpp"
LIB_NAME = "libggml_peer.so"
CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",  # the static archives go into our shared library
    "-DGGML_NATIVE=ON",
    "-DGGML_OPENMP=ON",
    "-DGGML_LLAMAFILE=ON",  # as llama.cpp's own build sets it (used by MUL_MAT, not MUL_MAT_ID)
    "-DGGML_BACKEND_DL=OFF",
    "-DGGML_CPU_ALL_VARIANTS=OFF",
    "-DGGML_BLAS=OFF", "-DGGML_CUDA=OFF", "-DGGML_METAL=OFF", "-DGGML_VULKAN=OFF",
    "-DGGML_OPENCL=OFF", "-DGGML_SYCL=OFF", "-DGGML_HIP=OFF", "-DGGML_RPC=OFF",
    "-DGGML_BUILD_TESTS=OFF", "-DGGML_BUILD_EXAMPLES=OFF",
]


class PeerBuildError(RuntimeError):
    """The ggml peer could not be built; the message names what is missing or what failed."""


def root() -> Path:
    """Everything the build writes: ``build/ggml/`` (``MOESPEC_BUILD`` moves ``build/``)."""
    return paths.build_dir() / "ggml"


def library_path() -> Path:
    return root() / LIB_NAME


def ggml_source() -> Path:
    return root() / "src" / "ggml"


# ggml is configured as a subproject, the way llama.cpp's own CMakeLists.txt builds it (the sdist
# lacks ggml.pc.in, which only a standalone ggml configure needs).
WRAPPER_CMAKE = """cmake_minimum_required(VERSION 3.14)
project(moespec_ggml_peer C CXX)
add_subdirectory(ggml)
"""


def missing_tools() -> list[str]:
    """The programs a build needs and cannot find on PATH."""
    need = {"cmake": "cmake (apt-get install cmake, or pip install cmake)",
            os.environ.get("CC", "cc"): "a C compiler (set CC or install gcc)",
            os.environ.get("CXX", "c++"): "a C++ compiler (set CXX or install g++)",
            "nice": "nice (coreutils)"}
    return [why for tool, why in need.items() if shutil.which(tool) is None]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _run(cmd: list[str], what: str, log: Path, **kw) -> None:
    """Run ``cmd`` (output to ``log``); a failure raises with the log's tail."""
    with log.open("w") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, **kw)
    if rc != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise PeerBuildError(f"{what} failed (exit {rc}); full log {log}; last lines:\n{tail}")


def fetch_sdist() -> Path:
    """The verified sdist, downloaded with pip from PyPI when absent."""
    dest = paths.ensure(root() / "sdist")
    sdist = dest / SDIST_NAME
    if not sdist.exists():
        print(f"downloading llama-cpp-python=={SDIST_VERSION} sdist from PyPI into {dest}", flush=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               f"llama-cpp-python=={SDIST_VERSION}", "-d", str(dest)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not sdist.exists():
            raise PeerBuildError(
                f"pip download of llama-cpp-python=={SDIST_VERSION} failed (is PyPI reachable? "
                f"network or proxy?): {' '.join(cmd)}\n{(proc.stdout + proc.stderr)[-2000:]}")
    digest = _sha256(sdist)
    if digest != SDIST_SHA256:
        raise PeerBuildError(f"{sdist}: sha256 {digest}, expected {SDIST_SHA256}; delete the file "
                             "if it is a broken download (a changed upload would need a new pin)")
    return sdist


def extract(sdist: Path) -> Path:
    """Extract ggml (and llama.cpp's LICENSE) from the sdist; returns the ggml source folder."""
    src = root() / "src"
    stamp = src / ".extracted"
    if stamp.exists() and stamp.read_text() == SDIST_SHA256:
        return ggml_source()
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.name.startswith(_VENDOR + "ggml/") or m.name == _VENDOR + "LICENSE"]
        if not any(m.name.startswith(_VENDOR + "ggml/CMakeLists.txt") for m in members):
            raise PeerBuildError(f"{sdist} holds no {_VENDOR}ggml/CMakeLists.txt")
        for m in members:
            m.name = m.name[len(_VENDOR):]
        tar.extractall(src, members=members, filter="data")
    (src / "CMakeLists.txt").write_text(WRAPPER_CMAKE)
    stamp.write_text(SDIST_SHA256)
    return ggml_source()


def static_libs(bdir: Path) -> list[Path]:
    """ggml-cpu before ggml-base: the link order static archives need."""
    return [bdir / "ggml" / "src" / "libggml-cpu.a", bdir / "ggml" / "src" / "libggml-base.a"]


def build_ggml(source: Path, jobs: int) -> Path:
    """Configure and build ggml-base and ggml-cpu (static); returns the cmake build folder."""
    bdir = root() / "cmake"
    libs = static_libs(bdir)
    stamp = bdir / ".built"
    key = f"{SDIST_SHA256} {' '.join(CMAKE_FLAGS)}"
    if stamp.exists() and stamp.read_text() == key and all(p.exists() for p in libs):
        return bdir
    bdir.mkdir(parents=True, exist_ok=True)
    # ggml asks git for its commit; our build folder sits inside moespec's repository, whose
    # commit it would report, so git is stopped at the build folder.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(root()))
    print(f"configuring ggml in {bdir}", flush=True)
    _run(["cmake", "-S", str(source.parent), "-B", str(bdir), *CMAKE_FLAGS], "cmake configure of ggml",
         root() / "configure.log", env=env)
    print(f"building ggml-base + ggml-cpu with nice -n 19, {jobs} job(s) (a few minutes)", flush=True)
    t0 = time.time()
    _run(["nice", "-n", "19", "cmake", "--build", str(bdir), "--target", "ggml-base", "ggml-cpu",
          "-j", str(jobs)], "building ggml", root() / "build.log", env=env)
    missing = [str(p) for p in libs if not p.exists()]
    if missing:
        raise PeerBuildError(f"ggml build finished but left no {missing}; see {root() / 'build.log'}")
    print(f"ggml built in {time.time() - t0:.0f} s", flush=True)
    stamp.write_text(key)
    return bdir


def build_driver(source: Path, bdir: Path) -> Path:
    """Compile driver.cpp and link it with ggml's static libraries into ``libggml_peer.so``."""
    lib = library_path()
    cxx = os.environ.get("CXX", "c++")
    tmp = lib.with_suffix(".so.tmp")
    cmd = ["nice", "-n", "19", cxx, "-O2", "-std=c++17", "-fPIC", "-shared", "-fopenmp",
           f"-I{source / 'include'}", str(DRIVER), "-o", str(tmp),
           *map(str, static_libs(bdir)),
           "-fopenmp", "-lpthread", "-lm", "-Wl,--no-undefined"]
    # rebuilt when the driver's source, the command or ggml's build changed (content, not mtime)
    key = hashlib.sha256(DRIVER.read_bytes() + " ".join(cmd).encode()
                         + (bdir / ".built").read_bytes()).hexdigest()
    stamp = lib.with_suffix(".so.stamp")
    if lib.exists() and stamp.exists() and stamp.read_text() == key:
        return lib
    _run(cmd, "compiling driver.cpp", root() / "driver.log")
    os.replace(tmp, lib)
    stamp.write_text(key)
    return lib


def build(jobs: int = 1) -> Path:
    """Everything above, skipping finished steps; returns the path of ``libggml_peer.so``."""
    missing = missing_tools()
    if missing:
        raise PeerBuildError("cannot build the ggml peer: missing " + "; ".join(missing))
    source = extract(fetch_sdist())
    bdir = build_ggml(source, jobs)
    return build_driver(source, bdir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=1, help="compile jobs for ggml (default 1)")
    args = ap.parse_args(argv)
    t0 = time.time()
    try:
        lib = build(args.jobs)
    except PeerBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"ggml peer library: {lib}  ({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
