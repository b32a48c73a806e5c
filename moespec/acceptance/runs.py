"""moespec's own runs: notebook 05's real-draft runs write, per machine state, prompt and draft
length k, the verify steps and the steps that accepted at least i drafts (i = 1..k)
(:data:`PROFILE_TABLE`, long form: one row per position). A run's acceptance profile keeps every
draft length apart (:attr:`AcceptanceProfile.at_k`: the runs at k measure G(k) themselves); its
pooled profile is that of the runs at the longest k.

A run file holds the same rows (:func:`to_doc`); a run that predates the table holds only the
measured tokens per step of its runs at each k (the median prompt's), which is a measured G(k)
per k without per-position counts (:func:`from_doc` reads either).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moespec.validate.tables import Column, read_csv

from .profile import AcceptanceError, AcceptanceProfile, check_counts

PROFILE_FILE = "05_real_draft_acceptance_profile.csv"
PROFILE_TABLE = (Column("state", "str"), Column("prompt", "str"), Column("k", "int", low=1),
                 Column("position", "int", low=1), Column("steps", "count"), Column("accepted_at_least", "count"))
SOURCE = "moespec real-draft runs (notebook 05)"


def _hist(x, k: int) -> np.ndarray:
    h = np.asarray(x.split() if isinstance(x, str) else x, dtype=np.int64)
    return np.concatenate([h, np.zeros(k + 1 - h.size, dtype=np.int64)])


def table_rows(steps: pd.DataFrame) -> pd.DataFrame:
    """The long table (:data:`PROFILE_TABLE`) of run rows (k >= 1) with ``state``, ``prompt``,
    ``k``, ``steps`` and ``accepted_hist`` (steps that accepted exactly j drafts, j = 0..k, as
    written by :func:`moespec.engine.speculative.summarize_steps`), summed over the rows given
    (repetitions of one draft: widening a draft changes no token)."""
    out = []
    for (state, prompt, k), g in steps[steps["k"] >= 1].groupby(["state", "prompt", "k"], sort=True):
        h = np.sum([_hist(x, int(k)) for x in g["accepted_hist"]], axis=0)
        at_least = np.cumsum(h[::-1])[::-1][1:]
        out += [{"state": state, "prompt": str(prompt), "k": int(k), "position": i + 1, "steps": int(h.sum()),
                 "accepted_at_least": int(at_least[i])} for i in range(int(k))]
    return pd.DataFrame(out, columns=[c.name for c in PROFILE_TABLE])


def read_table(path: str | Path, error=AcceptanceError) -> pd.DataFrame:
    return read_csv(path, PROFILE_TABLE, "the real-draft runs' acceptance profile", error, dtype={"prompt": str})


def rows_of_table(table: pd.DataFrame, state: str, where: str) -> list[dict]:
    """One row per (prompt, k) of ``state``: steps and the counts of positions 1..k, refused where
    a position is missing or the step count differs between a run's positions."""
    rows = []
    for (prompt, k), g in table[table["state"] == state].groupby(["prompt", "k"], sort=True):
        pos = sorted(g["position"])
        if pos != list(range(1, int(k) + 1)):
            raise AcceptanceError(f"{where}: state {state}, prompt {prompt}, k = {k}: expected positions 1..{k}; found "
                                  f"{pos}", where=where, field="position", found=pos)
        if g["steps"].nunique() != 1:
            raise AcceptanceError(f"{where}: state {state}, prompt {prompt}, k = {k}: column 'steps': expected one "
                                  f"value for every position; found {sorted(set(g['steps']))}", where=where,
                                  field="steps")
        g = g.sort_values("position")
        rows.append({"k": int(k), "prompt": str(prompt), "steps": int(g["steps"].iloc[0]),
                     "at_least": [int(x) for x in g["accepted_at_least"]]})
    return rows


def from_rows(rows: list[dict], where: str, state: str | None = None) -> AcceptanceProfile:
    """The profile of a run's rows (:func:`rows_of_table`): the runs at each k, per prompt; the
    pooled profile that of the longest k."""
    if not rows:
        raise AcceptanceError(f"{where}: expected acceptance rows of the real-draft runs; found none", where=where)
    at_k = {}
    for k in sorted({r["k"] for r in rows}):
        prompts = {r["prompt"]: check_counts(r["steps"], r["at_least"], where, f"prompt {r['prompt']}, k = {k}:")
                   for r in rows if r["k"] == k}
        total = prompts[next(iter(prompts))]
        for c in list(prompts.values())[1:]:
            total = total + c
        at_k[k] = AcceptanceProfile(total, "moespec", SOURCE, [where], prompts)
    longest = at_k[max(at_k)]
    label = f"{SOURCE}{f', {state} machine' if state else ''}: per prompt and draft length k = 1..{max(at_k)}"
    return AcceptanceProfile(longest.counts, "moespec", label, [where], dict(longest.prompts), at_k)


def from_doc(doc: dict, where: str, state: str | None = None) -> AcceptanceProfile:
    """The profile a run file holds for one state: its rows, or only measured tokens per step."""
    if doc.get("runs"):
        return from_rows(doc["runs"], where, state)
    tokens = {int(r["k"]): float(r["tokens_per_step"]) for r in doc.get("tokens_per_step") or []}
    if not tokens:
        raise AcceptanceError(f"{where}: acceptance profile: expected runs or tokens_per_step; found neither",
                              where=where, field="profile")
    prof = AcceptanceProfile(None, "moespec", doc.get("source", SOURCE), [where], tokens_at_k=tokens)
    prof.notes.append("no per-position counts in this run: its profile is the measured tokens per step of its runs "
                      "at each draft length k (the median prompt's), G(k) measured at k")
    return prof


def to_doc(rows: list[dict] | None = None, tokens: dict | None = None, source: str = SOURCE) -> dict:
    """A run file's acceptance profile of one state: counts (``rows``) or measured tokens per step."""
    return {"source": source, "runs": rows or [],
            "tokens_per_step": [{"k": int(k), "tokens_per_step": float(v)} for k, v in sorted((tokens or {}).items())]}
