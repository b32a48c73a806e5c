#!/usr/bin/env python3
"""Launch plans of the CUDA kernels on an sm_90 GPU with a given SM count, without a GPU.

Builds the kernels for the CPU emulation (tests/cuda_emu), makes the emulated device an sm_90 with
``--sms`` SMs (shared memory: 227 KiB per block, 228 KiB per SM, as H100/H200), and asks the real
planning code (moespec_cuda_get_plan) how each preset, format, kernel and pass size would run:
path, grids, dynamic shared memory, ring depths. From the plan it derives the resident blocks per
SM that shared memory, the grid and the 2048 threads of an SM allow (registers can lower it
further; see ptxas in docs/cuda.md) and the weight bytes each SM keeps in flight in the fused path's rings:
blocks/SM x warps x (ring - 1) x stage bytes (gate/up: 4 rows x 512 B, int8 2x plus scales; down:
2 rows x 2 chunks x 512 B, int8 2 rows x 1 chunk x 1152 B). Prints a markdown table
(docs/cuda.md quotes benchmarks/results/cuda_plans_sm90_132.md, made with the defaults).

    python scripts/cuda_plans.py [--sms 132] > benchmarks/results/cuda_plans_sm90_132.md
"""

from __future__ import annotations

import argparse
import ctypes
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "cuda_emu"))
sys.path.insert(0, str(ROOT))
from emulation import build_emulated  # noqa: E402

SMEM_PER_SM = 233472
RESERVE = 1024


def stage_bytes(fmt: str, phase: str) -> int:
    if phase == "gu":  # 4 rows (2 gate + 2 up) x one chunk per lane
        return 4 * 32 * (32 + 4) if fmt == "int8_b32" else 4 * 32 * 16
    return 2 * 32 * (32 + 4) if fmt == "int8_b32" else 2 * 2 * 32 * 16  # down: 2 rows x U chunks


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    args = ap.parse_args(argv)
    import torch

    from moespec.kernels import ExpertWeights, cuda_api
    from moespec.model_shapes import PRESETS

    with tempfile.TemporaryDirectory() as tmp:
        _, lib_path = build_emulated(Path(tmp))
        lib = ctypes.CDLL(str(lib_path))
        lib.moespec_emu_set_device(9, 0, args.sms)
        cuda_api.set_tuning(lib, cuda_api.TuningChoice())
        print(f"Launch plans on an emulated sm_90 with {args.sms} SMs (default tuning; scripts/cuda_plans.py)\n")
        print("| preset | fmt | kernel | n | gate/up grid | smem gu (KiB) | ring gu | blocks/SM gu | in flight gu "
              "(KiB/SM) | down grid | smem dn (KiB) | ring dn | blocks/SM dn | in flight dn (KiB/SM) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, s in PRESETS.items():
            N, H, I, m = s.num_experts, s.hidden_size, s.expert_intermediate, s.top_k
            for fmt in ("f32", "bf16", "int8_b32"):
                # the plan reads the sizes, the format and the weights' alignment only: small tensors stand in
                w = _Shape(ExpertWeights.random((2, 32, 32), fmt), N, H, I)
                for kernel in ("slot", "dedup"):
                    for n in (1, 9):
                        ids = torch.arange(n * m).reshape(n, m) % N
                        x = torch.empty(n, H)
                        q = cuda_api.get_plan(lib, x, ids, w, kernel).as_dict()
                        gu_blocks = q["grid_gu_x"] * q["grid_gu_y"]
                        dn_blocks = q["grid_dn_x"] * q["grid_dn_y"]
                        res_gu = min(SMEM_PER_SM // (q["smem_gu"] + RESERVE), -(-gu_blocks // args.sms), 2048 // 256)
                        res_dn = min(SMEM_PER_SM // (q["smem_dn"] + RESERVE), -(-dn_blocks // args.sms),
                                     2048 // q["threads_dn"])
                        fl_gu = res_gu * 8 * (q["ring_gu"] - 1) * stage_bytes(fmt, "gu") / 1024
                        fl_dn = res_dn * (q["threads_dn"] // 32) * (q["ring_dn"] - 1) * stage_bytes(fmt, "dn") / 1024
                        print(f"| {name} | {fmt} | {kernel} | {n} | {q['grid_gu_x']}x{q['grid_gu_y']} "
                              f"| {q['smem_gu'] / 1024:.0f} | {q['ring_gu']} | {res_gu} | {fl_gu:.0f} "
                              f"| {q['grid_dn_x']} x {q['threads_dn']} thr | {q['smem_dn'] / 1024:.0f} | {q['ring_dn']} "
                              f"| {res_dn} | {fl_dn:.0f} |")
    return 0


class _Shape:
    """An ExpertWeights stand-in with a preset's shape (the plan reads sizes, format and alignment)."""

    def __init__(self, w, N, H, I):
        self.fmt, self.num_experts, self.hidden_size, self.intermediate_size = w.fmt, N, H, I
        self.gate, self.up, self.down = w.gate, w.up, w.down
        self.gate_scale, self.up_scale, self.down_scale = w.gate_scale, w.up_scale, w.down_scale


if __name__ == "__main__":
    sys.exit(main())
