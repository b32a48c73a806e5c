"""Build moespec's CUDA kernel sources for the CPU emulation in ``tests/cuda_emu/include``.

The kernel files are used as they are, except two mechanical rewrites a host compiler needs:
``kern<<<grid, block, smem, stream>>>(args)`` becomes ``emu::launch(kern, grid, block, smem,
stream, args)`` and ``extern __shared__`` becomes the emulator's per-block dynamic shared memory.
Used by ``tests/test_cuda_emulated.py`` and by ``scripts/cuda_emu_mutants.py`` (which applies one
deliberate bug at a time and checks that the emulated harness then fails).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

EMU_DIR = Path(__file__).resolve().parent
EMU_INCLUDE = EMU_DIR / "include"
CUDA_DIR = EMU_DIR.parent.parent / "moespec" / "kernels" / "csrc" / "cuda"
SUFFIXES = (".cu", ".cuh", ".h")


def emulated_source(text: str) -> str:
    """One kernel source file with its launches and dynamic shared memory in the emulator's terms."""
    text = re.sub(r"extern __shared__ int4 (\w+)\[\];", r"int4* \1 = static_cast<int4*>(emu::dyn_smem());", text)
    return re.sub(r"(\w+)<<<(.*?)>>>\((.*?)\);", r"emu::launch(\1, \2, \3);", text)


def write_emulated_sources(dest: Path, replace: dict[str, str] | None = None) -> Path:
    """Every kernel source (``.cu``, ``.cuh``, ``.h`` of csrc/cuda) rewritten into ``dest``;
    ``replace`` maps a file name to a replacement text (before the rewrite). Returns the rewritten
    ``expert_kernels.cu``."""
    n_shared = n_launch = 0
    for src in sorted(CUDA_DIR.glob("*")):
        if src.suffix in SUFFIXES:
            text = (replace or {}).get(src.name, src.read_text())
            n_shared += len(re.findall(r"extern __shared__ int4 \w+\[\];", text))
            n_launch += len(re.findall(r"\w+<<<.*?>>>\(.*?\);", text))
            (dest / src.name).write_text(emulated_source(text))
    if n_shared < 4 or n_launch < 2:  # the legacy and the fused kernels
        raise RuntimeError(f"unexpected kernel sources: {n_shared} dynamic shared arrays, {n_launch} launches")
    return dest / "expert_kernels.cu"


def build_emulated(out: Path, replace: dict[str, str] | None = None, bench: bool = False) -> tuple[Path, Path]:
    """Compile the rewritten kernels for the CPU: the standalone harness linked against them, and a
    shared library for ctypes (with the emulator's controls, ``emu_api.cpp``); with ``bench`` also
    the standalone benchmark (``out/bench_standalone_emu``). Returns (harness, library). Raises
    RuntimeError with the compiler's message when a step fails, FileNotFoundError when g++ is
    missing."""
    cxx = shutil.which("g++")
    if cxx is None:
        raise FileNotFoundError("g++ not found")
    src_dir = out / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    write_emulated_sources(src_dir, replace)
    # _FORTIFY_SOURCE's longjmp check rejects the emulator's jumps between fiber stacks
    flags = ["-std=c++20", "-O2", "-U_FORTIFY_SOURCE", "-w", "-fPIC", f"-I{EMU_INCLUDE}", f"-I{src_dir}"]
    obj, api, exe, lib = out / "kernels.o", out / "emu_api.o", out / "standalone_check_emu", out / "libmoespec_cuda_emu.so"
    cmds = [[cxx, *flags, "-x", "c++", "-c", str(src_dir / "expert_kernels.cu"), "-o", str(obj)],
            [cxx, *flags, "-c", str(EMU_DIR / "emu_api.cpp"), "-o", str(api)],
            [cxx, *flags, "-x", "c++", str(CUDA_DIR / "tools" / "standalone_check.cu"), "-x", "none", str(obj),
             "-o", str(exe)],
            [cxx, "-shared", str(obj), str(api), "-o", str(lib)]]
    if bench:  # the benchmark launches kernels of its own: rewritten too
        bench_src = src_dir / "bench_standalone.cu"
        bench_src.write_text(emulated_source((CUDA_DIR / "tools" / "bench_standalone.cu").read_text()))
        cmds.append([cxx, *flags, f"-I{CUDA_DIR / 'tools'}", "-x", "c++", str(bench_src), "-x", "none", str(obj),
                     "-o", str(out / "bench_standalone_emu")])
    for cmd in cmds:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} ... failed:\n{proc.stderr[-4000:]}")
    return exe, lib
