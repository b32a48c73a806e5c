#!/usr/bin/env python3
"""Deliberate bugs in the CUDA kernels must make the emulated harness fail.

For each mutation below (one small edit of one kernel source, each a mistake the fused or legacy
path could plausibly contain), the kernels are rebuilt for the CPU emulation (tests/cuda_emu) with
that edit alone and the torch-free harness (tools/standalone_check.cu --small) runs until its first
failing case. A mutation the harness does not catch is a hole in the tests. Prints one line per
mutation and exits 1 if any survives. About a minute per mutation on a 2-core machine (mostly the
build); not part of `make test`.

    python scripts/cuda_emu_mutants.py                 # all
    python scripts/cuda_emu_mutants.py pdl-wait-late   # some, by name
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "cuda_emu"))
from emulation import CUDA_DIR, build_emulated  # noqa: E402


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str
    old: str
    new: str
    what: str


MUTATIONS = (
    # --- legacy path (the three kinds checked before the fused path existed) ---
    Mutation("legacy-smem-plane", "expert_common.cuh",
             "const int c = k / kQBlock, q = (k % kQBlock) / 16, r = k % 16;",
             "const int c = k / kQBlock, q = 1 - (k % kQBlock) / 16, r = k % 16;",
             "int8 activations staged into the wrong shared-memory plane"),
    Mutation("legacy-missing-sync", "expert_common.cuh",
             "      xs[VEC ? xs_index<F>(t, k, K) : idx] = F::round_act(v);\n    }\n  }\n  __syncthreads();",
             "      xs[VEC ? xs_index<F>(t, k, K) : idx] = F::round_act(v);\n    }\n  }\n  if (F::kInt8) __syncthreads();",
             "no barrier after staging f32/bf16 activations (legacy)"),
    Mutation("smem-opt-in-skipped", "expert_kernels.cu",
             "  if (smem <= 48 * 1024) return cudaSuccess;",
             "  if (smem <= 480 * 1024) return cudaSuccess;",
             "the >48 KiB dynamic shared-memory opt-in never made"),
    # --- fused path ---
    Mutation("pdl-wait-late", "fused_kernels.cuh",
             "  pdl_wait();  // from here on: gate/up's h and flags are complete and visible\n",
             "",
             "down kernel reads gate/up's output without waiting for it (programmatic dependent launch)"),
    Mutation("ring-wait-one-short", "fused_kernels.cuh",
             "    cp_async_wait(S - 1);  // stage g has landed",
             "    cp_async_wait(S);  // stage g has landed",
             "gate/up consumes a ring stage before its copies have landed"),
    Mutation("ring-issue-off-by-one", "fused_kernels.cuh",
             "  for (int g = 0; g < nst; ++g) {\n    issue(g + S - 1);\n    cp_async_wait(S - 1);\n    const int w = g / spt",
             "  for (int g = 0; g < nst; ++g) {\n    issue(g + S);\n    cp_async_wait(S - 1);\n    const int w = g / spt",
             "down kernel issues each stage one slot too far ahead (skips one)"),
    Mutation("stage-x-no-barrier", "expert_common.cuh",
             "          *reinterpret_cast<uint2*>(reinterpret_cast<uint16_t*>(smem) + (size_t)t * K + k) = uint2{lo, hi};\n        }\n      }\n    }\n  }\n  __syncthreads();",
             "          *reinterpret_cast<uint2*>(reinterpret_cast<uint16_t*>(smem) + (size_t)t * K + k) = uint2{lo, hi};\n        }\n      }\n    }\n  }\n  if (F::kInt8) __syncthreads();",
             "no barrier after the fused path's vectorized f32/bf16 staging"),
    Mutation("int8-nan-unflagged", "expert_common.cuh",
             "          if (bad) flags[t] = 1;",
             "",
             "int8 staging drops the non-finite flag (a NaN in x would give a finite row)"),
    Mutation("flags-unwritten", "fused_kernels.cuh",
             "  if (rb == 0 && tid < T) p.flags[ts.pairs[tid]] = flags[tid];",
             "",
             "fused gate/up never publishes its pairs' non-finite flags"),
    Mutation("combine-slot-order", "fused_kernels.cuh",
             "      for (int s = 0; s < p.m; ++s) {\n        const int q = t * p.m + s;",
             "      for (int s = p.m - 1; s >= 0; --s) {\n        const int q = t * p.m + s;",
             "fused combine sums a token's slots in reverse order (bits differ from legacy)"),
    Mutation("int8-h-block-offset", "fused_kernels.cuh",
             "      const int pair = ts.pairs[t], i = row0 + b * kQBlock + lane;",
             "      const int pair = ts.pairs[t], i = row0 + b * kQBlock + (lane ^ 1);",
             "fused int8 h quantized values written to neighbouring positions"),
    Mutation("dedup-tile-count", "fused_kernels.cuh",
             "          tc[bt] = min(p.tile, cnt[e] - k * p.tile);",
             "          tc[bt] = min(p.tile - 1, cnt[e] - k * p.tile);",
             "down kernel's full dedup tiles lose their last pair"),
    Mutation("bf16-h-unrounded", "fused_kernels.cuh",
             "            else static_cast<uint16_t*>(p.hs)[at] = float_to_bf16_bits(hv);",
             "            else static_cast<uint16_t*>(p.hs)[at] = (uint16_t)(float_to_bits(hv) >> 16);",
             "fused bf16 h truncated instead of rounded to nearest even"),
)


def run(mut: Mutation, workdir: Path) -> tuple[bool, str]:
    """(caught, detail): build with the mutation, run the harness until its first failure."""
    src = (CUDA_DIR / mut.file).read_text()
    if src.count(mut.old) != 1:
        return False, f"mutation does not apply: {mut.old[:60]!r} found {src.count(mut.old)} times in {mut.file}"
    try:
        exe, _ = build_emulated(workdir, {mut.file: src.replace(mut.old, mut.new)})
    except RuntimeError as exc:
        return True, f"does not compile: {str(exc).splitlines()[-1][:100]}"
    proc = subprocess.Popen(["stdbuf", "-oL", str(exe), "--small"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    first_fail = None
    for line in proc.stdout:
        if line.startswith("FAIL") or "deadlock" in line or "cuda emulation:" in line:
            first_fail = line.strip()
            proc.kill()
            break
    rc = proc.wait()
    if first_fail:
        return True, first_fail[:120]
    return rc != 0, f"harness exit status {rc}" if rc else "harness passed"


def main(argv: list[str]) -> int:
    chosen = [m for m in MUTATIONS if not argv or m.name in argv]
    unknown = set(argv) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"unknown mutations {sorted(unknown)}; known: {[m.name for m in MUTATIONS]}", file=sys.stderr)
        return 2
    survived = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, mut in enumerate(chosen):
            t0 = time.time()
            caught, detail = run(mut, Path(tmp) / str(i))
            print(f"{'caught  ' if caught else 'SURVIVED'} {mut.name:<24} {time.time() - t0:5.0f} s  {mut.what}\n"
                  f"         -> {detail}", flush=True)
            if not caught:
                survived.append(mut.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} deliberate bugs caught"
          + (f"; survived: {', '.join(survived)}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
