"""The pre-registered scoring rules of paper 1's Table 8 (Section 4.4, Appendix E): reading the
rules file unchanged, its provenance (the commit that added it), and deciding every rule for every
(version, depth) of :func:`moespec.predict.scoring.evaluate`'s metrics."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pandas as pd

from moespec import paths

def rules_path() -> Path:
    return paths.data_dir() / "preregistration" / "scoring_rules.json"


def load_rules(path: str | Path | None = None) -> dict:
    """Read the scoring rules file unchanged; raise naming the file if it is malformed."""
    path = Path(path) if path else rules_path()
    try:
        rules = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"scoring rules {path} not found; they must be written (and committed) "
                                "before the speculative runs") from None
    for key in ("rules", "versions_scored", "n_range", "acceptance_values"):
        if key not in rules:
            raise ValueError(f"{path}: missing field {key!r}")
    return rules


def rules_provenance(path: str | Path | None = None) -> dict:
    """The rules file's sha256, the commit that first added it and its time, and whether the file
    on disk is byte for byte the committed one (``unchanged``). ``commit`` is None outside git."""
    path = Path(path) if path else rules_path()
    data = path.read_bytes()
    out = {"path": str(path), "sha256": hashlib.sha256(data).hexdigest(), "commit": None,
           "committed_at": None, "unchanged": None}
    root = paths.ROOT

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20)

    try:
        rel = str(path.resolve().relative_to(root))
        log = git("log", "--diff-filter=A", "--format=%H %cI", "--", rel)
    except (ValueError, OSError, subprocess.SubprocessError):
        return out
    if log.returncode or not log.stdout.strip():
        return out
    commit, when = log.stdout.strip().splitlines()[-1].split()
    show = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=root, capture_output=True, timeout=20)
    out.update(commit=commit, committed_at=when,
               unchanged=show.returncode == 0 and show.stdout == data)
    return out


def _rule_value(rule: dict, m: dict) -> tuple[str, bool]:
    kind = rule["kind"]
    if kind == "crossover_within_one":
        fmt = lambda c: "-" if c is None else str(c)  # noqa: E731
        return (f"{fmt(m['crossover_pred'])}/{fmt(m['crossover_meas'])}",
                m["crossover_distance"] <= rule.get("tolerance", 1))
    if kind == "kstar_within_one_count":
        return str(m["kstar_within1"]), m["kstar_within1"] >= rule["min_count"]
    if kind == "max_loss":
        return f"{100 * m['loss_runs']:.1f}%", m["loss_runs"] <= rule["max"]
    if kind == "sign_where_interval_excludes_zero":
        return f"{m['sign_correct']} of {m['sign_total']}", m["sign_correct"] == m["sign_total"]
    if kind == "max_verify_rel_error":
        return f"{100 * m['tau_err']:.1f}%", m["tau_err"] <= rule["max"]
    if kind == "best_speedup_inside_bound21":
        return f"delta={m['delta']:.3f}", bool(m["speedup_inside_bound21"])
    raise ValueError(f"unknown rule kind {kind!r} in the scoring rules")


def score(metrics: dict, rules: dict) -> pd.DataFrame:
    """Decide every rule for every (version, depth) in ``metrics`` ({(version, d): evaluate(...)}).

    Returns one row per (version, rule) with a value and a verdict per depth and ``holds_all``;
    the rules are applied exactly as read (:func:`load_rules`)."""
    rows = []
    depths = sorted({d for _, d in metrics})
    for version in rules["versions_scored"]:
        if not any(v == version for v, _ in metrics):
            continue
        for rule in rules["rules"]:
            row = {"version": version, "rule": rule["text"]}
            ok_all = True
            for d in depths:
                if (version, d) not in metrics:
                    continue
                value, ok = _rule_value(rule, metrics[(version, d)])
                row[f"d{d}"] = f"{value}, {'holds' if ok else 'fails'}"
                ok_all &= bool(ok)
            row["holds_all"] = ok_all
            rows.append(row)
    return pd.DataFrame(rows)
