"""Paper 1, Table 1 (effective bandwidths, r, ubar, re-read cost), the per-layer fit table with
its window errors (per engine too), and the distinct share of Figure 3 (right), from the rows of
the current run and the reference measurements it is compared with (``data/reference_measurements``,
:func:`reference_measurement`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import fit, paper_reference, paths
from moespec.measure import ceiling, discard, expert_op
from moespec.measure.discard import DiscardDecision
from moespec.routing import stats
from moespec.validate.reference import file_digest

#: Label of the paper's rows wherever they are shown beside ours (:data:`moespec.paper_reference.PAPER1_LABEL`).
PAPER_LABEL = paper_reference.PAPER1_LABEL
TABLE1_COLUMNS = ["source", "engine", "model", "reread_cost",
                  "n2_beta_slot_GBps", "n2_beta_dedup_GBps", "n2_r", "n2_ubar",
                  "n8_beta_slot_GBps", "n8_beta_dedup_GBps", "n8_r", "n8_ubar"]


def _range(values) -> str:
    """'a-b' over the values (two decimals), 'a' if they agree, '' if none (the paper's style)."""
    v = np.asarray([x for x in values if np.isfinite(x)], dtype=float)
    if not v.size:
        return ""
    lo, hi = f"{v.min():.2f}", f"{v.max():.2f}"
    return lo if lo == hi else f"{lo}-{hi}"


def table1(bw: pd.DataFrame, fits: pd.DataFrame | None, engine: str, source: str,
           paper: bool | str | Path = True) -> pd.DataFrame:
    """Table 1: per model, beta_slot, beta_dedup (GB/s), r and ubar at n = 2 and 8 (sums over
    layers and windows, :func:`moespec.fit.bandwidth_table`) and the re-read cost c_re/c_u of
    eq. (4) as its range over the fitted layers. ``source`` labels our rows (machine, date);
    ``paper`` adds the published rows (``data/paper_reference/paper1_table1_bandwidth.csv``) with
    source :data:`PAPER_LABEL`."""
    rows = []
    for model, g in bw.groupby("model", sort=False):
        row = {"source": source, "engine": engine, "model": model, "reread_cost": ""}
        if fits is not None and not fits.empty:
            slot = fits[(fits["model"] == model) & (fits["kernel"] == "slot")]
            row["reread_cost"] = _range(slot["reread_cost"])
        for n in (2, 8):
            at = g[g["n"] == n]
            for col, name in (("beta_slot_GBps", "beta_slot_GBps"), ("beta_dedup_GBps", "beta_dedup_GBps"),
                              ("r", "r"), ("ubar", "ubar")):
                row[f"n{n}_{name}"] = float(at[col].iloc[0]) if len(at) else np.nan
        rows.append(row)
    out = pd.DataFrame(rows, columns=TABLE1_COLUMNS)
    return pd.concat([out, published_table1(paper)], ignore_index=True) if paper else out


def flag_shares(bw: pd.DataFrame) -> pd.DataFrame:
    """``bw`` (per n: ``beta_slot_GBps``, ``beta_dedup_GBps``, ``read_GBps`` the read ceiling and
    ``read_hi_GBps`` its fast quartile, ``ubar``; ``flush_bytes``/``cold_bytes`` where the run
    recorded them) with each kernel's share of the read ceiling (``slot_over_read``,
    ``dedup_over_read``) and the check of issue 58: ``above_read`` names the kernels whose share is
    above 1 beyond the probe's spread (:func:`moespec.measure.ceiling.above` of the bandwidth over the
    ceiling's fast quartile), ``above_read_cause`` their likely cause (:func:`moespec.measure.ceiling.cause`)."""
    out = bw.copy()
    hi = out["read_hi_GBps"] if "read_hi_GBps" in out else out["read_GBps"]
    col = lambda name: (pd.to_numeric(out[name], errors="coerce") if name in out  # noqa: E731
                        else pd.Series(np.nan, index=out.index))
    flush, cold = col("flush_bytes"), col("cold_bytes")
    flagged = {k: ceiling.above(out[f"beta_{k}_GBps"] / hi) for k in ("slot", "dedup")}
    for k in ("slot", "dedup"):
        out[f"{k}_over_read"] = out[f"beta_{k}_GBps"] / out["read_GBps"]
    names, causes = [], []
    for i, at in enumerate(out.itertuples()):
        ks = [k for k in ("slot", "dedup") if flagged[k][i]]
        names.append(",".join(ks))
        causes.append("; ".join(f"{k}: {ceiling.cause(k, int(at.n), float(at.ubar), flush.iloc[i], cold.iloc[i])}"
                                for k in ks))
    out["above_read"], out["above_read_cause"] = names, causes
    return out


def bandwidth_by_n(rows: pd.DataFrame) -> pd.DataFrame:
    """Notebook 02's ``02_bandwidth_by_n.csv``: Table 1's bandwidths per n
    (:func:`moespec.fit.bandwidth_table`) beside the read ceiling of the same groups
    (:func:`moespec.measure.expert_op.read_bandwidth`: ``read_GBps``, its fast quartile ``read_hi_GBps``
    and the pattern ``read_probe``; a run without the ceiling gives ``torch.sum``), each kernel's share
    of it with the check of :func:`flag_shares`, and the ``torch.sum`` read of the same groups beside it
    (``sum_GBps``, ``slot_over_sum``, ``dedup_over_sum``), with the run's flush and cold size."""
    bw = fit.bandwidth_table(rows).merge(expert_op.read_bandwidth(rows, by_n=True), on="n")
    total = expert_op.read_bandwidth(rows, by_n=True, reference="sum")
    bw = bw.merge(total[["n", "read_GBps"]].rename(columns={"read_GBps": "sum_GBps"}), on="n")
    for c in ("flush_bytes", "cold_bytes"):
        if c in rows:
            bw[c] = pd.to_numeric(rows[c], errors="coerce").dropna().iloc[0] if rows[c].notna().any() else np.nan
    bw = flag_shares(bw)
    for k in ("slot", "dedup"):
        bw[f"{k}_over_sum"] = bw[f"beta_{k}_GBps"] / bw["sum_GBps"]
    first = ["slot_over_read", "dedup_over_read", "above_read"]
    rest = [c for c in bw.columns if c not in first]
    at = rest.index("read_GBps") + 1
    return bw[rest[:at] + first + rest[at:]]


def published_table1(paper: bool | str | Path = True) -> pd.DataFrame:
    """Paper 1's published Table 1 rows (``paper``: a CSV path, or True for the reference table,
    :func:`moespec.paper_reference.table1`) in :data:`TABLE1_COLUMNS`, source :data:`PAPER_LABEL`."""
    if isinstance(paper, (str, Path)):
        pub = pd.read_csv(paper, dtype={"reread_cost": str}, keep_default_na=False, na_values=[""])
        if missing := set(TABLE1_COLUMNS[1:]) - set(pub.columns):
            raise ValueError(f"{paper}: missing column(s) {sorted(missing)}")
        pub["reread_cost"] = pub["reread_cost"].fillna("")
    else:
        pub = paper_reference.table1()
    pub.insert(0, "source", PAPER_LABEL)
    return pub[TABLE1_COLUMNS]


def fit_table(fits: pd.DataFrame, errors: pd.DataFrame | None = None) -> pd.DataFrame:
    """The coefficients of eq. (4) and (E.1) per layer (seconds and seconds per byte), the fit's
    median |relative error| on its own passes and, from ``errors`` (:func:`moespec.fit.window_errors`),
    on the windows of routing it did not see."""
    out = fits.copy()
    if errors is not None and not errors.empty:
        keys = [c for c in ("model", "backend", "fmt", "layer", "kernel") if c in out.columns]
        win = (errors.assign(abs_err=errors["rel_err"].abs()).groupby(keys)
               .agg(window_median_abs_err=("abs_err", "median"), windows=("abs_err", "size")).reset_index())
        out = out.merge(win, on=keys, how="left")
    return out


def discard_effect(decision: DiscardDecision, by=("model", "backend", "fmt")) -> pd.DataFrame:
    """Table 1's bandwidths per n (:func:`moespec.fit.bandwidth_table`) on every row and on the
    rows the discard rule keeps, side by side (columns ``*_all`` and ``*_kept``)."""
    cols = ["beta_slot_GBps", "beta_dedup_GBps", "r", "ubar", "passes"]
    every = fit.bandwidth_table(decision.rows, by=by)
    kept = fit.bandwidth_table(decision.kept, by=by)
    keys = [c for c in (*by, "n") if c in every.columns]
    return every[keys + cols].merge(kept[keys + cols], on=keys, how="left", suffixes=("_all", "_kept"))


def fit_variants(decision: DiscardDecision) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fits (4)/(E.1) both ways (non-negative and unconstrained, :data:`moespec.fit.FITS`) on every
    row and on the rows the discard rule keeps: the coefficients per layer with their window errors
    (:func:`fit_table`) and epsilon (:func:`moespec.fit.epsilon`), each row labelled by ``fit`` and
    ``rows`` (``all`` or ``kept``)."""
    coefs, eps = [], []
    for label, rows in (("kept", decision.kept), ("all", decision.rows)):
        for how in fit.FITS:
            fits = fit.fit_layers(rows, fit=how)
            errors = fit.window_errors(fits, rows)
            coefs.append(fit_table(fits, errors).assign(rows=label))
            eps.append(fit.epsilon(errors).assign(fit=how, rows=label))
    return pd.concat(coefs, ignore_index=True), pd.concat(eps, ignore_index=True)


def distinct_share(traces, ns=(2, 4, 6, 8)) -> pd.DataFrame:
    """Figure 3 (right): the share of a pass's n·m slots that name distinct experts, U/(n·m),
    layer mean of the mean union of n consecutive tokens, per trace (``label``: its source)."""

    rows = []
    for tr in traces:
        share = stats.distinct_share(tr, max(ns))
        for n in ns:
            rows.append({"label": tr.label, "model": tr.model, "n": n, "m": tr.top_k,
                         "share": float(share[n - 1]), "lower_bound": 1 / n})
    return pd.DataFrame(rows)


#: Where the reference measurements and their manifest lie, under :func:`moespec.paths.data_dir`.
REFERENCE_MEASUREMENTS = "reference_measurements"


def reference_measurement(name: str) -> Path:
    """The path (a file or a run folder) of the reference measurement ``name`` of
    ``data/reference_measurements/MANIFEST.json``, after checking every file of it against the
    manifest's SHA-256 (a differing or missing file is refused, naming it)."""
    folder = paths.data_dir() / REFERENCE_MEASUREMENTS
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    entries = {m["name"]: m for m in manifest["measurements"]}
    if name not in entries:
        raise KeyError(f"{folder / 'MANIFEST.json'}: no measurement {name!r}; known {sorted(entries)}")
    for f in entries[name]["files"]:
        where = folder / f["path"]
        found = file_digest(where) if where.is_file() else "no file"
        if found != f["sha256"]:
            raise ValueError(f"{where}: sha256 expected {f['sha256']} (MANIFEST.json, measurement {name!r}), "
                             f"found {found}")
    return folder / entries[name]["path"]


#: The reference ``bench_kernels.py --ggml`` run at paper 1's breadth that notebook 02 reads by
#: default (a name of :func:`reference_measurement`; docs/ggml_peer.md).
BREADTH_RUN = "kernel_breadth"
#: The engines of a ``bench_kernels.py --ggml`` run, by its ``backend`` column.
BREADTH_ENGINES = {"cpp": "moespec CPU", "ggml": "llama.cpp CPU (ggml MUL_MAT_ID; per-slot: one call per token)"}


def load_breadth_run(path: str | Path = "") -> tuple[pd.DataFrame, Path]:
    """The rows of a ``bench_kernels.py --ggml`` run (``path``, or the reference measurement
    :data:`BREADTH_RUN`) and the file they came from."""
    where = Path(path) if path else reference_measurement(BREADTH_RUN)
    if not where.is_file():
        raise FileNotFoundError(f"{where}: no bench_kernels.py run there (benchmarks/bench_kernels.py --ggml "
                                "writes one)")
    return pd.read_csv(where), where


def breadth_bandwidths(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (engine, model, format, n) of a ``benchmarks/bench_kernels.py --ggml`` run's rows: each
    kernel's effective bandwidth (median over rounds: requested bytes / time, paper 1 Sec. 2) in
    GB/s and over the same rounds' read bandwidth, r(n) paired per round (moespec: ``r_n``; ggml:
    ``r_n_ggml``) and ubar(n) = U/(n m) of the deduplicating kernel's passes; ``<kernel>_above_read``
    flags a share above 1 beyond its spread (the lower quartile of the ratio paired per round above 1,
    :func:`moespec.measure.ceiling.above`) and ``<kernel>_above_read_cause`` gives its likely cause
    (:func:`moespec.measure.ceiling.cause`, from the run's ``flush_bytes``/``cold_bytes`` where it
    recorded them). Raises naming what is missing when the run has no ggml rows or no per-slot counterpart."""
    need = {"model", "fmt", "kernel", "backend", "n", "m", "U_mean", "beta_GBps", "beta_over_read", "read_GBps", "r_n"}
    missing = need - set(rows.columns)
    if missing:
        raise ValueError(f"not a bench_kernels.py run: missing column(s) {sorted(missing)}")
    if not ((rows.backend == "ggml") & (rows.kernel == "slot")).any() or "r_n_ggml" not in rows:
        raise ValueError("the run has no ggml per-slot rows (bench_kernels.py --ggml, after GgmlExperts.per_slot)")
    # both engines' r(n), paired per round, are kept on moespec's deduplicating rows
    r_of = rows[(rows.backend == "cpp") & (rows.kernel == "dedup")].set_index(["model", "fmt", "n"])
    r_col = {"cpp": "r_n", "ggml": "r_n_ggml"}
    out = []
    for (backend, model, fmt, n), g in rows[rows.backend.isin(list(BREADTH_ENGINES))].groupby(
            ["backend", "model", "fmt", "n"], sort=False):
        k = g.set_index("kernel")
        if not {"slot", "dedup"} <= set(k.index):
            continue
        r = r_of.loc[(model, fmt, n), r_col[backend]]
        ubar = float(k.loc["dedup", "U_mean"]) / (int(n) * int(k.loc["dedup", "m"]))
        checks = {}
        for kern in ("slot", "dedup"):
            low = k.loc[kern, "beta_over_read_q25"] if "beta_over_read_q25" in k else k.loc[kern, "beta_over_read"]
            hit = bool(ceiling.above(float(low)))
            sizes = [float(k.loc[kern, c]) if c in k else np.nan for c in ("flush_bytes", "cold_bytes")]
            checks[f"{kern}_above_read"] = hit
            checks[f"{kern}_above_read_cause"] = ceiling.cause(kern, int(n), ubar, *sizes) if hit else ""
        out.append({"engine": BREADTH_ENGINES[backend], "model": model, "fmt": fmt, "n": int(n),
                    "beta_slot_GBps": float(k.loc["slot", "beta_GBps"]), "beta_dedup_GBps": float(k.loc["dedup", "beta_GBps"]),
                    "slot_over_read": float(k.loc["slot", "beta_over_read"]),
                    "dedup_over_read": float(k.loc["dedup", "beta_over_read"]), "r": float(r),
                    "ubar": ubar, "read_GBps": float(k.loc["dedup", "read_GBps"]), **checks})
    return pd.DataFrame(out)


def table1_breadth(bw: pd.DataFrame, source: str, paper: bool | str | Path = True) -> pd.DataFrame:
    """Table 1 at paper 1's breadth: one row per (engine, format, model) of
    :func:`breadth_bandwidths` (engine named with its format), then the paper's published rows
    (:func:`table1`); no re-read cost (that needs the fit's chosen-id passes, notebook 02's own run)."""
    parts = [table1(g, None, engine=f"{engine} ({fmt})", source=source, paper=False)
             for (engine, fmt), g in bw.groupby(["engine", "fmt"], sort=False)]
    ours = pd.concat(parts, ignore_index=True)
    return pd.concat([ours, published_table1(paper)], ignore_index=True) if paper else ours


#: The reference ``benchmarks/bench_engine_fits.py`` runs (another engine's expert operation timed
#: as notebook 02 times moespec's) whose fits notebook 03 puts beside its own (names of
#: :func:`reference_measurement`).
ENGINE_FIT_RUNS = ("engine_fit_ggml_olmoe_f32",)


def load_engine_fit_runs(runs=None) -> dict[str, DiscardDecision]:
    """``{engine label: discard decision}`` of the expert-op runs in ``runs`` (folders, a relative
    one from the repository root; None: the reference measurements :data:`ENGINE_FIT_RUNS`), each
    with the discard rule applied; the label names the engine (:data:`BREADTH_ENGINES`, by the
    run's ``backend``) and the run."""
    out = {}
    for run in ([reference_measurement(name) for name in ENGINE_FIT_RUNS] if runs is None else runs):
        where = Path(run) if Path(run).is_absolute() else paths.ROOT / run
        rows = expert_op.load_rows(where)
        backends = sorted(set(rows["backend"]))
        if len(backends) != 1:
            raise ValueError(f"{where}: an engine-fit run times one backend, found {backends}")
        out[f"{BREADTH_ENGINES.get(backends[0], backends[0])}, run {where.name}"] = discard.apply_rule(
            rows, source=str(where / "rows.csv"))
    return out


def engine_fits(decisions: dict[str, DiscardDecision]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Fits (4)/(E.1) and epsilon per engine (paper 1, Section 4 and Table 1): for each
    ``{engine label: discard decision}`` the non-negative fits per layer on the kept rows with
    their window errors (:func:`fit_table`, re-read cost included) and the engine's epsilon
    (:func:`moespec.fit.epsilon`), each row labelled ``engine`` and carrying the run's read
    bandwidth (``read_GBps``: runs made at different times are compared on it); the coefficients
    also in reading units: ``t_op_ms``, ``c_u_GBps`` = 1/c_u and ``c_g_GBps`` = 1/c_g (bytes of
    distinct experts per second), ``c_t_ms`` (per token)."""
    coefs, eps = [], []
    for label, decision in decisions.items():
        rows = decision.kept
        fits = fit.fit_layers(rows)
        errors = fit.window_errors(fits, rows)
        read = expert_op.read_bandwidth(rows)["median_GBps"]
        table = fit_table(fits, errors)
        with np.errstate(divide="ignore"):   # a coefficient held at 0 is an infinite rate
            table = table.assign(engine=label, read_GBps=read, t_op_ms=table["t_op"] * 1e3,
                                 c_u_GBps=1e-9 / table["c_u"], c_g_GBps=1e-9 / table["c_g"], c_t_ms=table["c_t"] * 1e3)
        coefs.append(table)
        eps.append(fit.epsilon(errors).assign(engine=label, read_GBps=read))
    return pd.concat(coefs, ignore_index=True), pd.concat(eps, ignore_index=True)

