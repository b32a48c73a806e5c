"""CPU bandwidth benchmark of moespec's expert kernels (issue 4, item 5).

For every model shape (random weights) and format, ONE interleaved run times, round-robin with a
cache flush before every call (4x the machine's last-level cache, at least 256 MiB:
``moespec.measure.timing.flush_bytes``): the read ceiling (the best of the kernels' read patterns
with the kernels' threads, ``moespec.measure.ceiling``: the reference of every share), a ``torch.sum``
read beside it (both at least 1 GiB and at least the flush), and for n = 1..9 the per-slot and the
dedup kernel on the same random-routing pass.
(``--protocol warm-code``: no flush between calls, each call on the next of ``--copies`` layer
copies, so the weights are cold and the code warm, as between the layers of a model.)
Effective bandwidth = requested bytes / time (per-slot n*m*b, dedup U*b; paper 1, Section 2).
Every figure is a ratio of two timings from the same round (medians over rounds): the memory
bandwidth of this machine drifts by tens of percent from minute to minute. A share of the ceiling
whose lower quartile over the rounds is above 1 is flagged (``above_read``, with its likely cause).

    .venv/bin/python benchmarks/bench_kernels.py                       # every preset, f32/bf16/int8
    .venv/bin/python benchmarks/bench_kernels.py --models olmoe --fmts f32 --reps 5

Writes ``data/bench/kernels/<stamp>.csv`` (one row per kernel, n, model, format) and
``<stamp>_ubar.csv`` (ubar(n) of uniform and sticky routing beside r(n)); prints the tables
(``--markdown`` prints them as markdown for docs/kernels.md).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

# Transparent huge pages for every torch allocation >= 2 MB (weights and the read-bandwidth buffer
# alike, so the ratio stays fair): in this VM 4 KiB pages cost both about a third of their
# bandwidth. Must be set before torch allocates; MOESPEC_BENCH_THP=0 turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", os.environ.get("MOESPEC_BENCH_THP", "1"))
# OMP_WAIT_POLICY is left as the caller has it (unset: libgomp's default, as in any program). The
# C++ kernels then take their helper threads from torch's OpenMP team, whose workers are still
# awake after the parallel read flush; with OMP_WAIT_POLICY=passive they use their own pool
# (MOESPEC_CPU_THREADS overrides; docs/kernels.md). The columns omp_wait_policy and cpu_threads
# record what ran.

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from moespec import io  # noqa: E402
from moespec.kernels import ExpertWeights, build, expert_forward  # noqa: E402
from moespec.measure import ceiling, ggml_peer, protocols, timing  # noqa: E402
from moespec.measure.ceiling import ReadCeiling  # noqa: E402
from moespec.measure.expert_op import SUM_PROBE  # noqa: E402
from moespec.measure.ids import random_ids  # noqa: E402
from moespec.measure.protocols import Copies, read_flush, read_unsteady, rotating  # noqa: E402
from moespec.model_shapes import PRESETS, get_spec  # noqa: E402
from moespec.plots.kernels import kernel_share_figure  # noqa: E402
from moespec.routing import stats, synthetic  # noqa: E402


def bench_one(model: str, fmt: str, ns, reps: int, warmup: int, flush_bytes: int | None, membw_bytes: int | None,
              seed: int, torch_ref: bool, ggml: bool = False, protocol: str = "cold",
              copies: int = 3) -> pd.DataFrame:
    """One interleaved run for one (model, format); returns one row per (kernel, backend, n).
    With ``ggml``, ggml's CPU MUL_MAT_ID (benchmarks/ggml_peer, built separately) runs in the same
    rounds on the same weights (Q8_0 for int8_b32), as a deduplicating kernel, and its per-slot
    counterpart (``GgmlExperts.per_slot``: one MUL_MAT_ID call per token, n x m expert reads).

    ``flush_bytes``/``membw_bytes`` None: the machine's sizes (:func:`moespec.measure.timing.flush_bytes`,
    :func:`~moespec.measure.timing.read_bytes`). Each row's ``read_GBps`` is the read ceiling (its best
    pattern ``read_probe``), ``beta_over_read`` the share of it paired per round, ``sum_GBps`` and
    ``beta_over_sum`` the same against the ``torch.sum`` read; ``above_read`` flags a share whose lower
    quartile is above 1 (:func:`moespec.measure.ceiling.above`), ``above_read_cause`` says why.

    ``protocol``: ``cold`` flushes the caches (a ``flush_bytes`` read) before every call, so the
    weights, the code and the driver's data are all cold; ``warm-code`` does not flush between
    calls but gives each call the next of ``copies`` copies of the layer (:class:`Copies`): the
    weights are cold, the code and data as warm as between consecutive layers of a model (each
    backend's block of calls starts after one untimed call of its own, as the 1 GiB read of the
    round evicts everything)."""
    n_copies = protocols.check_protocol(protocol, copies)
    spec = get_spec(model)
    N, m, H = spec.num_experts, spec.top_k, spec.hidden_size
    t0 = time.perf_counter()
    layers = Copies(ExpertWeights.random(spec, fmt, seed=seed + i) for i in range(n_copies))
    w = layers.items[0]
    b = w.bytes_per_expert
    rng = np.random.default_rng(seed)
    x = {n: torch.randn(n, H, generator=torch.Generator().manual_seed(n)) for n in ns}
    # each kernel gets its own random passes (same distribution): a pass just read by the other
    # kernel could otherwise still sit in the L3 (a victim cache that a read flush may not refill)
    passes = {(k, n): [random_ids(n, m, N, rng) for _ in range(reps + warmup)] for k in ("slot", "dedup") for n in ns}
    for layer in layers.items:  # build/load, pack int8 once per copy
        expert_forward(x[ns[0]], random_ids(ns[0], m, N, rng), layer, backend="cpp")
    cold = timing.cold_record("cpu", flush_bytes, membw_bytes)
    read, read_bytes = timing.read_bandwidth_callable(cold["read_bytes"])
    top = ReadCeiling(cold["read_bytes"], threads=torch.get_num_threads(), matrix_bytes=b // 3)
    # torch.sum over the bytes of one per-slot pass at n = 1 (m experts): what plain streaming
    # reaches at the size of one call, beside the reference reads
    layer_read, layer_bytes = timing.read_bandwidth_callable(m * b)
    calls, logs = {"read": read, **top.calls(), "read_layer": layer_read}, {}
    warm_ids = random_ids(ns[0], m, N, rng)
    if protocol == "warm-code":  # untimed in effect: its time is not reported
        calls["warm_cpp"] = lambda: expert_forward(x[ns[0]], warm_ids, layers.next(), kernel="dedup", backend="cpp")

    def cpp(kernel, n, backend="cpp"):
        return lambda ids: expert_forward(x[n], ids, layers.next(), kernel=kernel, backend=backend)

    for n in ns:
        for kernel in ("slot", "dedup"):
            logs[(kernel, "cpp", n)] = []
            calls[(kernel, "cpp", n)] = rotating(passes[(kernel, n)], logs[(kernel, "cpp", n)], cpp(kernel, n))
    if torch_ref:  # torch's own per-expert matmuls, per-slot at n = 1
        logs[("slot", "torch", 1)] = []
        calls[("slot", "torch", 1)] = rotating(passes[("slot", ns[0])], logs[("slot", "torch", 1)],
                                                cpp("slot", ns[0], backend="torch"))
    peers, peer_b = None, None
    if ggml:
        peers = Copies(ggml_peer.GgmlExperts.from_weights(layer, threads=torch.get_num_threads()) for layer in layers.items)
        peer_b = peers.items[0].bytes_per_expert
        if protocol == "warm-code":
            calls["warm_ggml"] = lambda: peers.next()(x[ns[0]], warm_ids)
        for n in ns:   # ggml's MUL_MAT_ID (deduplicating) and its per-slot counterpart (one call per token)
            for kernel in ("dedup", "slot"):
                logs[(kernel, "ggml", n)] = []
                pp = [random_ids(n, m, N, rng) for _ in range(reps + warmup)]
                run = ((lambda ids, n=n: peers.next()(x[n], ids)) if kernel == "dedup"
                       else (lambda ids, n=n: peers.next().per_slot(x[n], ids)))
                calls[(kernel, "ggml", n)] = rotating(pp, logs[(kernel, "ggml", n)], run)
    setup_s = time.perf_counter() - t0
    flush = read_flush(cold["flush_bytes"]) if protocol == "cold" else None
    with timing.MachineMonitor("cpu") as mon:
        res = timing.time_interleaved(calls, reps=reps, warmup=warmup, flush=flush)
    sum_bw = read_bytes / (np.asarray(res["read"].samples_ns) * 1e-9)         # per round
    best = top.summary(res)
    if np.median(sum_bw) > best["GBps"] * 1e9:     # the ceiling is never below the torch.sum read
        best.update(pattern=SUM_PROBE, per_round=sum_bw * 1e-9)
    read_bw = best["per_round"] * 1e9                                        # the ceiling, per round
    layer_ratio = layer_bytes / (np.asarray(res["read_layer"].samples_ns) * 1e-9) / read_bw
    rows = []
    for key, log in logs.items():
        kernel, backend, n = key
        ids = log[warmup:]
        U = np.array([stats.pass_union(i, N) for i in ids])
        req = (U if kernel == "dedup" else np.full(len(ids), n * m)) * (peer_b if backend == "ggml" else b)
        t = np.asarray(res[key].samples_ns) * 1e-9
        beta = req / t
        rows.append({"model": model, "fmt": fmt, "kernel": kernel, "backend": backend, "n": n, "m": m, "N": N,
                     "H": H, "I": spec.expert_intermediate, "expert_bytes": peer_b if backend == "ggml" else b,
                     "U_mean": U.mean(),
                     "t_median_s": float(np.median(t)), "t_q25_s": float(np.quantile(t, 0.25)),
                     "t_q75_s": float(np.quantile(t, 0.75)), "reps": len(t),
                     "beta_GBps": float(np.median(beta)) / 1e9, "read_GBps": float(np.median(read_bw)) / 1e9,
                     "read_min_GBps": float(read_bw.min()) / 1e9, "read_max_GBps": float(read_bw.max()) / 1e9,
                     # paired per round, then the median: drift between rounds cancels
                     "beta_over_read": float(np.median(beta / read_bw)),
                     "beta_over_read_q25": float(np.quantile(beta / read_bw, 0.25)),
                     "beta_over_read_q75": float(np.quantile(beta / read_bw, 0.75)),
                     "read_probe": best["pattern"], "sum_GBps": float(np.median(sum_bw)) / 1e9,
                     "beta_over_sum": float(np.median(beta / sum_bw)),
                     "above_read": bool(ceiling.above(np.quantile(beta / read_bw, 0.25))),
                     "above_read_cause": "",
                     # torch.sum over one n = 1 pass's bytes / read, same rounds
                     "layer_read_over_read": float(np.median(layer_ratio)),
                     "_beta": beta})
    df = pd.DataFrame(rows)
    df["flush_bytes"], df["cold_bytes"] = cold["flush_bytes"] if protocol == "cold" else 0, cold["cold_bytes"]
    df["above_read_cause"] = [ceiling.cause(k, n, u / (n * m), f, c) if hit else "" for k, n, u, f, c, hit in
                              zip(df.kernel, df.n, df.U_mean, df.flush_bytes, df.cold_bytes, df.above_read)]

    def beta(kernel, backend, n):  # per round
        return df[(df.kernel == kernel) & (df.backend == backend) & (df.n == n)]["_beta"].iloc[0]

    def on_dedup_rows(per_n):  # a value per n on moespec's dedup rows, NaN elsewhere
        return [per_n[n] if k == "dedup" and be == "cpp" else np.nan for k, be, n in zip(df.kernel, df.backend, df.n)]

    if peers is not None:  # moespec dedup / ggml, paired per round like r(n); ggml's own r(n)
        df["dedup_over_ggml"] = on_dedup_rows(
            {n: float(np.median(beta("dedup", "cpp", n) / beta("dedup", "ggml", n))) for n in ns})
        r_ggml = {n: beta("dedup", "ggml", n) / beta("slot", "ggml", n) for n in ns}
        df["r_n_ggml"] = on_dedup_rows({n: float(np.median(v)) for n, v in r_ggml.items()})
    # r(n) = beta_dedup / beta_slot, paired per round (paper 1, Sec. 2)
    r = {n: beta("dedup", "cpp", n) / beta("slot", "cpp", n) for n in ns}
    df["r_n"] = on_dedup_rows({n: float(np.median(v)) for n, v in r.items()})
    df["r_n_q25"] = on_dedup_rows({n: float(np.quantile(v, 0.25)) for n, v in r.items()})
    df["r_n_q75"] = on_dedup_rows({n: float(np.quantile(v, 0.75)) for n, v in r.items()})
    st = mon.state
    for col, value in protocols.run_columns(w.fmt).items():
        df[col] = value
    df["protocol"], df["copies"] = protocol, len(layers.items)
    if peers is not None:
        df["ggml_version"] = ggml_peer.version()
        for peer in peers.items:
            peer.close()
    df["other_load"] = round(st.other_load, 3)
    df["flags"] = ";".join(st.flags + (["read_unsteady"] if read_unsteady(read_bw) else []))
    df["ceiling_patterns_GBps"] = ";".join(f"{p}={v:.2f}" for p, v in best["patterns"].items())
    df["setup_s"], df["run_s"] = round(setup_s, 1), round(st.wall_s, 1)
    del w, layers
    return df.drop(columns="_beta")


def ubar_table(models, n_max: int, keep: float, seed: int) -> pd.DataFrame:
    """ubar(n) for uniform routing and for sticky routing with rho(2) = ``keep`` (synthetic,
    moespec.routing.synthetic; working set = all N experts), per model shape."""
    rows = []
    for model in models:
        spec = get_spec(model)
        for name, trace in (
            ("uniform", synthetic.uniform(32, 256, 2, spec.num_experts, spec.top_k, seed=seed)),
            (f"sticky(rho2={keep})", synthetic.sticky(32, 256, 2, spec.num_experts, spec.top_k, keep=keep, seed=seed)),
        ):
            ub = stats.byte_share(trace, n_max)
            for n in range(1, n_max + 1):
                rows.append({"model": model, "routing": name, "n": n, "ubar": float(ub[n - 1])})
    return pd.DataFrame(rows)


def crossover_table(df: pd.DataFrame, ub: pd.DataFrame) -> pd.DataFrame:
    """Pass sizes n where ubar(n) < r(n): where the dedup kernel is faster (paper 1, eq. (7))."""
    out = []
    rn = df[(df.kernel == "dedup") & (df.backend == "cpp")][["model", "fmt", "n", "r_n"]]
    for (model, fmt), g in rn.groupby(["model", "fmt"], sort=False):
        for routing, u in ub[ub.model == model].groupby("routing", sort=False):
            merged = g.merge(u, on="n")
            wins = merged[(merged.ubar < merged.r_n) & (merged.n >= 2)].n.tolist()  # n = 1: one kernel
            out.append({"model": model, "fmt": fmt, "routing": routing,
                        "n_where_ubar_lt_r": ",".join(map(str, wins)) or "none",
                        "crossover_n": min(wins) if wins else None})
    return pd.DataFrame(out)


def summary_tables(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    cpp = df[df.backend == "cpp"]
    r = cpp[cpp.kernel == "dedup"].pivot_table(index=["model", "fmt"], columns="n", values="r_n", sort=False)
    slot = cpp[cpp.kernel == "slot"].pivot_table(index=["model", "fmt"], columns="n", values="beta_over_read", sort=False)
    dedup = cpp[cpp.kernel == "dedup"].pivot_table(index=["model", "fmt"], columns="n", values="beta_over_read", sort=False)
    tables = {"r(n) = beta_dedup / beta_slot": r.round(3), "per-slot beta / read bandwidth": slot.round(3),
              "dedup beta (distinct bytes) / read bandwidth": dedup.round(3),
              "torch.sum over one n = 1 pass's bytes / read (same rounds)": cpp.drop_duplicates(
                  ["model", "fmt"]).set_index(["model", "fmt"])[["layer_read_over_read"]].round(3)}
    peer = df[df.backend == "ggml"]
    if len(peer):
        by_n = lambda rows, col: rows.pivot_table(index=["model", "fmt"], columns="n", values=col,  # noqa: E731
                                                  sort=False).round(3)
        tables["ggml MUL_MAT_ID beta (distinct bytes) / read bandwidth (same rounds)"] = by_n(
            peer[peer.kernel == "dedup"], "beta_over_read")
        if (peer.kernel == "slot").any():
            tables["ggml per-slot counterpart (one MUL_MAT_ID per token) beta / read bandwidth"] = by_n(
                peer[peer.kernel == "slot"], "beta_over_read")
        if "r_n_ggml" in cpp:
            tables["ggml's r(n) = beta_MUL_MAT_ID / beta_per-slot counterpart"] = by_n(cpp[cpp.kernel == "dedup"],
                                                                                     "r_n_ggml")
        tables["moespec dedup / ggml MUL_MAT_ID, effective bandwidth (paired per round)"] = cpp[
            cpp.kernel == "dedup"].pivot_table(index=["model", "fmt"], columns="n", values="dedup_over_ggml",
                                               sort=False).round(3)
    return tables


def markdown(table: pd.DataFrame) -> str:
    """A DataFrame as a markdown table (index columns first), without the tabulate package."""
    t = table.reset_index()
    head = [str(c) for c in t.columns]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)  # noqa: E731
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in t.itertuples(index=False)]
    return "\n".join(lines)


def plot_run(csv: Path) -> list[Path]:
    """One figure per model of a run's CSV, ``<stamp>_<model>.png`` beside it."""
    rows = pd.read_csv(csv)
    stamp = csv.stem
    out = []
    for model in dict.fromkeys(rows["model"]):
        fig = kernel_share_figure(rows, model, title=f"{model}: expert kernels, run {stamp} ({rows['date'].iloc[0]})")
        out.append(io.save_figure(fig, csv.with_name(f"{stamp}_{model}.png")))
        plt.close(fig)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(PRESETS), help="comma-separated presets")
    ap.add_argument("--fmts", default="f32,bf16,int8_b32")
    ap.add_argument("--ns", default="1,2,3,4,5,6,7,8,9")
    protocols.add_common_arguments(ap, reps=7)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--keep", type=float, default=0.5, help="rho(2) of the sticky routing (our choice)")
    ap.add_argument("--no-torch-ref", action="store_true", help="skip torch's per-slot kernel at n=1")
    ap.add_argument("--ggml", action="store_true",
                    help="also time ggml's CPU MUL_MAT_ID and its per-slot counterpart in the same rounds, every "
                         "model (build it first: benchmarks/ggml_peer/build.py)")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--plot", metavar="CSV", help="only draw the figure of an earlier run's CSV (next to it)")
    args = ap.parse_args(argv)
    if args.plot:
        for path in plot_run(Path(args.plot)):
            print(path)
        return
    torch.set_num_threads(args.threads)
    build.load_cpu()
    models, fmts = args.models.split(","), args.fmts.split(",")
    ns = [int(v) for v in args.ns.split(",")]
    stamp = protocols.stamp()
    out = protocols.kernels_dir()
    frames = []
    for model in models:
        for fmt in fmts:
            torch_ref = fmt != "int8_b32" and not args.no_torch_ref and model == "olmoe"
            df = bench_one(model, fmt, ns, args.reps, args.warmup, *protocols.sizes(args), args.seed, torch_ref,
                           ggml=args.ggml, protocol=args.protocol, copies=args.copies)
            frames.append(df)
            d = df[df.backend == "cpp"]
            print(f"{model:>16} {fmt:>8} {args.protocol} read ceiling ({d.read_probe.iloc[0]}) "
                  f"{d.read_GBps.iloc[0]:5.1f} GB/s, torch.sum {d.sum_GBps.iloc[0]:5.1f} GB/s  "
                  f"other_load {d.other_load.iloc[0]:.2f}  "
                  f"layer read/read {d.layer_read_over_read.iloc[0]:.3f}  "
                  f"slot/read n=1 {d[(d.kernel == 'slot') & (d.n == ns[0])].beta_over_read.iloc[0]:.3f}  "
                  "r(n) " + " ".join(f"{v:.2f}" for v in d[d.kernel == 'dedup'].r_n), flush=True)
            for r in df[df.above_read].itertuples():
                print(f"{'':>16} {'':>8} FLAG: {r.backend} {r.kernel} n = {r.n}: {r.beta_over_read:.3f} of the read "
                      f"ceiling (lower quartile {r.beta_over_read_q25:.3f} > 1): {r.above_read_cause}", flush=True)
            if "read_unsteady" in str(d["flags"].iloc[0]):
                print(f"{'':>16} {'':>8} WARNING: the read ceiling ranged {d.read_min_GBps.iloc[0]:.1f}-"
                      f"{d.read_max_GBps.iloc[0]:.1f} GB/s in this block (bandwidth regime changed): "
                      "its ratios are unreliable, rerun it", flush=True)
            io.write_dataframe(out / f"{stamp}.csv", pd.concat(frames))  # rows as they come
    df = pd.concat(frames)
    ub = ubar_table(models, max(ns), args.keep, args.seed)
    cross = crossover_table(df, ub)
    io.write_dataframe(out / f"{stamp}_ubar.csv", ub.merge(cross, on=["model", "routing"], how="left"))
    protocols.write_provenance(out / f"{stamp}_provenance.json", args)
    show = markdown if args.markdown else (lambda t: t.to_string())
    for title, table in summary_tables(df).items():
        print(f"\n{title}\n{show(table)}")
    tr = df[df.backend == "torch"]
    if len(tr):
        print("\ntorch per-slot (per-expert F.linear) at n=1, beta / read bandwidth:")
        print(show(tr[["model", "fmt", "beta_over_read"]].round(3).set_index(["model", "fmt"])))
    print(f"\nubar(n) < r(n) (dedup faster), uniform and sticky routing:\n{show(cross.set_index(['model', 'fmt', 'routing']))}")
    print(f"\nrows: {out / (stamp + '.csv')}")
    for path in plot_run(out / f"{stamp}.csv"):
        print(f"figure: {path}")


if __name__ == "__main__":
    main()
