"""Paper 2's Appendix A tables on this machine (Tables A1, A3, A5, A7, the pooled model per K,
leave-one-K-out, A.9's ladder) with paper 2's published values, where its text gives them, as rows
labelled as theirs (``source`` column; values from :func:`moespec.paper_reference.paper2_value`,
never inputs). The numbers come from :mod:`moespec.oracle.categories`,
:mod:`moespec.oracle.budget` and :mod:`moespec.oracle.robustness`."""

from __future__ import annotations

import pandas as pd

from moespec.oracle.rounds import validate_rounds
from moespec.paper_reference import PAPER2_LABEL, paper2_value
from moespec.tables.oracle import ours_vs_paper

OURS = "ours (this machine)"


def beside_paper(table: pd.DataFrame, paper_rows: list[dict]) -> pd.DataFrame:
    """``table`` (``source`` = ours) followed by paper 2's rows (``source`` = paper 2, published).
    Each of ``paper_rows`` maps a column to a quantity of ``paper2_scalars.csv`` (``{"q": name}``)
    or to a literal label (a plain string)."""
    def value(v):
        return paper2_value(v["q"]) if isinstance(v, dict) else v
    theirs = pd.DataFrame([{col: value(v) for col, v in row.items()} for row in paper_rows])
    # a column that holds paper 2's text holds ours as text too, to 6 significant digits
    shared = {c: table[c].map(lambda x: "" if pd.isna(x) else format(x, ".6g"))
              for c in theirs if c in table and pd.api.types.is_float_dtype(table[c])}
    out = pd.concat([table.assign(source=OURS, **shared), theirs.assign(source=PAPER2_LABEL)], ignore_index=True)
    ints = [c for c in table.select_dtypes("integer").columns if c not in theirs]   # counts stay integers beside blanks
    return out.astype({c: "Int64" for c in ints})


def table_a1(rounds: pd.DataFrame, subject: str = "") -> pd.DataFrame:
    """Table A1: the speculative rounds by run (one run = one K): rounds, generations, median L,
    median and mean T_T and T_D, mean Ubar_r and mean accepted tokens per round."""
    spec = validate_rounds(rounds[rounds.K >= 1])
    table = spec.groupby("K").agg(
        rounds=("T_T_ms", "size"), generations=("gen_id", "nunique"), median_L=("L", "median"),
        T_T_median_ms=("T_T_ms", "median"), T_T_mean_ms=("T_T_ms", "mean"),
        T_D_median_ms=("T_D_ms", "median"), T_D_mean_ms=("T_D_ms", "mean"),
        ubar_mean=("ubar", "mean"), accepted_mean=("accepted", "mean")).reset_index()
    return beside_paper(table.assign(K=table.K.astype(str), subject=subject),
                        [{"K": "1..10 (their runs)", "median_L": {"q": "tableA1_median_L_range"}}])


def table_a3(by_category: pd.DataFrame) -> pd.DataFrame:
    """Table A3 (:func:`moespec.oracle.categories.factor_importance_by_category`) beside paper 2's range."""
    return beside_paper(by_category, [{"category": "range over their 14 categories",
                                       "oos_r2_ubar": {"q": "tableA3_ubar_only_oos_R2_range"}}])


def table_a5(by_category: pd.DataFrame) -> pd.DataFrame:
    """Table A5 (:func:`moespec.oracle.categories.model_by_category`) beside paper 2's ranges."""
    return beside_paper(by_category, [{"category": "range over their 14 categories", "K": "8",
                                       "alpha_ms_per_expert": {"q": "tableA5_alpha_ms_per_expert_range"},
                                       "c_ms_per_token": {"q": "tableA5_c_ms_per_token_range"},
                                       "cv_mape_pct": {"q": "figA4_typical_error_pct"}}])


def table_pooled_by_k(per_k: pd.DataFrame) -> pd.DataFrame:
    """Figure A5's table (:func:`moespec.oracle.budget.pooled_by_k`) beside paper 2's MAPEs per K."""
    return beside_paper(per_k.assign(K=per_k.K.astype(str)),
                        [{"K": "1", "mape_pct": {"q": "pooled_A3_MAPE_pct_K1"}},
                         {"K": "3", "mape_pct": {"q": "pooled_A3_MAPE_pct_K3"}},
                         {"K": ">= 5", "mape_pct": {"q": "pooled_A3_MAPE_pct_K_ge_5"}}])


def table_leave_one_k_out(loko: pd.DataFrame) -> pd.DataFrame:
    """Leave-one-K-out (:func:`moespec.oracle.budget.leave_one_k_out`) beside paper 2's values."""
    return beside_paper(loko, [{"K": "1", "mape_pct": {"q": "leave_one_K_out_MAPE_pct_K1"}},
                               {"K": "3", "mape_pct": {"q": "leave_one_K_out_MAPE_pct_K3"}},
                               {"K": "mean", "mape_pct": {"q": "leave_one_K_out_MAPE_pct_mean"}}])


def table_a7(robust: pd.DataFrame) -> pd.DataFrame:
    """Table A7 (:func:`moespec.oracle.robustness.robustness_table`) beside paper 2's ranges."""
    return beside_paper(robust, [{"method": "range over their checks (K = 8)", "K": "8",
                                  "alpha_ms_per_expert": {"q": "robustness_alpha_ms_per_expert_K8_range"},
                                  "c_ms_per_token": {"q": "robustness_c_ms_per_token_K8_range"}}])


def table_ladder(ladder: pd.DataFrame) -> pd.DataFrame:
    """A.9's ladder (:func:`moespec.oracle.robustness.specification_ladder`) beside paper 2's values."""
    return beside_paper(ladder, [
        {"specification": "Ubar", "r2_in": {"q": "ladder_Ubar_R2"}, "cv_mape_pct": {"q": "ladder_Ubar_cv_MAPE_pct"}},
        {"specification": "Ubar + L", "r2_in": {"q": "ladder_Ubar_L_R2"},
         "cv_mape_pct": {"q": "ladder_Ubar_L_cv_MAPE_pct"}},
        {"specification": "+ linear m / + mL, m Ubar / + E_max",
         "cv_mape_pct": {"q": "ladder_linear_m_interactions_umax_cv_MAPE_pct"}},
        {"specification": "categorical budget (4)", "r2_in": {"q": "ladder_categorical_R2"},
         "cv_mape_pct": {"q": "ladder_categorical_cv_MAPE_pct"}}])


def diagnostics(bp_pool: dict, bp_top: dict, k: int, corr_ubar_l: float) -> pd.DataFrame:
    """Breusch-Pagan p-values (:func:`moespec.oracle.robustness.breusch_pagan`) of eq. (4) on all
    speculative rounds and of the per-K model at the largest K, and corr(Ubar_r, L) on all speculative
    rounds, ours beside paper 2's (its test is on its pool of about 9e5 rounds)."""
    return ours_vs_paper({"breusch_pagan_p": f"{bp_pool['lm_p']:.3g} (eq. (4), {bp_pool['rounds']} rounds)",
                          f"breusch_pagan_p_K{k}": f"{bp_top['lm_p']:.3g} (T_T ~ Ubar + L, {bp_top['rounds']} rounds)",
                          "corr_ubar_L": f"{corr_ubar_l:.3f}"})
