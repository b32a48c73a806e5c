"""The real-draft experiment at several draft costs (paper 1, Appendix D.3; paper 2's EAGLE-3 regime).

Paper 1's real draft (Qwen3-0.6B for Qwen3-30B-A3B) costs a sizeable share of a target pass;
paper 2's EAGLE-3 draft about 0.08 of one. Here the draft's cost per token is a parameter of the
subject: the same trained draft with its dense MLPs widened function-preservingly
(:func:`moespec.engine.subject.widen_draft`, knob ``draft_cost`` = its MLP bytes per token as a
share of the target's expert bytes per token). Widening changes no token, so every draft of the
sweep proposes the same tokens and the acceptance is the same at every cost: only time moves.

* :func:`draft_cost_ratios`: the measured cost ratio c = one draft token / one target decode
  step, both timed in the same interleaved rounds, per draft;
* :func:`draft_cost_sweep`: speculative runs of every draft at every k on every prompt, and
  plain decoding (k = 0), in a seeded random order per prompt and repetition, each run after a
  same-round reference read; speedup over the same prompt's plain runs of the same regime;
* :func:`predict_speedups`: the theory's prediction (paper 1, eq. (9)):
  speedup(k) = G_a(k) V(0) / V(k) with a the acceptance measured at k (geometric estimate,
  pooled over drafts and prompts) and V(k) = t_draft(k) + tau(k + 1) + h, each part measured
  separately (t_draft(k) = a_d k + b_d fitted per draft, paper 2's (A4); tau the mean verify time
  at k + 1 tokens; h the mean time of a plain step outside its verify pass). Means, not medians:
  a run's throughput is its tokens over its total time, so the expected step time is the mean;
* :func:`stop_paying`: the first cost on the grid from which drafting no longer pays (the best
  median speedup over k >= 1 at most 1), measured and predicted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from moespec import paths
from moespec.engine.speculative import ModelDraft, speculative_generate, summarize_steps
from moespec.measure.regimes import classify
from moespec.measure.timing import time_interleaved
from moespec.tables.oracle import paper_number
from moespec.theory import expected_tokens


def draft_cost_ratios(engine, drafts: dict, prompt, reps: int = 30, warmup: int = 2, reference=None) -> pd.DataFrame:
    """Per draft (``drafts``: knob -> draft model): the median time of one drafted token
    (``ModelDraft.propose`` with k = 1 at the prompt's end), of one target decode step at the same
    position, and their ratio per round (median, quartiles), all interleaved in one run with an
    optional reference read (``ref_GBps``)."""
    prompt = [int(t) for t in prompt]
    d = len(prompt)
    first = engine.prefill(prompt)

    def step():
        engine.forward([first])
        engine.crop(d)

    calls = {"target_step": step}
    for r, model in drafts.items():
        drafter = ModelDraft(model)
        drafter.begin(prompt, first)
        calls[r] = (lambda drafter=drafter: drafter.propose([], first, 1))
    if reference is not None:
        calls["read"] = reference.fn
    t = time_interleaved(calls, reps=reps, warmup=warmup)
    base = np.asarray(t["target_step"].samples_ns, float)
    bw = (reference.nbytes / np.asarray(t["read"].samples_ns, float)) if reference is not None else None
    rows = []
    for r in drafts:
        ratio = np.asarray(t[r].samples_ns, float) / base
        rows.append({"draft_cost": float(r), "t_draft_token_s": t[r].median_s, "t_target_step_s": t["target_step"].median_s,
                     "cost_ratio": float(np.median(ratio)), "cost_ratio_q25": float(np.quantile(ratio, 0.25)),
                     "cost_ratio_q75": float(np.quantile(ratio, 0.75)), "reps": reps,
                     "ref_GBps": float(np.median(bw)) if bw is not None else float("nan")})
    return pd.DataFrame(rows)


def draft_cost_sweep(engine, drafts: dict, prompts: list, ks, n_tokens: int, reps: int = 1, seed: int = 0,
                     dedup: bool = True, reference=None, progress: bool = True) -> pd.DataFrame:
    """Speculative runs of every draft (knob -> model) at every k in ``ks`` (k >= 1) and plain
    decoding (k = 0, knob NaN) on every prompt (module docstring). One row per run: prompt,
    draft_cost, k, rep, ref_GBps, the fields of :func:`summarize_steps`, and ``speedup``: its
    throughput over the median throughput of the same prompt's plain runs in the same bandwidth
    regime (:func:`moespec.measure.regimes.classify` over the run's readings; all of the prompt's
    plain runs when that regime has none)."""

    ks = sorted({int(k) for k in ks if int(k) >= 1})
    if not ks:
        raise ValueError("ks must hold at least one draft length >= 1")
    drafters = {r: ModelDraft(m) for r, m in drafts.items()}
    grid = [(None, 0)] + [(r, k) for r in drafters for k in ks]
    rng = np.random.default_rng(seed)
    rows = []
    bar = tqdm(total=len(prompts) * reps * len(grid), desc="draft-cost sweep", disable=not progress)
    engine.dedup = dedup
    for pi, prompt in enumerate(prompts):
        prompt = [int(t) for t in prompt]
        first = engine.prefill(prompt)
        for rep in range(reps):
            for gi in rng.permutation(len(grid)):
                r, k = grid[gi]
                bw = reference() if reference is not None else float("nan")
                drafter = drafters[r] if r is not None else drafters[next(iter(drafters))]
                _, steps = speculative_generate(engine, drafter, prompt, k, n_tokens, first=first)
                rows.append({"prompt": pi, "prompt_tokens": len(prompt),
                             "draft_cost": float("nan") if r is None else float(r), "k": k, "rep": rep,
                             "ref_GBps": bw, **summarize_steps(steps)})
                bar.update()
    bar.close()
    engine.dedup = False
    df = pd.DataFrame(rows)
    df["regime"] = "one" if df["ref_GBps"].isna().all() else classify(df["ref_GBps"].to_numpy(float))
    plain = df[df.k == 0]
    by_regime = plain.groupby(["prompt", "regime"])["throughput"].median()
    by_prompt = plain.groupby("prompt")["throughput"].median()
    base = [by_regime.get((p, g), by_prompt[p]) for p, g in zip(df.prompt, df.regime)]
    df["speedup"] = df["throughput"] / np.asarray(base, float)
    return df


def acceptance_by_k(runs: pd.DataFrame) -> pd.Series:
    """The measured acceptance per k >= 1: accepted / (accepted + rejections), pooled over drafts,
    prompts and repetitions (the geometric estimate of :func:`summarize_steps`)."""
    spec = runs[runs.k >= 1]
    g = spec.groupby("k")[["accepted", "rejections"]].sum()
    return g["accepted"] / (g["accepted"] + g["rejections"])


def draft_time_fit(runs: pd.DataFrame) -> pd.DataFrame:
    """Per draft: t_draft(k) = a_d k + b_d (s), least squares over k of the mean draft time per
    step at each k (paper 2, eq. (A4))."""
    rows = []
    for r, g in runs[runs.k >= 1].groupby("draft_cost"):
        med = g.groupby("k")["t_draft_mean_s"].mean()
        k = med.index.to_numpy(float)
        if len(k) >= 2:
            a, b = np.polyfit(k, med.to_numpy(float), 1)
        else:
            a, b = float(med.iloc[0] / k[0]), 0.0
        rows.append({"draft_cost": float(r), "a_s_per_token": float(a), "b_s": float(b)})
    return pd.DataFrame(rows)


def predict_speedups(runs: pd.DataFrame) -> pd.DataFrame:
    """The theory's speedup at every (draft, k) of the sweep beside the measured one (module
    docstring). Columns: draft_cost, k, a (measured acceptance at k), G (= G_a(k)), V_hat_s,
    V0_s, predicted, measured (median over prompts of the runs' speedups), measured_q25/q75,
    rel_error (predicted / measured - 1), tokens_per_step (measured median)."""

    a_k = acceptance_by_k(runs)
    tau = runs.groupby("k")["t_verify_mean_s"].mean()              # verify of k + 1 tokens, any draft
    plain = runs[runs.k == 0]
    h0 = float((plain["t_step_mean_s"] - plain["t_verify_mean_s"]).mean())
    V0 = float(tau[0]) + h0
    fits = draft_time_fit(runs).set_index("draft_cost")
    out = []
    for (r, k), g in runs[runs.k >= 1].groupby(["draft_cost", "k"]):
        a = float(min(a_k[k], 1 - 1e-9))
        G = float(expected_tokens(a, int(k)))
        V = fits.loc[r, "a_s_per_token"] * k + fits.loc[r, "b_s"] + float(tau[k]) + h0
        sp = g.groupby("prompt")["speedup"].median()
        pred = G * V0 / V
        meas = float(sp.median())
        out.append({"draft_cost": float(r), "k": int(k), "a": a, "G": G, "V_hat_s": float(V), "V0_s": V0,
                    "predicted": float(pred), "measured": meas, "measured_q25": float(sp.quantile(0.25)),
                    "measured_q75": float(sp.quantile(0.75)), "rel_error": float(pred / meas - 1),
                    "tokens_per_step": float(g["tokens_per_step"].median())})
    return pd.DataFrame(out)


def stop_paying(pred: pd.DataFrame, ratios: pd.DataFrame | None = None) -> dict:
    """The first draft cost of the grid (ascending) from which drafting no longer pays: the best
    speedup over k >= 1 at most 1, measured (median over prompts) and predicted; their distance in
    grid steps (None where one of them never stops paying on the grid: then the distance counts
    the end of the grid as the next step). With ``ratios`` the measured cost ratio c of each knob
    is reported too."""
    grid = sorted(pred.draft_cost.unique())
    best = pred.groupby("draft_cost")[["measured", "predicted"]].max().reindex(grid)

    def first(col):
        below = [i for i, r in enumerate(grid) if best.loc[r, col] <= 1.0]
        return below[0] if below else None

    im, ip = first("measured"), first("predicted")
    none = len(grid)
    out = {"grid": [float(r) for r in grid], "best_measured": best["measured"].tolist(),
           "best_predicted": best["predicted"].tolist(),
           "stop_index_measured": im, "stop_index_predicted": ip,
           "stop_cost_measured": None if im is None else float(grid[im]),
           "stop_cost_predicted": None if ip is None else float(grid[ip]),
           "grid_steps_apart": abs((none if im is None else im) - (none if ip is None else ip))}
    if ratios is not None:
        c = ratios.set_index("draft_cost")["cost_ratio"]
        out["cost_ratio"] = [float(c.get(r, np.nan)) for r in grid]
    return out


def paper_references() -> dict:
    """The papers' published numbers drawn beside the sweep, labelled as theirs, never inputs:
    paper 1's median real-draft speedup at k = 1 (Appendix D.3) and paper 2's draft time per token
    over its pooled target intercept (eq. (6) / (A3): a drafted token's share of a target pass)."""

    p1 = pd.read_csv(paths.reference_dir() / "paper1_scalars.csv").set_index("quantity")["value"]
    return {"paper1_k1": float(p1["real_draft_median_speedup_k1"]),
            "paper2_ratio": paper_number("draft_time_ms") / paper_number("pooled_beta0_ms")}
