"""Whole-model verify time tau_p(n) with deduplication off and on, and the measured saving
S(n) = tau_slot(n) − tau_dedup(n) (paper 1, Section 4, Figure 4).

Protocol: each prompt is prefilled once (untimed); its greedy continuation g_1..g_{n_max+1} is
decoded batch-one; a verify pass of n tokens feeds g_1..g_n on top of the prompt's cache, as a
speculative step with n − 1 accepted drafts would, and the cache is cropped back after every pass.
Repetitions interleave every (n, setting) in a fresh random order, so drift falls on all alike.
"""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
from moespec.progress import tqdm

from moespec.measure.regimes import classify, dominant, regime_summary, split_point
from moespec.measure.timing import MachineMonitor


def prepare_prompt(engine, prompt, n_max: int = 9) -> list[int]:
    """Prefill ``prompt`` and return its greedy continuation (n_max + 1 tokens, g_1 first); the
    cache is left holding the prompt."""
    d = len(prompt)
    first = engine.prefill(prompt)
    cont = [first] + engine.greedy(first, n_max)
    engine.crop(d)
    return cont


def measure_verify_times(engine, prompts: list, n_max: int = 9, reps: int = 5, warmup: int = 1,
                         seed: int = 0, depth: int | None = None, clock=time.perf_counter,
                         progress: bool = True, reference=None) -> tuple[pd.DataFrame, dict]:
    """Time the verify pass at n = 1..n_max with deduplication off and on on every prompt.

    ``reference``: a :class:`moespec.measure.regimes.ReferenceRead` timed once in every repetition,
    at a random place among its passes; each row then carries that read's bandwidth
    (``ref_GBps``), from which :func:`moespec.measure.regimes.classify` gives its regime.

    Returns (rows, info): rows has prompt, d, n, dedup, rep, t_s, ref_GBps (NaN without a
    reference) and other_load (the share of the CPUs other processes used while the prompt's
    passes ran); info holds per prompt the
    greedy continuation, the routing of the verified text (``[n_max, L, m]``) and the agreement
    of the verify argmax between the two settings and with the batch-one greedy tokens.
    """
    rng = np.random.default_rng(seed)
    rows, info = [], {"continuation": [], "routing": [], "argmax_rows": 0, "argmax_agree_settings": 0,
                      "argmax_agree_greedy": 0}
    grid = [(n, dd) for n in range(1, n_max + 1) for dd in (False, True)]
    if reference is not None:
        grid.append((0, None))  # the reference read's place in the repetition
    bar = tqdm(total=len(prompts) * (reps + warmup) * len(grid), desc=f"verify d={depth}", disable=not progress)
    for pi, prompt in enumerate(prompts):
        d = len(prompt)
        engine.dedup = False
        cont = prepare_prompt(engine, prompt, n_max)
        info["continuation"].append(cont)
        info["routing"].append(engine.record_routing(cont[:n_max]))
        # agreement of the batched verify pass between the settings and with batch-one greedy
        arg = {}
        for dd in (False, True):
            engine.dedup = dd
            arg[dd] = engine.forward(cont[:n_max])
            engine.crop(d)
        info["argmax_rows"] += n_max
        info["argmax_agree_settings"] += int(sum(a == b for a, b in zip(arg[False], arg[True])))
        info["argmax_agree_greedy"] += int(sum(a == b for a, b in zip(arg[True], cont[1:n_max + 1])))
        first_row = len(rows)
        with MachineMonitor() as monitor:
            for rep in range(-warmup, reps):
                rep_rows, bw = [], float("nan")
                for gi in rng.permutation(len(grid)):
                    n, dd = grid[gi]
                    bar.update()
                    if dd is None:
                        bw = reference()
                        continue
                    engine.dedup = dd
                    t0 = clock()
                    engine.forward(cont[:n])
                    t1 = clock()
                    engine.crop(d)
                    rep_rows.append({"prompt": pi, "d": depth if depth is not None else d, "n": n,
                                     "dedup": dd, "rep": rep, "t_s": t1 - t0})
                if rep >= 0:
                    rows += [{**r, "ref_GBps": bw} for r in rep_rows]
        for row in rows[first_row:]:  # other processes' share of the CPUs while this prompt ran
            row["other_load"] = round(monitor.state.other_load, 3)
    bar.close()
    engine.dedup = False
    return pd.DataFrame(rows), info


def bootstrap_medians(groups: list[np.ndarray], n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """Column medians of ``n_boot`` resamples: each group (one prompt's repetitions, ``[reps, c]``)
    is resampled by rows within itself, so the c columns (e.g. the two settings timed in the same
    interleaved repetition) stay paired. Returns ``[n_boot, c]``."""
    rng = np.random.default_rng(seed)
    groups = [np.asarray(g, float).reshape(len(g), -1) for g in groups]
    out = np.empty((n_boot, groups[0].shape[1]))
    for b in range(n_boot):
        pooled = np.concatenate([g[rng.integers(len(g), size=len(g))] for g in groups])
        out[b] = np.median(pooled, axis=0)
    return out


def with_regimes(rows: pd.DataFrame, threshold: float | None = None) -> pd.DataFrame:
    """``rows`` with a ``regime`` column from their same-round reference reads (``ref_GBps``;
    :func:`moespec.measure.regimes.classify`; one regime when there is no reading)."""

    bw = rows["ref_GBps"] if "ref_GBps" in rows else pd.Series(np.nan, index=rows.index)
    if bw.isna().all():
        return rows.assign(regime="one")
    return rows.assign(regime=classify(bw.to_numpy(float), threshold))


def summarize_verify(rows: pd.DataFrame, n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                     regime: str | None = None) -> pd.DataFrame:
    """Per depth and n: median verify time with deduplication off and on, and the saving
    S(n) = tau_slot − tau_dedup, each with a bootstrap interval (repetitions resampled within
    prompts, the two settings of one repetition kept paired). ``regime``: only the rows of that
    bandwidth regime (a ``regime`` column, :func:`with_regimes`)."""
    need = {"prompt", "d", "n", "dedup", "rep", "t_s"}
    if missing := need - set(rows.columns):
        raise ValueError(f"verify rows lack column(s) {sorted(missing)}")
    if regime is not None:
        if "regime" not in rows:
            raise ValueError("verify rows have no regime column (moespec.engine.verify.with_regimes)")
        rows = rows[rows["regime"] == regime]
        if rows.empty:
            raise ValueError(f"no verify rows in regime {regime!r}")
    q = ((1 - level) / 2, 1 - (1 - level) / 2)
    out = []
    for (d, n), g in rows.groupby(["d", "n"]):
        kernel = np.where(g["dedup"].astype(bool), "dedup", "slot")
        wide = g.assign(kernel=kernel).pivot_table(index=["prompt", "rep"], columns="kernel", values="t_s",
                                                   aggfunc="first")
        if set(wide.columns) != {"slot", "dedup"} or wide.isna().any().any():
            raise ValueError(f"verify rows at d={d}, n={n} lack a paired time with dedup off and on")
        wide = wide[["slot", "dedup"]]
        groups = [x.to_numpy() for _, x in wide.groupby(level="prompt")]
        boot = bootstrap_medians(groups, n_boot, seed + int(n))
        res = {"d": int(d), "n": int(n), "prompts": len(groups), "reps": int(len(wide))}
        for j, name in enumerate(("slot", "dedup")):
            res[f"tau_{name}_s"] = float(np.median(wide[name]))
            res[f"tau_{name}_lo_s"], res[f"tau_{name}_hi_s"] = np.quantile(boot[:, j], q)
        res["S_s"] = res["tau_slot_s"] - res["tau_dedup_s"]
        res["S_lo_s"], res["S_hi_s"] = np.quantile(boot[:, 0] - boot[:, 1], q)
        out.append(res)
    return pd.DataFrame(out)


def regime_summaries(rows: pd.DataFrame, n_boot: int = 2000, seed: int = 0,
                     min_share: float = 0.25) -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    """The verify-time summaries under the bandwidth-regime protocol of the pre-registration
    (``data/preregistration/scoring_rules_byte_faithful.json``): ``(for_rules, all_rows, info)``.

    ``rows`` carry ``ref_GBps`` (:func:`measure_verify_times` with a reference). The regime holding
    most repetitions (:func:`moespec.measure.regimes.dominant`) gives ``for_rules``; a depth with
    less than ``min_share`` of its repetitions in that regime keeps all its rows there (``info``
    says which). ``all_rows`` summarizes every row; ``info`` holds the threshold, the dominant
    regime, per-regime counts and bandwidths, and per depth the regime used."""

    bw = rows["ref_GBps"].to_numpy(float) if "ref_GBps" in rows else np.full(len(rows), np.nan)
    threshold = None if np.isnan(bw).all() else split_point(bw[~np.isnan(bw)])
    tagged = with_regimes(rows, threshold)
    main = dominant(tagged["regime"])
    parts, used = [], {}
    for d, g in tagged.groupby("d"):
        share = float((g["regime"] == main).mean())
        if share >= min_share:
            parts.append(g[g["regime"] == main])
            used[int(d)] = {"regime": main, "share": share}
        else:
            parts.append(g)
            used[int(d)] = {"regime": "all rows (the dominant regime holds too few here)", "share": share}
    for_rules = summarize_verify(pd.concat(parts, ignore_index=True), n_boot=n_boot, seed=seed)
    info = {"threshold_GBps": threshold, "dominant": main, "depths": used,
            "regimes": regime_summary(tagged["ref_GBps"], tagged["regime"]) if not np.isnan(bw).all() else []}
    return for_rules, summarize_verify(tagged, n_boot=n_boot, seed=seed), info
