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
from tqdm.auto import tqdm

from moespec.bench.timing import MachineMonitor


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
                         progress: bool = True) -> tuple[pd.DataFrame, dict]:
    """Time the verify pass at n = 1..n_max with deduplication off and on on every prompt.

    Returns (rows, info): rows has prompt, d, n, dedup, rep, t_s and other_load (the share of the
    CPUs other processes used while the prompt's passes ran); info holds per prompt the
    greedy continuation, the routing of the verified text (``[n_max, L, m]``) and the agreement
    of the verify argmax between the two settings and with the batch-one greedy tokens.
    """
    rng = np.random.default_rng(seed)
    rows, info = [], {"continuation": [], "routing": [], "argmax_rows": 0, "argmax_agree_settings": 0,
                      "argmax_agree_greedy": 0}
    grid = [(n, dd) for n in range(1, n_max + 1) for dd in (False, True)]
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
                for gi in rng.permutation(len(grid)):
                    n, dd = grid[gi]
                    engine.dedup = dd
                    t0 = clock()
                    engine.forward(cont[:n])
                    t1 = clock()
                    engine.crop(d)
                    if rep >= 0:
                        rows.append({"prompt": pi, "d": depth if depth is not None else d, "n": n,
                                     "dedup": dd, "rep": rep, "t_s": t1 - t0})
                    bar.update()
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


def summarize_verify(rows: pd.DataFrame, n_boot: int = 2000, seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Per depth and n: median verify time with deduplication off and on, and the saving
    S(n) = tau_slot − tau_dedup, each with a bootstrap interval (repetitions resampled within
    prompts, the two settings of one repetition kept paired)."""
    need = {"prompt", "d", "n", "dedup", "rep", "t_s"}
    if missing := need - set(rows.columns):
        raise ValueError(f"verify rows lack column(s) {sorted(missing)}")
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
