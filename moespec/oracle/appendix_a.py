"""Paper 2's Appendix A on one run's rounds, written to a figures folder: one function per part
(notebook 07, section 2b, calls each once). Each writes its ``07_tableA*`` / ``07_figA*`` files and
returns a short summary table. The ``subject`` column names our rows' subject; paper 2's rows
(``source``) have none. The analyses are :mod:`moespec.oracle.categories`,
:mod:`moespec.oracle.budget` and :mod:`moespec.oracle.robustness`, the tables (with paper 2's
published values beside ours) :mod:`moespec.tables.oracle_appendix_a`, the figures
:mod:`moespec.plots.oracle_appendix_a`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moespec import io
from moespec.plots import oracle_appendix_a as plots
from moespec.tables import oracle_appendix_a as tables

from . import budget, categories, robustness


def _span(table: pd.DataFrame, col: str) -> str:
    """``col``'s range over the reported categories (:func:`_range`), or why there is none."""
    cats = table[(table.status == "included") & (table.category != categories.POOL)]
    return _range(cats[col]) if len(cats) else "no category met the minimum"


def _summary(table: pd.DataFrame, col: str, what: str) -> pd.DataFrame:
    """One row: how many categories were reported and excluded, the range of ``col`` over them and the pool's value."""
    pool = table[table.category == categories.POOL]
    reported = (table.status == "included") & (table.category != categories.POOL)
    return pd.DataFrame([{"quantity": what, "categories reported": int(reported.sum()),
                          "excluded": int((table.status == "excluded").sum()),
                          "range over the categories": _span(table, col),
                          "full pool": float(pool[col].iloc[0]) if len(pool) else np.nan}])


def write_factors_by_category(rounds: pd.DataFrame, fig_dir: Path, subject: str = "") -> pd.DataFrame:
    """Table A1 (``07_tableA1_dataset.csv``), Table A3 (``07_tableA3_factors_by_category.csv``) and
    Figure A1 (``07_figA1_r2_by_category.png``) from the speculative rounds of ``rounds``."""
    spec = rounds[rounds.K >= 1]
    io.write_dataframe(fig_dir / "07_tableA1_dataset.csv", tables.table_a1(spec, subject))
    a3 = categories.factor_importance_by_category(spec)
    io.write_dataframe(fig_dir / "07_tableA3_factors_by_category.csv", tables.table_a3(a3.assign(subject=subject)))
    io.save_figure(plots.fig_a1_r2_by_category(a3), fig_dir / "07_figA1_r2_by_category.png")
    return _summary(a3, "oos_r2_ubar", "Table A3: held-out R2 of T_T ~ Ubar")


def write_model_by_category(rounds: pd.DataFrame, fig_dir: Path, subject: str = "") -> pd.DataFrame:
    """Table A5 (``07_tableA5_model_by_category.csv``), Figures A3 and A4 (``07_figA3_alpha_by_category.png``,
    ``07_figA4_metrics_by_category.png``)."""
    a5 = categories.model_by_category(rounds[rounds.K >= 1])
    io.write_dataframe(fig_dir / "07_tableA5_model_by_category.csv", tables.table_a5(a5.assign(subject=subject)))
    io.save_figure(plots.fig_a3_alpha_by_category(a5), fig_dir / "07_figA3_alpha_by_category.png")
    io.save_figure(plots.fig_a4_metrics_by_category(a5), fig_dir / "07_figA4_metrics_by_category.png")
    return pd.concat([_summary(a5, "alpha_ms_per_expert", "Table A5: alpha at the largest K (ms per expert)"),
                      _summary(a5, "cv_mape_pct", "Table A5: held-out MAPE (%)")], ignore_index=True)


def write_budget_transfer(rounds: pd.DataFrame, fig_dir: Path, subject: str = "") -> pd.DataFrame:
    """Figure A5 and its table (``07_figA5_pooled_vs_per_k.png``, ``07_figA5_pooled_by_k.csv``) and
    leave-one-K-out of the pooled form (``07_leave_one_k_out.csv``); returns the latter."""
    spec = rounds[rounds.K >= 1]
    per_k = budget.pooled_by_k(spec)
    io.write_dataframe(fig_dir / "07_figA5_pooled_by_k.csv", tables.table_pooled_by_k(per_k.assign(subject=subject)))
    io.save_figure(plots.fig_a5_pooled_vs_per_k(spec, per_k), fig_dir / "07_figA5_pooled_vs_per_k.png")
    loko = budget.leave_one_k_out(spec)
    io.write_dataframe(fig_dir / "07_leave_one_k_out.csv", tables.table_leave_one_k_out(loko.assign(subject=subject)))
    return loko[["K", "rounds_held_out", "mape_pct", "mape_lo", "mape_hi"]]


def write_robustness(rounds: pd.DataFrame, fig_dir: Path, subject: str = "", n_boot: int = robustness.N_BOOT,
                     seed: int = 0) -> pd.DataFrame:
    """Table A7 and Figure A7 (``07_tableA7_robustness.csv``, ``07_figA7_robustness.png``), the binned
    residuals (``07_tableA7_residual_bins.csv``, ``07_figA7_residual_bins.png``), the Breusch-Pagan
    tests (eq. (4) on all speculative rounds, the per-K model on the largest-K rounds) and
    corr(Ubar_r, L) (``07_tableA7_diagnostics.csv``), and A.9's ladder on all speculative rounds
    (``07_tableA9_ladder.csv``); returns Table A7's coefficients."""
    spec = rounds[rounds.K >= 1]
    robust = robustness.robustness_table(spec, n_boot=n_boot, seed=seed)
    io.write_dataframe(fig_dir / "07_tableA7_robustness.csv", tables.table_a7(robust.assign(subject=subject)))
    io.save_figure(plots.fig_a7_robustness(robust), fig_dir / "07_figA7_robustness.png")
    top = robustness.largest_k_rounds(spec)
    bins = robustness.binned_residuals(top)
    io.write_dataframe(fig_dir / "07_tableA7_residual_bins.csv", bins.assign(subject=subject))
    io.save_figure(plots.fig_binned_residuals(bins), fig_dir / "07_figA7_residual_bins.png")
    k = int(top.K.iloc[0])
    io.write_dataframe(fig_dir / "07_tableA7_diagnostics.csv", tables.diagnostics(
        robustness.breusch_pagan(spec, robustness.CATEGORICAL_WITH_CONSTANT), robustness.breusch_pagan(top), k,
        float(np.corrcoef(spec.ubar, spec.L)[0, 1])).assign(subject=subject))
    io.write_dataframe(fig_dir / "07_tableA9_ladder.csv",
                       tables.table_ladder(robustness.specification_ladder(spec).assign(subject=subject)))
    return robust[["method", "alpha_ms_per_expert", "alpha_ms_per_expert_lo", "alpha_ms_per_expert_hi",
                   "c_ms_per_token", "c_ms_per_token_lo", "c_ms_per_token_hi"]]


def _ours(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["source"].astype(str).str.startswith("ours")] if "source" in table else table


def _range(values) -> str:
    """'a-b' over the numeric values (4 significant digits), 'a' for one, '' for none."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    return f"{v.min():.4g}-{v.max():.4g}" if len(v) > 1 else (f"{v.iloc[0]:.4g}" if len(v) else "")


def comparison_values(fig_dir: Path) -> dict:
    """Our values of the Appendix A quantities paper 2's text publishes (rows of
    ``data/paper_reference/paper2_scalars.csv``), read back from the files the writers above wrote,
    for ``tables.oracle.ours_vs_paper``: Table A3's and A5's ranges over the reported categories,
    the leave-one-K-out mean, Table A7's range over the robustness checks, A.9's ladder and
    corr(Ubar, L). A quantity whose file was not written is left out."""
    fig_dir = Path(fig_dir)
    out = {}

    def read(name):
        path = fig_dir / name
        return _ours(pd.read_csv(path)) if path.is_file() else None

    if (a3 := read("07_tableA3_factors_by_category.csv")) is not None:
        cats = a3[(a3.status == "included") & (a3.category != categories.POOL)]
        out["tableA3_ubar_only_oos_R2_range"] = _range(cats.oos_r2_ubar)
    if (a5 := read("07_tableA5_model_by_category.csv")) is not None:
        cats = a5[(a5.status == "included") & (a5.category != categories.POOL)]
        out["tableA5_alpha_ms_per_expert_range"] = _range(cats.alpha_ms_per_expert)
        out["tableA5_c_ms_per_token_range"] = _range(cats.c_ms_per_token)
    if (loko := read("07_leave_one_k_out.csv")) is not None:
        out["leave_one_K_out_MAPE_pct_mean"] = _range(loko[loko.K.astype(str) == "mean"].mape_pct)
    if (a7 := read("07_tableA7_robustness.csv")) is not None:
        out["robustness_alpha_ms_per_expert_K8_range"] = _range(a7.alpha_ms_per_expert)
        out["robustness_c_ms_per_token_K8_range"] = _range(a7.c_ms_per_token)
    if (ladder := read("07_tableA9_ladder.csv")) is not None:
        rung = ladder.set_index("specification")
        for key, spec in (("Ubar", "Ubar"), ("Ubar_L", "Ubar + L"), ("categorical", "categorical budget (4)")):
            if spec in rung.index:
                out[f"ladder_{key}_R2"] = _range([rung.loc[spec, "r2_in"]])
                out[f"ladder_{key}_cv_MAPE_pct"] = _range([rung.loc[spec, "cv_mape_pct"]])
    diag = fig_dir / "07_tableA7_diagnostics.csv"
    if diag.is_file():
        d = pd.read_csv(diag).set_index("quantity")
        if "corr_ubar_L" in d.index:
            out["corr_ubar_L"] = str(d.loc["corr_ubar_L", d.columns[0]])
    return out
