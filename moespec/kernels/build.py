"""Lazy builds of the C++ (CPU) and CUDA extensions that register ``torch.ops.moespec.*``.

Nothing is compiled or touches CUDA at import: the first call of :func:`load_cpu` /
:func:`load_cuda` builds with ``torch.utils.cpp_extension.load`` and ninja into
``paths.build_dir()`` (cached there; later calls and processes reuse the build). When a build
cannot run, :class:`ExtensionBuildError` names what is missing (compiler, ninja, headers, nvcc).

Layout (as in pytorch/extension-cpp, one concern per file): ``csrc/cpu/`` holds the CPU extension,
every ``*.cpp`` there one translation unit of it (docs/kernels.md lists them: the dot kernels per
ISA, activation staging, the thread pool, the driver shared by both kernels, the instrumentation,
and ``registration.cpp``, which defines the op schemas with ``TORCH_LIBRARY(moespec, m)``);
``csrc/cuda/*.cu`` hold plain CUDA kernels and ``csrc/cuda/*.cpp`` a thin binding with
``TORCH_LIBRARY_IMPL(moespec, CUDA, m)``. The CUDA library is loaded after the CPU one, which owns
the schemas. Fake (meta) implementations
of the ops (:mod:`moespec.kernels.fake`) are registered with the schemas, so the ops also run under
FakeTensor and ``torch.compile``.

Where an extension is not optional (CI, ``make test``), ``MOESPEC_REQUIRE_BUILD=cpp`` (or
``cpp,cuda``) turns a failed build into an error everywhere: :func:`available` raises instead of
answering False, so no test can skip it and ``backend="auto"`` cannot fall back to torch.
``python -m moespec.kernels [cpp|cuda]`` builds up front and exits non-zero, with the
reason, when it cannot.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import zlib
from pathlib import Path

import torch

from moespec import paths
from moespec.kernels import fake

CSRC = Path(__file__).resolve().parent / "csrc"
CPU_SOURCES = sorted((CSRC / "cpu").glob("*.cpp"))
CPU_CFLAGS = ["-O3", "-fopenmp", "-std=c++17", "-fno-math-errno"]  # ISA paths use target attributes
_lock = threading.Lock()
_loaded: dict = {}  # "cpu": the extension module, "cuda": True once loaded
_errors: dict[str, str] = {}  # backend -> why it did not build or load (the last failure)
REQUIRE_ENV = "MOESPEC_REQUIRE_BUILD"


class ExtensionBuildError(RuntimeError):
    """The extension could not be built or loaded; the message says what is missing."""


def _compiler() -> str:
    return os.environ.get("CXX", "c++")


def missing_requirements(cuda: bool = False) -> list[str]:
    """What a build needs and cannot find: the C++ compiler, ninja, torch/Python headers, nvcc."""
    missing = []
    cxx = _compiler()
    if shutil.which(cxx) is None:
        missing.append(f"C++ compiler {cxx!r} (set CXX or install g++)")
    try:
        from torch.utils.cpp_extension import is_ninja_available
        ninja_ok = is_ninja_available()
    except Exception:  # pragma: no cover - torch without cpp_extension
        ninja_ok = False
    if not ninja_ok:
        missing.append("ninja (pip install ninja)")
    from torch.utils.cpp_extension import include_paths
    if not any((Path(p) / "torch" / "extension.h").exists() for p in include_paths()):
        missing.append("torch C++ headers (torch/extension.h; reinstall torch)")
    py_inc = sysconfig.get_paths().get("include")
    if not py_inc or not (Path(py_inc) / "Python.h").exists():
        missing.append(f"Python headers (Python.h under {py_inc}; install python3-dev)")
    if cuda:
        from torch.utils.cpp_extension import CUDA_HOME
        if torch.version.cuda is None:  # (a CPU-only torch also leaves CUDA_HOME unset)
            missing.append(f"a CUDA build of torch (torch {torch.__version__} is CPU-only; "
                           "install the CUDA wheel as docs/cuda.md says)")
        else:
            if CUDA_HOME is None or shutil.which(str(Path(CUDA_HOME) / "bin" / "nvcc")) is None:
                missing.append("nvcc / CUDA toolkit (set CUDA_HOME)")
            if not torch.cuda.is_available():  # touches CUDA only when a CUDA build is asked for
                missing.append("an NVIDIA GPU visible to torch (torch.cuda.is_available() is False)")
    return missing


def _elf_needed(path: Path) -> set[str] | None:
    """The shared libraries an ELF file names as NEEDED (``readelf -d``); None where readelf is
    absent or cannot read it."""
    readelf = shutil.which("readelf")
    if readelf is None:
        return None
    out = subprocess.run([readelf, "-d", str(path)], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return {line.split("[", 1)[1].split("]", 1)[0] for line in out.stdout.splitlines() if "(NEEDED)" in line}


_cxx_checked: dict[str, str | None] = {}


def cxx_runtime_problem() -> str | None:
    """Whether the C++ compiler torch's extension builder will use (``$CXX``, else ``c++``) links the
    C++ runtime statically into shared libraries, while torch links it dynamically: the extension
    then has its own copy of libstdc++, and a C++ exception thrown by an op (every bad-input check)
    crashes the process instead of raising. Seen on a GPU machine whose ``CXX`` was such a wrapper:
    a wrong-dtype call segfaulted; with the system g++ it raised. Probes by building a two-line
    shared library. Returns the problem in words, or None (also where it cannot tell: no compiler,
    no readelf, not Linux)."""
    cxx = _compiler()
    if cxx in _cxx_checked:
        return _cxx_checked[cxx]
    problem = None

    torch_lib = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    torch_needed = _elf_needed(torch_lib) if torch_lib.exists() else None
    compiler = shutil.which(cxx)
    if torch_needed and "libstdc++.so.6" in torch_needed and compiler:
        with tempfile.TemporaryDirectory() as tmp:
            src, lib = Path(tmp) / "probe.cpp", Path(tmp) / "probe.so"
            src.write_text('#include <stdexcept>\nvoid moespec_probe() { throw std::runtime_error("x"); }\n')
            built = subprocess.run([compiler, "-shared", "-fPIC", str(src), "-o", str(lib)], capture_output=True)
            needed = _elf_needed(lib) if built.returncode == 0 else None
            if needed is not None and "libstdc++.so.6" not in needed:
                problem = (f"the C++ compiler {cxx!r} links libstdc++ statically into shared libraries (torch "
                           "links it dynamically), so a C++ exception from an op, e.g. for a wrong dtype, would crash "
                           "the process; set CXX to a compiler that links it dynamically (e.g. CXX=/usr/bin/g++ "
                           "CC=/usr/bin/gcc)")
    _cxx_checked[cxx] = problem
    return problem


def _build(name: str, sources: list[Path], cuda: bool, python_module: bool = False, **kw):
    missing = missing_requirements(cuda=cuda)
    if missing:
        raise ExtensionBuildError(f"cannot build moespec extension {name!r}: missing " + "; ".join(missing))
    problem = cxx_runtime_problem()
    if problem:
        raise ExtensionBuildError(f"cannot build moespec extension {name!r}: {problem}")
    absent = [str(s) for s in sources if not s.exists()]
    if absent:
        raise ExtensionBuildError(f"cannot build {name!r}: source files missing: {absent}")
    from torch.utils.cpp_extension import load

    build = paths.ensure(paths.build_dir() / name)
    os.environ.setdefault("MAX_JOBS", "2")
    try:
        return load(name=name, sources=[str(s) for s in sources], build_directory=str(build),
                    is_python_module=python_module, verbose=bool(os.environ.get("MOESPEC_BUILD_VERBOSE")), **kw)
    except Exception as exc:  # compiler errors arrive as RuntimeError / CalledProcessError
        raise ExtensionBuildError(f"building moespec extension {name!r} in {build} failed: {exc}") from exc


def load_cpu():
    """Build (first time) and load the CPU extension; registers ``torch.ops.moespec.*`` and returns
    the extension module, whose ``expert_slot`` / ``expert_dedup`` call the same CPU functions
    directly (pybind11, without the dispatcher's boxed call)."""
    module = _loaded.get("cpu")
    if module is not None:
        return module
    with _lock:
        if _loaded.get("cpu") is None:
            stamp = f"-DMOESPEC_CPU_HEADERS={headers_digest('cpu')}"
            module = _build("moespec_cpu", CPU_SOURCES, cuda=False, python_module=True,
                            extra_cflags=CPU_CFLAGS + [stamp], extra_ldflags=["-fopenmp"])

            fake.register()
            _loaded["cpu"] = module
        return _loaded["cpu"]


def cuda_sources() -> list[Path]:
    return sorted((CSRC / "cuda").glob("*.cu")) + sorted((CSRC / "cuda").glob("*.cpp"))


def headers_digest(folder: str) -> str:
    """A digest of the headers (``*.cuh``, ``*.h``) of ``csrc/<folder>``. torch's extension builder
    decides whether to rebuild from the source files and flags only, so the digest goes into the
    flags: an edited header then rebuilds the extension instead of loading a stale one."""
    digest = 0
    for h in sorted((CSRC / folder).glob("*.cuh")) + sorted((CSRC / folder).glob("*.h")):
        digest = zlib.crc32(h.name.encode() + h.read_bytes(), digest)
    return f"{digest:08x}"


def cuda_headers_digest() -> str:
    """:func:`headers_digest` of the CUDA sources."""
    return headers_digest("cuda")


def load_cuda() -> None:
    """Build (first time) and load the CUDA implementations of the same ops (needs a GPU build of
    torch and nvcc). Loads the CPU extension first: it defines the op schemas."""
    load_cpu()
    with _lock:
        if _loaded.get("cuda"):
            return
        sources = cuda_sources()
        if not sources:
            raise ExtensionBuildError(f"no CUDA sources under {CSRC / 'cuda'}")
        stamp = f"-DMOESPEC_CUDA_HEADERS={cuda_headers_digest()}"
        _build("moespec_cuda", sources, cuda=True, extra_cflags=["-O3", "-std=c++17", stamp],
               extra_cuda_cflags=["-O3", "-std=c++17", stamp])
        _loaded["cuda"] = True


def required() -> set[str]:
    """The backends that must build here: ``MOESPEC_REQUIRE_BUILD`` (comma-separated ``cpp``,
    ``cuda``, ``ggml``; ``make test`` sets ``cpp,ggml``: the C++ extension, and the ggml peer that
    ``benchmarks/ggml_peer/build.py`` builds, whose tests then fail instead of skipping where it is
    missing). Unset or ``0``: none."""
    value = os.environ.get(REQUIRE_ENV, "").strip().lower()
    if value in ("", "0", "no", "none"):
        return set()
    names = {v.strip() for v in value.split(",") if v.strip()}
    unknown = names - {"cpp", "cuda", "ggml"}
    if unknown:
        raise ValueError(f"{REQUIRE_ENV} must list cpp, cuda and/or ggml (comma-separated) or be 0; found {value!r}")
    return names


def build_error(backend: str) -> str | None:
    """Why ``backend`` did not build or load in this process (None if it did or was not tried)."""
    return _errors.get(backend)


def available(backend: str) -> bool:
    """Whether ``backend`` ('cpp' or 'cuda') builds and loads here (builds it if needed). A failed
    build is remembered for the process (:func:`build_error`; it is not tried again) and answers
    False, unless the backend is :func:`required`: then the :class:`ExtensionBuildError` is raised."""

    if backend not in ("cpp", "cuda"):
        return backend == "torch"
    if _loaded.get("cpu" if backend == "cpp" else "cuda"):
        return True
    try:
        if backend in _errors:
            raise ExtensionBuildError(_errors[backend])
        if backend == "cpp":
            load_cpu()
        else:
            if not torch.cuda.is_available():
                raise ExtensionBuildError("no NVIDIA GPU visible to torch (torch.cuda.is_available() is False)")
            load_cuda()
    except ExtensionBuildError as exc:
        _errors[backend] = str(exc)
        if backend in required():
            raise ExtensionBuildError(f"{exc} ({REQUIRE_ENV}={os.environ.get(REQUIRE_ENV)} requires the {backend} "
                                      "extension)") from exc
        return False
    _errors.pop(backend, None)
    return True


def main(argv=None) -> int:
    """``python -m moespec.kernels [cpp|cuda]``: build (or load the cached build) now; print
    where it is, or the reason it failed, and exit 1 then. CI runs this before the tests."""

    parser = argparse.ArgumentParser(prog="python -m moespec.kernels", description="build the moespec extension now")
    parser.add_argument("backend", nargs="?", choices=("cpp", "cuda"), default="cpp")
    args = parser.parse_args(argv)
    try:
        if args.backend == "cpp":
            module = load_cpu()
            print(f"moespec: C++ extension ready: {module.__file__}")
        else:
            load_cuda()
            print(f"moespec: CUDA extension ready in {paths.build_dir() / 'moespec_cuda'}")
    except ExtensionBuildError as exc:
        print(f"moespec: the {args.backend} extension does not build: {exc}", file=sys.stderr)
        return 1
    return 0

