"""Fits of the expert-operation time, effective bandwidths and the bandwidth error epsilon.

Paper 1, Section 2 and Appendix E. On passes with chosen ids at n = 2..9, per layer, by least
squares:

* eq. (4), per-slot kernel:        t_slot  = t_op + c_u·U·b + c_re·(n·m − U)·b
* eq. (E.1), deduplicating kernel: t_dedup = t_op + c_g·U·b + c_t·n

with b the bytes of one expert of the layer and U the distinct experts of the pass. The re-read
cost is c_re/c_u. Every coefficient is a time per unit (t_op is the layer's share of the fixed
work phi_p(n) >= 0 of eq. (5); c_u, c_re, c_g, c_t are times per byte or per token), so the
default fit is non-negative least squares (:data:`NONNEGATIVE`); the unconstrained least squares
of the paper's text (:data:`UNCONSTRAINED`) stays available beside it, and each fit's ``fit``
column says which it is. Each fit is then scored on windows of recorded routing, which it does not see:
its relative error (predicted − measured)/measured per window; epsilon_p is the median over
layers (and models) of each fit's median |relative error|, and an engine's epsilon is the larger
of its two kernels' (Section 4). Effective bandwidths follow Table 1: beta_slot(n) = Σ n·m·b /
Σ t_slot and beta_dedup(n) = Σ U·b / Σ t_dedup over layers and windows, r = beta_dedup/beta_slot,
ubar = Σ U·b / Σ n·m·b. The transfer test (Figure 7, Appendix E) fits log beta_p(n) linear in
log n and log b on the other models and predicts the held-out one.

Input rows are those of :mod:`moespec.measure.expert_op` (one row per pass and kernel).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.optimize import lsq_linear

#: Columns every timing row must carry for the fits and bandwidths.
REQUIRED = ("model", "layer", "kind", "kernel", "n", "m", "U", "expert_bytes", "t_median_s")
#: A fit is made per (group, kernel); these columns define the group where they are present.
GROUP = ("model", "backend", "fmt", "layer")
KERNELS = ("slot", "dedup")
FIT_NS = range(2, 10)
#: The kinds of timed passes (:mod:`moespec.measure.expert_op`): chosen ids, windows of one sequence,
#: batched passes of B sequences (batch mode).
TIMED_KINDS = ("chosen", "window", "batch")


def check_rows(rows: pd.DataFrame, source: str = "timing rows", kinds=("chosen", "window")) -> pd.DataFrame:
    """Return the rows of ``kinds`` with numeric columns, or raise ``ValueError`` naming the
    problem and the row: a missing column, an empty or non-numeric value, an infinite one, a time
    or expert size <= 0, or U outside [m, n·m]. Every timed pass (kinds chosen, window and batch) is
    checked, whichever ``kinds`` are returned (:data:`TIMED_KINDS`)."""
    missing = [c for c in REQUIRED if c not in rows.columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; expected at least {list(REQUIRED)}")
    df = rows[rows["kind"].isin(TIMED_KINDS)].copy()
    for col in ("layer", "n", "m", "U", "expert_bytes", "t_median_s"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
        bad = df[col].isna()
        if bad.any():
            i = df.index[bad][0]
            raise ValueError(f"{source}: column {col!r} is empty or not a number in {int(bad.sum())} row(s), "
                             f"first at row {i}: {rows.loc[i, col]!r}")
        bad = ~np.isfinite(df[col].to_numpy(dtype=float))
        if bad.any():
            i = df.index[bad][0]
            raise ValueError(f"{source}: column {col!r} must be finite; row {i} has {float(df.loc[i, col])} "
                             f"({int(bad.sum())} such row(s))")
    for col in ("t_median_s", "expert_bytes"):
        bad = df[col] <= 0
        if bad.any():
            i = df.index[bad][0]
            raise ValueError(f"{source}: {col} must be > 0; row {i} has {float(df.loc[i, col])} "
                             f"({int(bad.sum())} such row(s))")
    bad = (df["U"] < df["m"]) | (df["U"] > df["n"] * df["m"])
    if bad.any():
        i = df.index[bad][0]
        raise ValueError(f"{source}: row {i} has U={df.loc[i, 'U']} outside [m, n·m] = "
                         f"[{df.loc[i, 'm']}, {df.loc[i, 'n'] * df.loc[i, 'm']}]")
    unknown = set(df["kernel"]) - set(KERNELS)
    if unknown:
        raise ValueError(f"{source}: unknown kernel(s) {sorted(unknown)}; expected {KERNELS}")
    for col, low in (("layer", 0), ("n", 1), ("m", 1), ("U", 1)):   # counts and indices: whole numbers, not truncated
        bad = (df[col] != np.round(df[col])) | (df[col] < low)
        if bad.any():
            i = df.index[bad][0]
            raise ValueError(f"{source}: row {i}, column {col!r}: expected a whole number >= {low} (a "
                             f"{'layer index' if col == 'layer' else 'count'}); found {float(df.loc[i, col]):g} "
                             f"({int(bad.sum())} such row(s))")
    for col in ("layer", "n", "m", "U"):
        df[col] = df[col].astype(int)
    return df[df["kind"].isin(kinds)]


def _group_cols(df: pd.DataFrame) -> list[str]:
    return [c for c in GROUP if c in df.columns]


def design(kernel: str, n, m, U, b) -> np.ndarray:
    """The regressors of eq. (4) (``slot``: 1, U·b, (n·m−U)·b) or eq. (E.1) (``dedup``: 1, U·b, n)."""
    n, m, U, b = (np.asarray(v, dtype=float) for v in (n, m, U, b))
    one = np.ones_like(n)
    if kernel == "slot":
        return np.column_stack([one, U * b, (n * m - U) * b])
    if kernel == "dedup":
        return np.column_stack([one, U * b, n])
    raise ValueError(f"unknown kernel {kernel!r}; expected one of {KERNELS}")


COEFS = {"slot": ("t_op", "c_u", "c_re"), "dedup": ("t_op", "c_g", "c_t")}
#: The two fits, as the ``fit`` column names them: least squares with every coefficient >= 0
#: (the default: the theory's phi_p >= 0 and non-negative costs per byte and per token), and
#: plain least squares.
NONNEGATIVE, UNCONSTRAINED = "nonnegative", "unconstrained"
FITS = (NONNEGATIVE, UNCONSTRAINED)


def fit_one(kernel: str, n, m, U, b, t, fit: str = NONNEGATIVE) -> dict:
    """Coefficients of eq. (4) or (E.1) for one layer by least squares, with every coefficient
    >= 0 (``fit="nonnegative"``: bounded least squares, ``scipy.optimize.lsq_linear`` with the
    BVLS active set, exact at its optimum) or unconstrained (``fit="unconstrained"``); raises if
    the passes do not determine them (fewer than 3 passes or collinear regressors)."""
    if fit not in FITS:
        raise ValueError(f"fit must be one of {FITS}, found {fit!r}")
    X = design(kernel, n, m, U, b)
    t = np.asarray(t, dtype=float)
    scale = np.abs(X).max(axis=0)  # columns differ by ~1e9 in size; scale so that lstsq is well posed
    scale[scale == 0] = 1.0
    coef, _, rank, _ = np.linalg.lstsq(X / scale, t, rcond=None)
    if rank < 3:
        raise ValueError(f"{kernel} fit is undetermined: {len(t)} passes give rank {rank} < 3 "
                         "(need passes at several n and U)")
    if fit == NONNEGATIVE and (coef < 0).any():
        coef = lsq_linear(X / scale, t, bounds=(0.0, np.inf), method="bvls").x
    coef = coef / scale
    resid = t - X @ coef
    out = dict(zip(COEFS[kernel], coef.tolist()))
    out["fit"] = fit
    out["n_passes"] = int(len(t))
    out["fit_median_rel_err"] = float(np.median(np.abs(resid / t)))
    return out


def fitted_time(kernel: str, coefs: dict, n, m, U, b) -> np.ndarray:
    """Fitted operation time of eq. (4)/(E.1) at passes (n, m, U, b) (the prediction chain (22) of
    :mod:`moespec.predict` builds on it)."""
    beta = np.array([coefs[c] for c in COEFS[kernel]], dtype=float)
    return design(kernel, n, m, U, b) @ beta


def fit_layers(rows: pd.DataFrame, ns=FIT_NS, fit: str = NONNEGATIVE, kinds=("chosen",)) -> pd.DataFrame:
    """Fit eq. (4) and (E.1) per layer on the passes of ``kinds`` (chosen ids; ``("batch",)``: the
    batched passes of B sequences) with n in ``ns`` (2..9), with every coefficient >= 0 (default) or
    unconstrained (``fit``, see :func:`fit_one`).

    One row per (group, kernel): coefficients, which fit (``fit``), passes used, the fit's own
    median relative error and, for the per-slot kernel, the re-read cost c_re/c_u.
    """
    df = check_rows(rows, kinds=tuple(kinds))
    df = df[df["n"].isin(list(ns))]
    if df.empty:
        raise ValueError(f"no {'/'.join(kinds)} passes with n in {list(ns)} to fit")
    keys = _group_cols(df)
    out = []
    for key, g in df.groupby(keys + ["kernel"], sort=True):
        kernel = key[-1]
        res = fit_one(kernel, g["n"], g["m"], g["U"], g["expert_bytes"], g["t_median_s"], fit=fit)
        if kernel == "slot":   # undefined (NaN) where the non-negative fit holds c_u at 0
            res["reread_cost"] = res["c_re"] / res["c_u"] if res["c_u"] != 0 else float("nan")
        out.append({**dict(zip(keys + ["kernel"], key)), **res})
    return pd.DataFrame(out)


def window_errors(fits: pd.DataFrame, rows: pd.DataFrame, ns=FIT_NS) -> pd.DataFrame:
    """Each fit evaluated on the windows of recorded routing of its layer (which it did not see),
    at the pass sizes ``ns`` it was fitted over (2..9; n = 1 would be an extrapolation): one row
    per window pass with ``t_pred_s`` and ``rel_err`` = (predicted − measured)/measured."""
    win = check_rows(rows, kinds=("window",))
    win = win[win["n"].isin(list(ns))]
    keys = _group_cols(win) + ["kernel"]
    merged = win.merge(fits, on=keys, how="inner", suffixes=("", "_fit"))
    if merged.empty:
        raise ValueError("no window rows share a (model, backend, fmt, layer, kernel) with any fit")
    parts = []
    for kernel, g in merged.groupby("kernel"):
        g = g.copy()
        g["t_pred_s"] = [float(fitted_time(kernel, r, r["n"], r["m"], r["U"], r["expert_bytes"])[0])
                         for _, r in g.iterrows()]
        parts.append(g)
    out = pd.concat(parts)
    out["rel_err"] = (out["t_pred_s"] - out["t_median_s"]) / out["t_median_s"]
    return out


def epsilon(errors: pd.DataFrame, by=("backend",)) -> pd.DataFrame:
    """Bandwidth error (paper 1, Section 4): per kernel, the median over layers (and models) of
    each fit's median |relative error| on windows; the engine's epsilon is the larger of its two
    kernels'. ``by`` names the engine columns (default: backend). Columns: ``eps_slot``,
    ``eps_dedup``, ``eps_engine``, and the number of layer fits behind each."""
    by = [c for c in by if c in errors.columns]
    per_fit = (errors.assign(abs_err=errors["rel_err"].abs())
               .groupby(by + [c for c in _group_cols(errors) if c not in by] + ["kernel"])["abs_err"]
               .median().rename("median_abs_err").reset_index())
    rows = []
    for key, g in (per_fit.groupby(by) if by else [((), per_fit)]):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        for kernel in KERNELS:
            vals = g.loc[g["kernel"] == kernel, "median_abs_err"]
            row[f"eps_{kernel}"] = float(vals.median()) if len(vals) else np.nan
            row[f"fits_{kernel}"] = int(len(vals))
        row["eps_engine"] = float(np.nanmax([row["eps_slot"], row["eps_dedup"]]))
        rows.append(row)
    return pd.DataFrame(rows)


def _pass_bytes(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    df["slot_bytes"] = df["n"] * df["m"] * df["expert_bytes"]   # n·m·b, per-slot requested
    df["union_bytes"] = df["U"] * df["expert_bytes"]             # U·b, deduplicating requested
    df["req_bytes"] = np.where(df["kernel"] == "slot", df["slot_bytes"], df["union_bytes"])
    df["beta_GBps"] = df["req_bytes"] / df["t_median_s"] / 1e9
    return df


def window_bandwidths(rows: pd.DataFrame, kind: str = "window") -> pd.DataFrame:
    """Effective bandwidth of every pass (Figure 2): requested bytes over its median time, GB/s
    (per-slot on n·m·b, deduplicating on U·b)."""
    return _pass_bytes(check_rows(rows, kinds=(kind,)))


def bandwidth_table(rows: pd.DataFrame, by=("model", "backend", "fmt"), kind: str = "window") -> pd.DataFrame:
    """Table 1's definition, per ``by`` and n: beta_slot = Σ n·m·b / Σ t_slot, beta_dedup =
    Σ U·b / Σ t_dedup (sums over layers and windows), r = beta_dedup/beta_slot and
    ubar = Σ U·b / Σ n·m·b. Only passes timed with both kernels enter."""
    df = _pass_bytes(check_rows(rows, kinds=(kind,)))
    by = [c for c in by if c in df.columns]
    pass_key = [c for c in df.columns if c in ("run_id", "pass_id")] + by + ["layer", "n"]
    both = df.groupby(pass_key)["kernel"].transform("nunique") == 2
    df = df[both]
    out = []
    for key, g in df.groupby(by + ["n"]):
        s, d = g[g["kernel"] == "slot"], g[g["kernel"] == "dedup"]
        beta_slot = s["slot_bytes"].sum() / s["t_median_s"].sum() / 1e9
        beta_dedup = d["union_bytes"].sum() / d["t_median_s"].sum() / 1e9
        out.append({**dict(zip(by + ["n"], key)), "beta_slot_GBps": beta_slot, "beta_dedup_GBps": beta_dedup,
                    "r": beta_dedup / beta_slot, "ubar": d["union_bytes"].sum() / d["slot_bytes"].sum(),
                    "passes": int(len(s)), "expert_bytes": float(g["expert_bytes"].mean())})
    if not out:
        raise ValueError(f"no {kind} passes timed with both kernels")
    return pd.DataFrame(out)


def transfer(bw: pd.DataFrame, ns=FIT_NS, model_col: str = "model") -> pd.DataFrame:
    """Figure 7's transfer test. For each held-out model, fit log beta_p(n) = a + c_n·log n +
    c_b·log b on the other models' bandwidths (``bw`` from :func:`bandwidth_table`, n in ``ns``),
    and predict the held-out model's beta_p(n) and r(n) = beta_dedup/beta_slot.

    Raises ``ValueError`` if the other models do not determine the fit (fewer than two distinct
    expert sizes among them).
    """
    bw = bw[bw["n"].isin(list(ns))]
    models = sorted(bw[model_col].unique())
    if len(models) < 3:
        raise ValueError(f"the transfer test needs bandwidths of at least 3 models; got {models}")
    out = []
    for held in models:
        train, test = bw[bw[model_col] != held], bw[bw[model_col] == held]
        if train["expert_bytes"].nunique() < 2:
            raise ValueError(f"holding out {held}: the other models have one expert size "
                             f"({train['expert_bytes'].unique()}), so log b has no slope")
        pred = {}
        for kernel in KERNELS:
            col = f"beta_{kernel}_GBps"
            X = np.column_stack([np.ones(len(train)), np.log(train["n"]), np.log(train["expert_bytes"])])
            coef, *_ = np.linalg.lstsq(X, np.log(train[col].to_numpy(float)), rcond=None)
            Xt = np.column_stack([np.ones(len(test)), np.log(test["n"]), np.log(test["expert_bytes"])])
            pred[kernel] = np.exp(Xt @ coef)
        for i, (_, r) in enumerate(test.iterrows()):
            row = {model_col: held, "n": int(r["n"]), "expert_bytes": r["expert_bytes"]}
            for kernel in KERNELS:
                row[f"beta_{kernel}_meas"] = r[f"beta_{kernel}_GBps"]
                row[f"beta_{kernel}_pred"] = float(pred[kernel][i])
            row["r_meas"] = r["r"]
            row["r_pred"] = row["beta_dedup_pred"] / row["beta_slot_pred"]
            out.append(row)
    df = pd.DataFrame(out)
    for k in ("beta_slot", "beta_dedup", "r"):
        df[f"{k}_rel_err"] = (df[f"{k}_pred"] - df[f"{k}_meas"]) / df[f"{k}_meas"]
    return df


def transfer_crossover(transfer_rows: pd.DataFrame, bw: pd.DataFrame, model_col: str = "model") -> pd.DataFrame:
    """Figure 7's consequence (paper 1, Appendix E, "Transfer"): per held-out model, the crossover
    placed by the transferred bandwidths against the one placed by its own measured bandwidths.

    On each model's grid of pass sizes (the n of ``transfer_rows``, from :func:`transfer`), the
    saving per per-slot byte is eq. (6) with f_l = 1 and equal fixed work,
    S(n)/E_slot(n) = (1/beta_slot(n)) (1 - ubar(n)/r(n)), with the model's own byte share ubar(n)
    (``bw`` from :func:`bandwidth_table`: bytes come from routing, only the bandwidths are
    transferred) and the bandwidths either predicted (``*_pred``) or measured (``*_meas``). The
    crossover is :func:`moespec.theory.crossover` on that grid (the first grid n from which the
    saving stays positive; None: none), and the two agree within one pass size as in Table 8
    (:func:`moespec.theory.crossover_distance`, none counted as the last n + 1).
    """
    from moespec.theory import crossover, crossover_distance, saving_from_ratio

    need = {model_col, "n", "beta_slot_pred", "beta_slot_meas", "r_pred", "r_meas"}
    missing = sorted(need - set(transfer_rows.columns))
    if missing:
        raise ValueError(f"transfer rows: missing column(s) {missing}; expected the output of moespec.fit.transfer")
    if not {model_col, "n", "ubar"} <= set(bw.columns):
        raise ValueError(f"bandwidth table: expected columns {model_col!r}, 'n', 'ubar' "
                         f"(moespec.fit.bandwidth_table); found {sorted(bw.columns)}")
    out = []
    for held, g in transfer_rows.groupby(model_col, sort=False):
        g = g.sort_values("n")
        ns = [int(n) for n in g["n"]]
        share = bw[bw[model_col] == held].groupby("n")["ubar"].mean()
        absent = [n for n in ns if n not in share.index]
        if absent:
            raise ValueError(f"bandwidth table: no ubar for held-out model {held!r} at n = {absent}")
        ubar = share.loc[ns].to_numpy(float)
        row = {model_col: held, "ns": " ".join(map(str, ns))}
        for source in ("pred", "meas"):
            S = saving_from_ratio(1 / g[f"beta_slot_{source}"].to_numpy(float), ubar, g[f"r_{source}"].to_numpy(float))
            first = crossover(S, n_from=1)     # index on the grid, 1-based
            row[f"crossover_{source}"] = None if first is None else ns[first - 1]
            row[f"saving_s_per_GB_{source}"] = " ".join(f"{x:.4g}" for x in S)
        row["distance"] = crossover_distance(row["crossover_pred"], row["crossover_meas"], ns[-1])
        row["within_one"] = row["distance"] <= 1
        out.append(row)
    return pd.DataFrame(out, columns=[model_col, "ns", "crossover_pred", "crossover_meas", "distance", "within_one",
                                      "saving_s_per_GB_pred", "saving_s_per_GB_meas"])



#: The regime beyond bytes is accepted only over at least this many measured pass sizes (a line
#: t_op + c_n·n, checked on a third size).
MIN_REGIME_SIZES = 3
#: The regimes :func:`regimes` names: eq. (4)/(E.1) holds (bytes explain the time), or the time per
#: token t = t_op + c_n·n takes over (``beyond bytes``: on a CPU, the arithmetic of several tokens per expert).
BYTES, BEYOND = "bytes", "beyond bytes"


def byte_excess(fits: pd.DataFrame, rows: pd.DataFrame, kinds=("batch",)) -> pd.DataFrame:
    """Per (group, kernel, n) of the passes of ``kinds``: the median measured time, the median time
    the fit of eq. (4)/(E.1) (``fits`` from :func:`fit_layers`) gives for the same passes, and
    ``excess``, the median over passes of measured/fitted − 1 (the time the bytes do not explain)."""
    df = check_rows(rows, kinds=tuple(kinds))
    keys = _group_cols(df) + ["kernel"]
    merged = df.merge(fits, on=keys, how="inner", suffixes=("", "_fit"))
    if merged.empty:
        raise ValueError(f"no {'/'.join(kinds)} rows share a (model, backend, fmt, layer, kernel) with any fit")
    parts = []
    for kernel, g in merged.groupby("kernel"):
        X = design(kernel, g["n"], g["m"], g["U"], g["expert_bytes"])
        g = g.assign(t_fit_s=(X * g[list(COEFS[kernel])].to_numpy(float)).sum(axis=1))
        parts.append(g.assign(excess=g["t_median_s"] / g["t_fit_s"] - 1))
    per = pd.concat(parts)
    return (per.groupby(keys + ["n"], sort=True)
            .agg(t_median_s=("t_median_s", "median"), t_fit_s=("t_fit_s", "median"), excess=("excess", "median"),
                 passes=("excess", "size")).reset_index())


def _byte_fit(kernel: str, g: pd.DataFrame, fit: str) -> tuple[dict, np.ndarray]:
    """Eq. (4)/(E.1) on the passes ``g`` and their relative residuals (measured − fitted)/measured."""
    res = fit_one(kernel, g["n"], g["m"], g["U"], g["expert_bytes"], g["t_median_s"], fit=fit)
    t = g["t_median_s"].to_numpy(float)
    return res, (t - fitted_time(kernel, res, g["n"], g["m"], g["U"], g["expert_bytes"])) / t


def _token_fit(g: pd.DataFrame) -> tuple[dict, np.ndarray]:
    """t = t_op + c_n·n by non-negative least squares (the regime beyond bytes), and its relative residuals."""
    n, t = g["n"].to_numpy(float), g["t_median_s"].to_numpy(float)
    X = np.column_stack([np.ones_like(n), n])
    scale = X.max(axis=0)
    coef = lsq_linear(X / scale, t, bounds=(0.0, np.inf), method="bvls").x / scale
    rel = (t - X @ coef) / t
    return ({"t_op": float(coef[0]), "c_n": float(coef[1]), "fit": NONNEGATIVE, "n_passes": int(len(t)),
             "fit_median_rel_err": float(np.median(np.abs(rel)))}, rel)


def _bic(rel: np.ndarray, params: int) -> float:
    """Bayesian information criterion of a fit from its relative residuals (Gaussian errors)."""
    rss = max(float(np.sum(rel ** 2)), 1e-300)
    return len(rel) * np.log(rss / len(rel)) + params * np.log(len(rel))


def regimes(rows: pd.DataFrame, kinds=("batch",), base_ns=FIT_NS, fit: str = NONNEGATIVE,
            min_sizes: int = MIN_REGIME_SIZES) -> pd.DataFrame:
    """Whether, and from which n, the bytes stop explaining the expert operation's time, chosen from
    the passes of ``kinds`` (the batched passes: n = B(k + 1) up to 72), per (group, kernel).

    Two descriptions of the passes with n >= 2 are compared by the Bayesian information criterion
    on their relative residuals: one fit of eq. (4)/(E.1) over the whole range (3 coefficients), and
    for every split n_s above ``base_ns`` (the pass sizes of paper 1's fits stay in the byte regime)
    with at least ``min_sizes`` measured sizes from it, eq. (4)/(E.1) below n_s and the time per
    token t = t_op + c_n·n from n_s (6 parameters with the split). The split is a second regime when
    its criterion is lower than the single fit's and the passes from n_s take longer than the byte fit
    below predicts for them (median measured/fitted − 1 > 0: a bound other than bytes).

    One row per (group, kernel, regime): ``regime`` (:data:`BYTES`, :data:`BEYOND`), ``n_from``,
    ``n_to``, the coefficients (bytes: eq. (4)/(E.1); beyond: ``t_op``, ``c_n``, both >= 0),
    ``fit_median_rel_err``, ``n_passes``, ``bic`` of the chosen description and ``bic_single`` of
    the single fit, and on the beyond row ``excess_at_boundary`` (measured over the byte fit's
    time at n_s, median − 1)."""
    df = check_rows(rows, kinds=tuple(kinds))
    df = df[df["n"] >= 2]
    keys = _group_cols(df) + ["kernel"]
    out = []
    for key, g in df.groupby(keys, sort=True):
        info = dict(zip(keys, key))
        kernel = info["kernel"]
        single, rel = _byte_fit(kernel, g, fit)
        bic_single = _bic(rel, 3)
        best = None
        sizes = sorted(set(g["n"]))
        for ns in [n for i, n in enumerate(sizes) if n > max(base_ns) and len(sizes) - i >= min_sizes]:
            low, high = g[g["n"] < ns], g[g["n"] >= ns]
            below, rel_low = _byte_fit(kernel, low, fit)
            beyond, rel_high = _token_fit(high)
            bic = _bic(np.concatenate([rel_low, rel_high]), 6)
            if best is None or bic < best[0]:
                best = (bic, ns, below, beyond)
        common = {**info, "bic_single": bic_single}
        if best is not None and best[0] < bic_single:
            bic, ns, below, beyond = best
            at = g[g["n"] == ns]
            excess = at["t_median_s"] / fitted_time(kernel, below, at["n"], at["m"], at["U"], at["expert_bytes"]) - 1
            high = g[g["n"] >= ns]
            over = high["t_median_s"] / fitted_time(kernel, below, high["n"], high["m"], high["U"],
                                                    high["expert_bytes"]) - 1
            if float(np.median(over)) > 0:
                out.append({**common, "regime": BYTES, "n_from": sizes[0], "n_to": int(g.loc[g["n"] < ns, "n"].max()),
                            "bic": bic, **below})
                out.append({**common, "regime": BEYOND, "n_from": int(ns), "n_to": sizes[-1], "bic": bic, **beyond,
                            "excess_at_boundary": float(np.median(excess))})
                continue
        out.append({**common, "regime": BYTES, "n_from": sizes[0], "n_to": sizes[-1], "bic": bic_single, **single})
    return pd.DataFrame(out)
