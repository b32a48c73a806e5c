"""Selection rules for Appendix B's examples (Figures B1/B2/B6/B7 and B4), written in code so that
no example is hand-picked. Every rule takes the decisions table of :func:`moespec.oracle.boundaries.decisions`
(or the alpha = 0 ablation's changed positions), keeps the rows that satisfy it, orders them by
its score (ties by response then position), and takes at most one case per response.
"""

from __future__ import annotations

import pandas as pd

from .boundaries import BOUNDARY_LABELS


def _pick(rows: pd.DataFrame, score: str, ascending: bool, n: int) -> pd.DataFrame:
    """The first ``n`` rows by ``score`` (ties by seq_id, i), at most one per response."""
    ordered = rows.sort_values([score, "seq_id", "i"], ascending=[ascending, True, True], kind="mergesort")
    return ordered.drop_duplicates("seq_id").head(n)


def full_matches(table: pd.DataFrame, lmax: int, n: int = 4) -> pd.DataFrame:
    """B1/B6: k* = Lmax and every drafted token matches; likeliest first (p_drafted)."""
    return _pick(table[(table.k == lmax) & table.all_matched], "p_drafted", False, n)


def stops_before_boundary(table: pd.DataFrame, n: int = 2) -> pd.DataFrame:
    """B1/B6: every drafted token matches and the token just past k* is a boundary
    (:data:`~moespec.oracle.boundaries.BOUNDARY_LABELS`); longest draft first (k), then p_drafted."""
    rows = table[table.all_matched & table.label_next.isin(BOUNDARY_LABELS)]
    rows = rows.assign(_score=rows.k + rows.p_drafted / 2)          # k first; p in [0, 1] breaks ties within a k
    return _pick(rows, "_score", False, n).drop(columns="_score")


def low_cost_mismatches(table: pd.DataFrame, n: int = 2) -> pd.DataFrame:
    """B2/B7: a first mismatch inside the draft (step >= 2) with the fewest new experts at its step."""
    rows = table[(table.first_mismatch >= 2) & table.new_at_mismatch.notna()]
    return _pick(rows, "new_at_mismatch", True, n)


def counterexamples(table: pd.DataFrame, lmax: int, n: int = 2) -> pd.DataFrame:
    """B7: k* < Lmax although the surrogate probability that k* + 1 tokens match (p_more) is the highest."""
    rows = table[(table.k < lmax) & table.p_more.notna()]
    return _pick(rows, "p_more", False, n)


#: The gallery's rules, in the order they are drawn: name -> rule(table, lmax).
RULES = {"full-length match": lambda t, lmax: full_matches(t, lmax),
         "stop right before a boundary": lambda t, lmax: stops_before_boundary(t),
         "low-cost mismatch": lambda t, lmax: low_cost_mismatches(t),
         "counterexample: likely match, short k*": lambda t, lmax: counterexamples(t, lmax)}


def gallery(table: pd.DataFrame, lmax: int) -> pd.DataFrame:
    """Every rule's picks, one table with a column ``rule`` (a rule with no case has no row)."""
    parts = [rule(table, lmax).assign(rule=name) for name, rule in RULES.items()]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else table.head(0).assign(rule=pd.Series(dtype=object))


def b4_cases(changed: pd.DataFrame, n: int = 4, surrogate: dict | None = None) -> pd.DataFrame:
    """Figure B4: positions where alpha = 0 moves k* to k* + 1 (``analysis.alpha0_ablation``'s
    changed rows), highest surrogate probability of the added token first, one per response.
    ``surrogate`` (seq_id -> the recorded surrogate p): the added token's surrogate probability
    ``p_added_surrogate`` = p[i + k*] is added and ranks the cases (the ablation's ``p_added`` is the
    solved transitions' p: 0 or 1 under the greedy-exact ones); without it ``p_added`` ranks."""
    rows = changed[changed.k_alpha0 == changed.k_full + 1]
    score = "p_added"
    if surrogate is not None:
        def added(r):
            p = surrogate[r.seq_id]
            j = int(r.i) + int(r.k_full)
            return float(p[j]) if j < len(p) else float("nan")
        rows = rows.assign(p_added_surrogate=[added(r) for r in rows.itertuples()])
        score = "p_added_surrogate"
    return _pick(rows[rows[score].notna()], score, False, n)
