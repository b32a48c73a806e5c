"""Fixed cost and streaming rate of the CUDA kernels in a GPU run, from its n = 1 rows
(:mod:`moespec.measure.overhead_fit`; docs/cuda.md quotes it for the run of 2026-11-29 (H200), whose
kernels are the legacy path's).

    python3 benchmarks/gpu_overhead_fit.py benchmarks/results/gpu/20261129T1832Z-h200/bench_kernels_cuda.csv

Prints a markdown table.
"""

from __future__ import annotations

import sys

from moespec.measure.overhead_fit import fit, markdown, read_rows


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    print(f"Line t = a + bytes / beta through the f32 and bf16 points at n = 1 ({argv[0]})\n")
    print(markdown(fit(read_rows(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
