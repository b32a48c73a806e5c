"""This tree's C++ CPU extension against the one of another git revision, in one process: bitwise
equal outputs, then the speed of both in the same interleaved rounds (docs/kernels.md, "Comparing
two builds").

    .venv/bin/python benchmarks/compare_cpu_builds.py --base d7a7613            # check, then time
    .venv/bin/python benchmarks/compare_cpu_builds.py --base d7a7613 --check-only

The base revision's ``moespec/kernels/csrc/cpu/`` is taken with ``git archive`` into
``build/compare/<rev>/src``, its op namespace renamed (``TORCH_LIBRARY(moespec, ...)`` ->
``moespec_base``, so that both libraries register side by side) and built with this tree's flags into
``build/compare/<rev>``. Nothing else of the base revision is used: the weights, the int8 packing
and the inputs are this tree's, and both builds are called through their extension modules' own
``expert_slot`` / ``expert_dedup`` (what ``expert_forward``'s cpp backend calls).

1. Check: on every ISA path (``MOESPEC_CPU_ISA`` avx512, avx2, portable, as far as the CPU has
   them), every format, both kernels, shapes with odd sizes and int8 group tails, n = 1..13, with
   and without gates, and inputs holding NaN, inf and an overflowing 1e30: the two builds' outputs
   are compared bit for bit (NaN bit patterns included), and so are ``pack_int8_cpu`` and
   ``quantize_acts_int8_cpu``. Any difference stops the script (exit 1) before it times anything.
2. Timing (``make bench-kernels``' protocol, bench_kernels.py): one interleaved run per format at a
   model shape (OLMoE by default), random routing, per round a 1 GiB ``torch.sum`` (the read
   bandwidth of the round) and, for n = 1..9 and both kernels, one call of each build on the same
   pass, each after the cache flush (``--protocol cold``) or on the next layer copy
   (``warm-code``); which build goes first alternates with n. Reported per build: effective
   bandwidth over the round's read (per-slot n*m*b, dedup U*b), r(n); and the paired time ratio this
   tree / base per round (median and quartiles).

Writes ``data/bench/kernels/<stamp>_compare_builds.csv`` (one row per format, kernel, n and build,
plus the paired ratios) and ``<stamp>_compare_builds_provenance.json``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tarfile
import time
from io import BytesIO
from pathlib import Path

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", os.environ.get("MOESPEC_BENCH_THP", "1"))  # as bench_kernels.py

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from torch.utils.cpp_extension import load  # noqa: E402

from moespec import io, paths  # noqa: E402
from moespec.kernels import ExpertWeights, build  # noqa: E402
from moespec.kernels.dispatch import _op_weights  # noqa: E402
from moespec.measure import protocols, timing  # noqa: E402
from moespec.measure.ids import random_ids  # noqa: E402
from moespec.measure.protocols import Copies, read_flush, read_unsteady, rotating  # noqa: E402
from moespec.model_shapes import get_spec  # noqa: E402
from moespec.routing.stats import pass_union  # noqa: E402

FORMATS = ("f32", "bf16", "int8_b32")
KERNELS = ("slot", "dedup")
#: (N, H, I, m) of the check: int8 group tails (K/32 = 3, 5, 17 blocks), m = 1, N = m + 1, a
#: mid-size layer; float formats also odd sizes (vector tails).
CHECK_SHAPES = ((8, 256, 128, 3), (6, 96, 160, 5), (4, 64, 32, 1), (5, 544, 96, 4), (16, 1024, 512, 8))
ODD_SHAPES = ((5, 75, 37, 2), (3, 17, 9, 2))
ISAS = ("avx512", "avx2", "portable")


def base_sources(rev: str, dest: Path) -> list[Path]:
    """The CPU extension's sources of git revision ``rev`` in ``dest``, the op namespace renamed to
    ``moespec_base``; returns the ``.cpp`` files."""
    archive = subprocess.run(["git", "-C", str(paths.ROOT), "archive", rev, "moespec/kernels/csrc/cpu"],
                             capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {rev} failed: {archive.stderr.decode().strip()}")
    src = dest / "moespec" / "kernels" / "csrc" / "cpu"
    src.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():
            if not member.isfile():
                continue
            text = tar.extractfile(member).read().decode()
            text = re.sub(r"TORCH_LIBRARY(_IMPL)?\(moespec,", r"TORCH_LIBRARY\1(moespec_base,", text)
            target = src / Path(member.name).relative_to("moespec/kernels/csrc/cpu")
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists() or target.read_text() != text:  # unchanged files keep their build
                target.write_text(text)
    return sorted(src.glob("*.cpp"))


def load_base(rev: str):
    """The base revision's extension module (built once per revision under ``build/compare``)."""
    short = subprocess.run(["git", "-C", str(paths.ROOT), "rev-parse", "--short", rev], capture_output=True,
                           text=True, check=True).stdout.strip()
    folder = paths.ensure(paths.build_dir() / "compare" / short)
    sources = base_sources(rev, folder / "src")
    return load(name=f"moespec_cpu_base_{short}", sources=[str(s) for s in sources], build_directory=str(folder),
                extra_cflags=build.CPU_CFLAGS, extra_ldflags=["-fopenmp"], is_python_module=True), short


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (NaN payloads included)."""
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.contiguous().view(torch.uint8),
                                                                            b.contiguous().view(torch.uint8)))


def check_cases():
    """``(label, x, ids, gates, weights)`` of the bitwise check."""
    rng = np.random.default_rng(0)
    for fmt in FORMATS:
        shapes = CHECK_SHAPES + (ODD_SHAPES if fmt != "int8_b32" else ())
        for si, (N, H, I, m) in enumerate(shapes):
            w = ExpertWeights.random((N, H, I), fmt, seed=si)
            for n in (1, 2, 5, 9, 13):
                g = torch.Generator().manual_seed(100 * si + n)
                x = torch.randn(n, H, generator=g)
                ids = random_ids(n, m, N, rng)
                gates = torch.rand(n, m, generator=g)
                yield f"{fmt} {N}x{H}x{I} m={m} n={n}", x, ids, gates, w
                yield f"{fmt} {N}x{H}x{I} m={m} n={n} no gates", x, ids, None, w
                if n >= 5:  # the non-finite rule: NaN and inf in x and the gates, an overflowing row
                    bad_x, bad_g = x.clone(), gates.clone()
                    bad_x[0, H // 2] = float("nan")
                    bad_x[1, 0] = float("inf")
                    bad_x[2] *= 1e30
                    bad_g[3, 0] = float("-inf")
                    yield f"{fmt} {N}x{H}x{I} m={m} n={n} non-finite", bad_x, ids, bad_g, w


def available_isas() -> list[str]:
    """The ISA caps this CPU offers a path for (the kernels fall back below a missing level)."""
    out = []
    for isa in ISAS:
        os.environ["MOESPEC_CPU_ISA"] = isa
        if torch.ops.moespec.cpu_isa("f32") == isa:
            out.append(isa)
    os.environ.pop("MOESPEC_CPU_ISA", None)
    return out


def check(new, base) -> tuple[int, list[str]]:
    """Every check case on every ISA path through both builds: (cases compared, differences)."""
    compared, diffs = 0, []
    isas = available_isas()
    try:
        for isa in isas:
            os.environ["MOESPEC_CPU_ISA"] = isa
            for label, x, ids, gates, w in check_cases():
                args = _op_weights(w)
                for kernel in KERNELS:
                    fn = f"expert_{kernel}"
                    a = getattr(new, fn)(x, ids, gates, *args)
                    b = getattr(base, fn)(x, ids, gates, *args)
                    compared += 1
                    if not same_bits(a, b):
                        diffs.append(f"{isa} {kernel} {label}: max |diff| {(a - b).abs().nan_to_num(0).max():.3g}")
            for K in (32, 96, 512, 544, 2048):
                xq = torch.randn(7, K) * torch.logspace(-3, 3, K)
                xq[3, 5] = float("nan")
                for qa, qb in zip(torch.ops.moespec.quantize_acts_int8_cpu(xq),
                                  torch.ops.moespec_base.quantize_acts_int8_cpu(xq)):
                    compared += 1
                    if not same_bits(qa, qb):
                        diffs.append(f"{isa} quantize_acts_int8_cpu K={K}")
    finally:
        os.environ.pop("MOESPEC_CPU_ISA", None)
    q = torch.randint(-127, 128, (3, 40, 544), dtype=torch.int8)
    compared += 1
    if not same_bits(torch.ops.moespec.pack_int8_cpu(q), torch.ops.moespec_base.pack_int8_cpu(q)):
        diffs.append("pack_int8_cpu")
    return compared, diffs


def time_format(new, base, model: str, fmt: str, ns, reps: int, flush_bytes: int | None, membw_bytes: int | None,
                seed: int, protocol: str, copies: int) -> pd.DataFrame:
    """One interleaved run of both builds for one format (module docstring, step 2)."""
    n_copies = protocols.check_protocol(protocol, copies)
    spec = get_spec(model)
    N, m, H = spec.num_experts, spec.top_k, spec.hidden_size
    layers = Copies(ExpertWeights.random(spec, fmt, seed=seed + i) for i in range(n_copies))
    wargs = Copies(_op_weights(w) for w in layers.items)  # int8 packed once per copy (bitwise equal: check)
    b = layers.items[0].bytes_per_expert
    rng = np.random.default_rng(seed)
    x = {n: torch.randn(n, H, generator=torch.Generator().manual_seed(n)) for n in ns}
    passes = {(k, n): [random_ids(n, m, N, rng) for _ in range(reps + 1)] for k in KERNELS for n in ns}
    read, read_bytes = timing.read_bandwidth_callable(membw_bytes)
    calls, logs = {"read": read}, {}
    builds = {"new": new, "base": base}
    for n in ns:
        order = ("new", "base") if n % 2 else ("base", "new")
        for kernel, who in itertools.product(KERNELS, order):
            fn = getattr(builds[who], f"expert_{kernel}")
            logs[(who, kernel, n)] = []
            calls[(who, kernel, n)] = rotating(passes[(kernel, n)], logs[(who, kernel, n)],
                                               lambda ids, fn=fn, n=n: fn(x[n], ids, None, *wargs.next()))
    flush = read_flush(flush_bytes) if protocol == "cold" else None
    with timing.MachineMonitor("cpu") as mon:
        res = timing.time_interleaved(calls, reps=reps, warmup=1, flush=flush)
    read_bw = read_bytes / (np.asarray(res["read"].samples_ns) * 1e-9)
    t = {key: np.asarray(res[key].samples_ns) * 1e-9 for key in logs}
    rows = []
    for (who, kernel, n), log in logs.items():
        U = np.array([pass_union(ids, N) for ids in log[1:]])  # the timed passes (the first is the warm-up)
        req = (U if kernel == "dedup" else np.full(len(U), n * m)) * b
        beta = req / t[(who, kernel, n)]
        other = "base" if who == "new" else "new"
        ratio = t[(who, kernel, n)] / t[(other, kernel, n)]
        r = None
        if kernel == "dedup":
            r = (req / t[(who, "dedup", n)]) / ((n * m * b) / t[(who, "slot", n)])
        rows.append({"model": model, "fmt": fmt, "kernel": kernel, "n": n, "build": who, "reps": reps,
                     "t_median_s": float(np.median(t[(who, kernel, n)])),
                     "beta_over_read": float(np.median(beta / read_bw)),
                     "beta_over_read_q25": float(np.quantile(beta / read_bw, 0.25)),
                     "beta_over_read_q75": float(np.quantile(beta / read_bw, 0.75)),
                     "r_n": float(np.median(r)) if r is not None else np.nan,
                     "t_over_other": float(np.median(ratio)), "t_over_other_q25": float(np.quantile(ratio, 0.25)),
                     "t_over_other_q75": float(np.quantile(ratio, 0.75)),
                     "read_GBps": float(np.median(read_bw)) / 1e9, "read_min_GBps": float(read_bw.min()) / 1e9,
                     "read_max_GBps": float(read_bw.max()) / 1e9})
    df = pd.DataFrame(rows)
    for col, value in protocols.run_columns(fmt).items():
        df[col] = value
    df["protocol"], df["copies"] = protocol, len(layers.items)
    df["other_load"] = round(mon.state.other_load, 3)
    df["flags"] = ";".join(mon.state.flags + (["read_unsteady"] if read_unsteady(read_bw) else []))
    return df


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="git revision whose CPU extension to compare with this tree's")
    ap.add_argument("--model", default="olmoe")
    ap.add_argument("--fmts", default=",".join(FORMATS))
    ap.add_argument("--ns", default="1,2,3,4,5,6,7,8,9")
    ap.add_argument("--check-only", action="store_true", help="the bitwise check only, no timing")
    protocols.add_common_arguments(ap, reps=11)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    new = build.load_cpu()
    t0 = time.perf_counter()
    base, short = load_base(args.base)
    print(f"base build {short}: {base.__file__} ({time.perf_counter() - t0:.0f} s)", flush=True)
    compared, diffs = check(new, base)
    print(f"bitwise check on ISA paths {available_isas()}: {compared} outputs compared, {len(diffs)} differ", flush=True)
    for d in diffs[:20]:
        print("  DIFFERS:", d)
    if diffs:
        return 1
    if args.check_only:
        return 0
    stamp, out = protocols.stamp(), protocols.kernels_dir()
    ns = [int(v) for v in args.ns.split(",")]
    frames = []
    for fmt in args.fmts.split(","):
        df = time_format(new, base, args.model, fmt, ns, args.reps, *protocols.sizes(args), args.seed,
                         args.protocol, args.copies)
        df["base_rev"], df["checked_outputs"] = short, compared
        frames.append(df)
        io.write_dataframe(out / f"{stamp}_compare_builds.csv", pd.concat(frames))
        new_rows = df[df.build == "new"]
        print(f"\n{args.model} {fmt} ({args.protocol}): read {df.read_GBps.iloc[0]:.1f} GB/s "
              f"({df.read_min_GBps.iloc[0]:.1f}-{df.read_max_GBps.iloc[0]:.1f}), other_load {df.other_load.iloc[0]:.2f}"
              + ("  WARNING: " + df["flags"].iloc[0] if df["flags"].iloc[0] else ""), flush=True)
        for kernel in KERNELS:
            tab = df[df.kernel == kernel].pivot_table(index="build", columns="n", values="beta_over_read").round(3)
            print(f"  {kernel}: effective bandwidth / read\n" + tab.to_string())
        rn = df[df.kernel == "dedup"].pivot_table(index="build", columns="n", values="r_n").round(3)
        print("  r(n)\n" + rn.to_string())
        ratio = new_rows.pivot_table(index="kernel", columns="n", values="t_over_other").round(3)
        print("  time this tree / base, paired per round (median)\n" + ratio.to_string(), flush=True)
    protocols.write_provenance(out / f"{stamp}_compare_builds_provenance.json", args)
    print(f"\nrows: {out / (stamp + '_compare_builds.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
