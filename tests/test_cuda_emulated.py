"""The real CUDA kernel source, run on the CPU: ``tests/cuda_emu`` emulates the CUDA features the
kernels use (threads as cooperative fibers with block and warp barriers, shuffles, ballot, dp4a,
shared memory, the launch limits), so the standalone harness checks the kernels' indexing, tile
grouping, staging layouts and reductions against its host reference without a GPU.

It checks logic, not timing or memory-model details a GPU adds (races between real concurrent
threads are invisible to fibers that switch only at sync points). The kernel file is used as is,
except two mechanical rewrites a host compiler needs: ``kern<<<grid, block, smem, stream>>>(args)``
becomes ``emu::launch(kern, grid, block, smem, stream, args)`` and ``extern __shared__`` becomes the
emulator's per-block dynamic shared memory.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from moespec import paths
from moespec.kernels.build import CSRC

CUDA_DIR = CSRC / "cuda"
EMU_INCLUDE = paths.ROOT / "tests" / "cuda_emu" / "include"


def emulated_source(text: str) -> str:
    """The kernel file with its launches and dynamic shared memory in the emulator's terms."""
    text, n_shared = re.subn(r"extern __shared__ int4 (\w+)\[\];",
                             r"int4* \1 = static_cast<int4*>(emu::dyn_smem());", text)
    text, n_launch = re.subn(r"(\w+)<<<(.*?)>>>\((.*?)\);", r"emu::launch(\1, \2, \3);", text)
    assert n_shared >= 2 and n_launch >= 2, (n_shared, n_launch)
    return text


@pytest.fixture(scope="module")
def emulated_harness(tmp_path_factory):
    cxx = shutil.which("g++")
    if cxx is None:
        pytest.skip("g++ not found")
    out = tmp_path_factory.mktemp("cuda_emu")
    src = out / "expert_kernels_emu.cpp"
    src.write_text(emulated_source((CUDA_DIR / "expert_kernels.cu").read_text()))
    exe = out / "standalone_check_emu"
    # _FORTIFY_SOURCE's longjmp check rejects the emulator's jumps between fiber stacks
    proc = subprocess.run([cxx, "-std=c++20", "-O2", "-U_FORTIFY_SOURCE", "-w", f"-I{EMU_INCLUDE}", f"-I{CUDA_DIR}",
                           "-x", "c++", str(CUDA_DIR / "tools" / "standalone_check.cu"), "-x", "c++", str(src),
                           "-o", str(exe)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return exe


def test_kernels_pass_the_harness_under_emulation(emulated_harness):
    proc = subprocess.run([str(emulated_harness), "--small"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "ALL PASSED" in out
    # every small case ran both kernels and compared them bitwise
    assert out.count("slot and dedup outputs bitwise equal") >= 10
    for name in ("scalar path", "same experts n=20", "all distinct m=1", "N=m+1", "invalid id -> NaN",
                 "ragged"):
        assert name in out, f"case {name!r} did not run"


def test_emulated_source_rewrites():
    text = "extern __shared__ int4 smem4[];\nkern<<<grid, kThreads, smem, stream>>>(p);\n" * 2
    out = emulated_source(text)
    assert "emu::launch(kern, grid, kThreads, smem, stream, p);" in out
    assert "emu::dyn_smem()" in out and "<<<" not in out
