"""Paper 2's analyses by dataset category (Appendix A.5.1 and A.6.1).

- ``factor_importance_by_category``: Table A3 / Figure A1, the out-of-sample R² of T_T ~ Ubar_r and
  T_T ~ Ubar_r + L within each category, GroupKFold by generation (Table A2's protocol,
  :func:`moespec.oracle.regression.cross_validate`), mean and 95% t-interval across the folds.
- ``model_by_category``: Table A5 / Figures A3, A4, eq. (4) T_T ~ Ubar_r x C(K) + L within each
  category (:func:`moespec.oracle.regression.fit_categorical`): alpha at the largest K with its
  clustered standard error and 95% interval, the shared c, and the six held-out metrics of Figure A4
  with 95% t-intervals across the folds.

A category enters a table only when it has enough generations (``category_minimum``); the others
are kept as rows with the reason and no numbers, never dropped silently. The last row of each
table is the full pool (every category together), paper 2's summary row.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import regression as R
from .rounds import validate_rounds

#: A category's generations needed for a per-category row: GroupKFold(5) then holds out two
#: generations per fold, so that a fold's R² is not one generation's.
MIN_GENERATIONS = 10
#: Generations needed at every K of the data for eq. (4) within a category: alpha(m) is then
#: estimated from more than one generation (one cluster has no clustered standard error), and
#: stratified GroupKFold keeps every K in each training fold.
MIN_GENERATIONS_PER_K = 2
#: The summary row's label.
POOL = "all categories (full pool)"


def category_minimum(rounds: pd.DataFrame, min_generations: int = MIN_GENERATIONS,
                     min_generations_per_k: int = 0, n_splits: int = 5) -> tuple[list[str], pd.DataFrame]:
    """(categories that meet the minimum, a table of those that do not: category, rounds,
    generations, reason). ``min_generations_per_k`` > 0 also asks for that many generations at
    every K present in ``rounds``."""
    need = max(min_generations, n_splits)
    ks = sorted(rounds.K.unique())
    included, excluded = [], []
    for cat, g in rounds.groupby("category", sort=True):
        reasons = []
        n_gen = g.gen_id.nunique()
        if n_gen < need:
            reasons.append(f"{n_gen} generations, fewer than the minimum {need}")
        if min_generations_per_k:
            per_k = g.groupby("K").gen_id.nunique().reindex(ks, fill_value=0)
            short = per_k[per_k < min_generations_per_k]
            if len(short):
                reasons.append(f"fewer than {min_generations_per_k} generations at K = "
                               + ", ".join(f"{k} ({n})" for k, n in short.items()))
        if reasons:
            excluded.append({"category": cat, "rounds": len(g), "generations": n_gen, "reason": "; ".join(reasons)})
        else:
            included.append(cat)
    return included, pd.DataFrame(excluded, columns=["category", "rounds", "generations", "reason"])


def _fold_interval(cv: pd.DataFrame, column: str, prefix: str) -> dict:
    """A metric's mean over the folds and its 95% t-interval (Table A2's convention)."""
    mean, half = R._ci(cv[column])
    return {prefix: mean, f"{prefix}_lo": mean - half, f"{prefix}_hi": mean + half}


def _per_category(rounds: pd.DataFrame, included: list[str], excluded: pd.DataFrame, analyse):
    """(rows, excluded): ``analyse(category, its rounds)`` for each included category and then the
    full pool; a category whose fit the rounds do not determine (a fold without some K, a singular
    design) joins the excluded ones with the fit's error as its reason. The pool's errors propagate."""
    rows, failed = [], []
    for cat in included + [POOL]:
        sub = rounds if cat == POOL else rounds[rounds.category == cat]
        head = {"category": cat, "status": "included", "rounds": len(sub), "generations": sub.gen_id.nunique()}
        try:
            rows.append(head | analyse(cat, sub))
        except (ValueError, ZeroDivisionError, np.linalg.LinAlgError) as exc:
            if cat == POOL:
                raise
            failed.append({k: head[k] for k in ("category", "rounds", "generations")}
                          | {"reason": f"the fit failed: {type(exc).__name__}: {exc}"})
    return rows, pd.concat([excluded, pd.DataFrame(failed, columns=excluded.columns)], ignore_index=True)


def _with_excluded(rows: list[dict], excluded: pd.DataFrame, sort_by: str, ascending: bool) -> pd.DataFrame:
    """Included categories sorted by ``sort_by``, then the full pool, then the excluded ones with reasons."""
    table = pd.DataFrame(rows)
    cats = table[table.category != POOL].sort_values(sort_by, ascending=ascending)
    return pd.concat([cats, table[table.category == POOL], excluded.assign(status="excluded")],
                     ignore_index=True)


def factor_importance_by_category(rounds: pd.DataFrame, n_splits: int = 5,
                                  min_generations: int = MIN_GENERATIONS) -> pd.DataFrame:
    """Table A3: per category (sorted by the Ubar-only R²) and for the full pool, the GroupKFold
    out-of-sample R² of T_T ~ Ubar_r and of T_T ~ Ubar_r + L with 95% t-intervals across folds, the
    paired R² gain of adding L (corr(Ubar_r, L) on all rounds: ``07_tableA7_diagnostics.csv``)."""
    rounds = validate_rounds(rounds)
    included, excluded = category_minimum(rounds, min_generations, n_splits=n_splits)
    def row(cat, sub):
        alone = R.cross_validate("T_T_ms ~ ubar", sub, n_splits)
        both = R.cross_validate(R.UBAR_L, sub, n_splits)
        gain = pd.DataFrame({"gain": both.r2.to_numpy() - alone.r2.to_numpy()})
        return {**_fold_interval(alone, "r2", "oos_r2_ubar"), **_fold_interval(both, "r2", "oos_r2_ubar_L"),
                **_fold_interval(gain, "gain", "r2_gain_of_L")}

    rows, excluded = _per_category(rounds, included, excluded, row)
    return _with_excluded(rows, excluded, "oos_r2_ubar", ascending=False)


def largest_k(rounds: pd.DataFrame) -> int:
    """The largest speculative K in ``rounds`` (paper 2's K = 8 for Table A5 and A.9)."""
    ks = rounds.K[rounds.K >= 1]
    if ks.empty:
        raise ValueError("rounds: no speculative rounds (K >= 1)")
    return int(ks.max())


def model_by_category(rounds: pd.DataFrame, n_splits: int = 5, min_generations: int = MIN_GENERATIONS,
                      min_generations_per_k: int = MIN_GENERATIONS_PER_K) -> pd.DataFrame:
    """Table A5: eq. (4) within each category (sorted by alpha) and on the full pool: alpha at the
    largest K with clustered se and 95% interval (estimate +- 1.96 se, the normal interval of the
    clustered fit), the shared c with its se and interval, and the held-out (GroupKFold) metrics of
    Figure A4, each with a 95% t-interval across folds. ``generations_at_K``: the generations that
    alpha at that K rests on."""
    rounds = validate_rounds(rounds[rounds.K >= 1])
    k = largest_k(rounds)
    included, excluded = category_minimum(rounds, min_generations, min_generations_per_k, n_splits)
    def row(cat, sub):
        fit = R.fit_categorical(sub, n_splits)
        at_k = R.categorical_table(fit).set_index("K").loc[k]
        out = {"K": k, "generations_at_K": sub[sub.K == k].gen_id.nunique()}
        for name, est, se in (("alpha_ms_per_expert", at_k.alpha_ms_per_expert, at_k.alpha_se),
                              ("c_ms_per_token", at_k.c_ms_per_token, at_k.c_se)):
            out |= {name: est, f"{name}_se": se, f"{name}_lo": est - 1.96 * se, f"{name}_hi": est + 1.96 * se}
        for metric in R.SIX_METRICS:
            out |= _fold_interval(fit.cv, metric, f"cv_{metric}")
        return out

    rows, excluded = _per_category(rounds, included, excluded, row)
    return _with_excluded(rows, excluded, "alpha_ms_per_expert", ascending=True)
