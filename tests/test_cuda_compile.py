"""The CUDA kernel sources compile with nvcc wherever nvcc is present (no GPU needed).

Compiled once per test session: the plain kernels to one object with code for sm_80 and sm_90
(plus sm_90 PTX), the torch-free standalone harness linked against it, and the torch binding
checked for syntax against torch's headers. On a machine with a GPU the harness also runs
(``@pytest.mark.cuda``). Skipped with the reason when nvcc is absent.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

from moespec.kernels.build import CSRC

CUDA_DIR = CSRC / "cuda"
KERNEL_SOURCES = sorted(p for p in CUDA_DIR.glob("*") if p.suffix in (".cu", ".cuh", ".h"))
HARNESS = CUDA_DIR / "tools" / "standalone_check.cu"
BENCH = CUDA_DIR / "tools" / "bench_standalone.cu"
ARCHS = ("80", "90")


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME / /usr/local/cuda."""
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").exists():
            return str(Path(home) / "bin" / "nvcc")
    return None


NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found (no CUDA toolkit on PATH, $CUDA_HOME or /usr/local/cuda)")


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="session")
def cuda_build(tmp_path_factory):
    """Compile everything once: returns a dict of results (paths, nvcc outputs)."""
    out = tmp_path_factory.mktemp("cuda_build")
    gencode = []
    for arch in ARCHS:
        gencode += ["-gencode", f"arch=compute_{arch},code=sm_{arch}"]
    gencode += ["-gencode", f"arch=compute_{ARCHS[-1]},code=compute_{ARCHS[-1]}"]  # PTX for newer GPUs
    obj = out / "expert_kernels.o"
    keep = out / "keep"  # the PTX of each architecture stays here
    keep.mkdir()
    kern = _run([NVCC, "-std=c++17", "-O3", "-Xptxas", "-v", *gencode, "-keep", "-keep-dir", str(keep), "-c",
                 str(CUDA_DIR / "expert_kernels.cu"), "-o", str(obj)])
    res = {"obj": obj, "kernels": kern, "ptx": {a: keep / f"expert_kernels.compute_{a}.ptx" for a in ARCHS}}
    if kern.returncode == 0:
        exe = out / "standalone_check"
        res["harness"] = _run([NVCC, "-std=c++17", "-O2", f"-arch=sm_{ARCHS[-1]}", f"-I{CUDA_DIR}", str(HARNESS),
                               str(obj), "-o", str(exe)])
        res["exe"] = exe
        res["bench"] = _run([NVCC, "-std=c++17", "-O2", f"-arch=sm_{ARCHS[-1]}", f"-I{CUDA_DIR}", str(BENCH),
                             str(obj), "-o", str(out / "bench_standalone")])
    return res


def _fail_text(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n{proc.stderr[-4000:]}\n{proc.stdout[-2000:]}"


@needs_nvcc
def test_kernels_compile_for_sm80_and_sm90(cuda_build):
    kern = cuda_build["kernels"]
    assert kern.returncode == 0, _fail_text(kern)
    log = kern.stderr + kern.stdout
    for arch in ARCHS:  # ptxas reports every kernel it compiled, per architecture
        assert re.search(rf"Compiling entry function '\w*gate_up_kernel\w*' for 'sm_{arch}'", log), arch
        assert re.search(rf"Compiling entry function '\w*down_kernel\w*' for 'sm_{arch}'", log), arch
        assert re.search(rf"Compiling entry function '\w*gate_up_ring_kernel\w*' for 'sm_{arch}'", log), arch
        assert re.search(rf"Compiling entry function '\w*down_combine_kernel\w*' for 'sm_{arch}'", log), arch
    # legacy: 3 formats x 2 kernels, each phase with its vector and (f32/bf16) scalar variants
    entries = set(re.findall(r"Compiling entry function '(\w+)' for 'sm_90'", log))
    assert len([e for e in entries if "gate_up_kernel" in e]) >= 3 * 2 + 2 * 2, sorted(entries)
    # fused: 3 formats x 2 kernels, vector path only
    assert len([e for e in entries if "gate_up_ring_kernel" in e]) == 3 * 2, sorted(entries)
    assert len([e for e in entries if "down_combine_kernel" in e]) == 3 * 2, sorted(entries)
    assert cuda_build["obj"].stat().st_size > 0


@needs_nvcc
def test_fused_path_ptx_uses_async_copies_and_pdl(cuda_build):
    """The fused path's PTX wrappers (async_copy.cuh) reach the code: cp.async with L1 bypass and
    wait_group on sm_80 and sm_90; griddepcontrol (programmatic dependent launch) on sm_90 only,
    in every down + combine kernel (wait) and every fused gate/up kernel (launch_dependents)."""
    assert cuda_build["kernels"].returncode == 0
    ptx = {a: cuda_build["ptx"][a].read_text() for a in ARCHS}
    for arch, text in ptx.items():
        assert "cp.async.cg.shared.global" in text and "cp.async.wait_group" in text, arch
        assert "cp.async.commit_group" in text, arch
    assert ptx["90"].count("griddepcontrol.wait") == 6
    assert ptx["90"].count("griddepcontrol.launch_dependents") == 6
    assert "griddepcontrol" not in ptx["80"]


@needs_nvcc
def test_kernels_do_not_spill_much(cuda_build):
    """Register spills in the hot loop would cost bandwidth; ptxas states them per kernel."""
    log = cuda_build["kernels"].stderr + cuda_build["kernels"].stdout
    spills = [int(b) for b in re.findall(r"(\d+) bytes spill stores", log)]
    assert spills, "ptxas -v printed no spill statistics"
    assert max(spills) <= 64, f"a kernel spills {max(spills)} bytes"


@needs_nvcc
def test_c_api_symbols_exported(cuda_build):
    assert cuda_build["kernels"].returncode == 0
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("nm not found")
    syms = _run([nm, "-g", "--defined-only", str(cuda_build["obj"])]).stdout
    for name in ("moespec_cuda_expert_forward", "moespec_cuda_workspace_bytes", "moespec_cuda_dedup_tile",
                 "moespec_cuda_status_string"):
        assert re.search(rf"\b{name}\b", syms), f"{name} not exported (extern \"C\")"


@needs_nvcc
def test_standalone_harness_and_bench_link(cuda_build):
    assert cuda_build["kernels"].returncode == 0
    assert cuda_build["harness"].returncode == 0, _fail_text(cuda_build["harness"])
    assert cuda_build["exe"].exists()
    assert cuda_build["bench"].returncode == 0, _fail_text(cuda_build["bench"])


def test_kernel_sources_are_plain_cuda():
    """The kernels stay torch-free (a C launch API); only binding.cpp includes torch."""
    for src in KERNEL_SOURCES + [HARNESS, BENCH]:
        text = src.read_text()
        assert not re.search(r"#include\s*[<\"](torch|ATen|c10)/", text), f"{src.name} includes torch headers"
    assert "TORCH_LIBRARY_IMPL(moespec, CUDA" in (CUDA_DIR / "binding.cpp").read_text()


def test_binding_compiles_against_torch_headers(tmp_path):
    """binding.cpp passes a syntax check with the host compiler, torch's and CUDA's headers.
    CPU-only torch wheels lack one generated CUDA header; a stub stands in for it here."""
    cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    if NVCC is None:
        pytest.skip("no CUDA toolkit: cuda_runtime.h is needed")
    from torch.utils.cpp_extension import include_paths

    cuda_inc = Path(NVCC).resolve().parent.parent / "include"
    if not (cuda_inc / "cuda_runtime.h").exists():
        cuda_inc = Path("/usr/local/cuda/include")
    incs = list(include_paths())
    if not any((Path(p) / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").exists() for p in incs):
        stub = tmp_path / "c10" / "cuda" / "impl"
        stub.mkdir(parents=True)
        (stub / "cuda_cmake_macros.h").write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        incs.append(str(tmp_path))
    cmd = [cxx, "-std=c++17", "-fsyntax-only", *[f"-isystem{p}" for p in incs], f"-isystem{cuda_inc}",
           f"-I{sysconfig.get_paths()['include']}", str(CUDA_DIR / "binding.cpp")]
    proc = _run(cmd)
    assert proc.returncode == 0, _fail_text(proc)


@needs_nvcc
@pytest.mark.cuda
def test_standalone_harness_passes_on_gpu(cuda_build):
    """Runs only where a GPU is present: the kernels against the host reference, torch-free."""
    assert cuda_build["harness"].returncode == 0, _fail_text(cuda_build["harness"])
    proc = _run([str(cuda_build["exe"])])
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "ALL PASSED" in proc.stdout


def test_load_cuda_names_what_is_missing(monkeypatch):
    """On a CPU-only torch the CUDA build stops before compiling, naming the CPU-only torch."""
    import torch

    from moespec.kernels import ExtensionBuildError, build

    if torch.version.cuda is not None:
        pytest.skip("torch here is a CUDA build")
    monkeypatch.setattr(build, "_loaded", {"cpu": True})  # the CPU extension is not the subject here
    with pytest.raises(ExtensionBuildError, match="a CUDA build of torch .*CPU-only.*docs/cuda.md"):
        build.load_cuda()
    assert "a CUDA build of torch" in " ".join(build.missing_requirements(cuda=True))
    assert not torch.cuda.is_initialized()


def _struct_fields(header: str, name: str) -> list[str]:
    """Field names of ``typedef struct name {...} name;`` in declaration order."""
    body = re.search(rf"typedef struct {name} \{{(.*?)\}} {name};", header, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = decl.strip()
        if decl:
            names += [v.strip().lstrip("*") for v in re.sub(r"^(const )?[\w ]+?[ *]+(?=\w+\s*(,|$))", "", decl).split(",")]
    return names


def test_ctypes_mirror_matches_header():
    """moespec.kernels.cuda_api declares the C structs field for field (a reordered field would
    silently pass wrong values through ctypes)."""
    from moespec.kernels import cuda_api

    header = (CUDA_DIR / "moespec_cuda.h").read_text()
    for cname, cls in (("moespec_expert_args", cuda_api.ExpertArgs), ("moespec_cuda_tuning", cuda_api.Tuning),
                       ("moespec_cuda_plan", cuda_api.Plan)):
        assert _struct_fields(header, cname) == [f for f, _ in cls._fields_], cname
    assert re.search(r"MOESPEC_ERR_TUNING = (-\d+)", header).group(1) == str(cuda_api.ERR_TUNING)
    for name, value in cuda_api.PATHS.items():
        assert f"MOESPEC_PATH_{name.upper()} = {value}" in header


def test_pdl_kernel_keeps_shared_state_dynamic():
    """The down + combine kernel is a programmatic dependent launch: its blocks may be resident
    beside gate/up's, and under the CPU emulation they are alive together while gate/up runs, so
    it may use only dynamic shared memory (a static __shared__ variable would be one object for
    all blocks there)."""
    text = (CUDA_DIR / "fused_kernels.cuh").read_text()
    body = text[text.index("__device__ inline void build_tile_list"):]
    assert body.count("__shared__") == 1 and "extern __shared__ int4 smem4[];" in body


def test_headers_digest_follows_every_header(tmp_path, monkeypatch):
    """torch rebuilds an extension only when its sources or flags change; the headers' digest is in
    the flags, so editing any kernel header changes them."""
    import shutil as sh

    from moespec.kernels import build

    sh.copytree(CUDA_DIR, tmp_path / "cuda")
    monkeypatch.setattr(build, "CSRC", tmp_path)
    before = build.cuda_headers_digest()
    assert before == build.cuda_headers_digest()
    for name in ("fused_kernels.cuh", "moespec_cuda.h"):
        f = tmp_path / "cuda" / name
        f.write_text(f.read_text() + "\n// edited\n")
        after = build.cuda_headers_digest()
        assert after != before, name
        before = after
