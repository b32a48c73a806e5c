# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 — The prediction chain against the whole-model runs (Tables 3, 4, 7, 8; Figures 4, 5, 6)
#
# Paper 1, Section 4 and 4.4. The expert operation of each of the engine's own layers (its real
# weights) is timed alone by `moespec.bench` on passes with chosen ids and on windows of recorded
# WikiText routing; `moespec.fit` fits (4) and (E.1) and gives the bandwidth error eps. Then
# eq. (22) turns per-layer operation times into whole-model verify times:
#
# * **prediction** (wiki): the fits evaluated at the union bytes of the WikiText windows;
# * **text**: the fits at the union bytes of the text the whole-model runs verified;
# * **measured-time**: the measured median operation time on each WikiText window;
# * **calibrated**: measured-time plus the measured growth with n outside the expert operation.
#
# They are compared with notebook 05's measurements (run notebook 05 with the same profile first), which none of them used (the calibrated
# version uses the dedup-off verify time by construction). The scoring rules of Table 8 are read
# unchanged from `data/preregistration/scoring_rules.json`, committed before the speculative runs.
# The paper's published rows are shown beside ours as labelled reference data (their hardware).

# %% tags=["parameters"]
profile = "quick"       # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce passes it)
device = "cpu"
seed = 0
threads = 1
backend = "auto"
out_dir = ""           # "" : inside the run folder (paths.run_data_dir())

# %%
import json
from pathlib import Path

import numpy as np
import pandas as pd
from moespec import corpus, fit, io, paths, predict, zoo
from moespec.bench.expert_op import load_rows
from moespec.engine import Engine
from moespec.engine.operation import bench_engine, record_trace
from moespec.engine.profiles import setup, target_model
from moespec.engine.runs import step_overhead, throughput_grid
from moespec.plots.predictions import figure4_saving, figure5_kstar, figure6_verify
from moespec.routing import RoutingTrace, mean_union
from moespec.tables import predictions as T

out = setup(profile, device, threads, out_dir)
model, model_label = target_model(profile)
fig_dir = paths.ensure(paths.figures_dir())
run = json.loads((out / "run.json").read_text())
rules = predict.load_rules()
rules_prov = predict.rules_provenance()
print(f"whole-model runs of notebook 05: {out} ({run['model']}, started {run['started']['verify']})")
print(f"scoring rules read unchanged from commit {rules_prov['commit']} "
      f"(sha256 {rules_prov['sha256'][:16]}..., file identical to the commit: {rules_prov['unchanged']})")

if profile == "quick":
    rng = np.random.default_rng(seed + 1)
    wiki_docs, context = [rng.integers(1, 256, size=60) for _ in range(3)], 32
    bench = dict(reps=2, warmup=1, u_count=3, windows_per_n=2, flush_bytes=2**20, membw_bytes=2**22)
    engine_label, name = "moespec CPU (quick)", "engine-tiny"
else:
    tok = zoo.load_tokenizer()
    arts = corpus.articles("test")
    fit_idx = corpus.fit_documents(arts)
    wiki_docs = corpus.tokenize([arts[i] for i in fit_idx], tok)
    context = model.config.max_position_embeddings
    bench = dict(reps=5, warmup=1, u_count=6, windows_per_n=6)
    engine_label, name = "moespec CPU", "engine-default"
engine = Engine(model, backend=backend)
m = model.config.num_experts_per_tok

# %% [markdown]
# ## The expert operation alone: timing, fits (4)/(E.1) and eps

# %%
wiki = record_trace(engine, wiki_docs, context, source="WikiText test fit documents, recorded by the engine")
wiki.save(out / "routing_wikitext.npz")
bench_dir = bench_engine(engine, name, wiki, out_dir=out / "bench", backend=backend, **bench)
rows = load_rows(bench_dir)
b = float(rows.loc[rows["kind"] == "window", "expert_bytes"].iloc[0])
fits = fit.fit_layers(rows)
errors = fit.window_errors(fits, rows)
eps_table = fit.epsilon(errors)
eps = float(eps_table["eps_engine"].iloc[0])
io.write_dataframe(fig_dir / "06_fits.csv", fits)
io.write_dataframe(fig_dir / "06_epsilon.csv", eps_table)
print(f"bench run {bench_dir.name}: {int((rows['kind'] == 'chosen').sum())} chosen-id and "
      f"{int((rows['kind'] == 'window').sum())} window timings over {rows['layer'].nunique()} layers")
print(f"eps: per-slot {eps_table['eps_slot'].iloc[0]:.3f}, deduplicating {eps_table['eps_dedup'].iloc[0]:.3f}; "
      f"engine eps = {eps:.3f}")

# %% [markdown]
# ## The chain (22) per depth, and its scores

# %%
summary = pd.read_csv(out / "verify_summary.csv")
oracle = pd.read_csv(out / "oracle_runs.csv")
windows = rows[rows["kind"] == "window"].rename(columns={"t_median_s": "t_s"})
optimes = predict.layer_times(windows, engine.num_layers)
wiki_times = predict.fitted_layer_times(fits, mean_union(wiki, 9), m, b)
metrics, curve_parts, h_parts = {}, [], []
for d in run["depths"]:
    s = summary[summary["d"] == d].sort_values("n")
    runs_d = oracle[oracle["d"] == d]
    a_vals, ks, T_runs = throughput_grid(runs_d)
    meas = predict.Measured(tau={"slot": s["tau_slot_s"].to_numpy(), "dedup": s["tau_dedup_s"].to_numpy()},
                            S=s["S_s"].to_numpy(), S_lo=s["S_lo_s"].to_numpy(), S_hi=s["S_hi_s"].to_numpy(),
                            h=step_overhead(runs_d), a_values=a_vals, T_runs=T_runs, eps=eps)
    tau1 = float(s["tau_slot_s"].iloc[0])
    text = RoutingTrace.load(out / f"routing_text_d{d}.npz")
    measured_time = predict.chain("measured-time", tau1, optimes)
    chains = {"prediction": predict.chain("prediction", tau1, wiki_times),
              "text": predict.chain("text", tau1, predict.fitted_layer_times(fits, mean_union(text, 9), m, b)),
              "measured-time": measured_time,
              "calibrated": predict.calibrate(measured_time, meas.tau["slot"])}
    for v, c in chains.items():
        metrics[(v, d)] = predict.evaluate(c, meas)
    curve_parts.append(predict.curves(d, chains, meas))
    h_parts.append(pd.DataFrame({"d": d, "k": np.arange(len(meas.h)), "h_s": meas.h}))
curves = pd.concat(curve_parts, ignore_index=True)
io.write_dataframe(fig_dir / "06_step_overhead.csv", pd.concat(h_parts, ignore_index=True))
io.write_dataframe(fig_dir / "06_curves.csv", curves)
io.write_json(out / "metrics.json", {f"{v}|{d}": mm for (v, d), mm in metrics.items()})
for (v, d), mm in metrics.items():
    print(f"d={d} {v:>13}: saving error {mm['saving_err_ms']:.3f} ms, in band {mm['in_band']}/{mm['band_points']}, "
          f"crossover {mm['crossover_pred']}/{mm['crossover_meas']}, k* within one {mm['kstar_within1']}/11, "
          f"loss {100 * mm['loss_runs']:.1f}%, tau error {100 * mm['tau_err']:.1f}%, delta {mm['delta']:.3f}, "
          f"(20) {mm['loss_inside_bound20']}, (21) {mm['speedup_inside_bound21']}")

# %% [markdown]
# ## Tables 3, 4, 7 and 8 (ours first, then the paper's published rows, labelled)

# %%
t3 = T.table3(metrics, engine_label, model_label)
t4 = T.table4(metrics, engine_label)
t7 = T.table7(metrics, engine_label, model_label)
scores = predict.score(metrics, rules)
t8 = T.table8(scores, rules_prov["commit"])
for name_, table in (("06_table3_predictions", t3), ("06_table4_preregistered", t4), ("06_table7_error", t7),
                     ("06_table8_rules", t8)):
    io.write_dataframe(fig_dir / f"{name_}.csv", table)
print(scores.to_string(index=False))
for v in rules["versions_scored"]:
    ok = bool(scores.loc[scores["version"] == v, "holds_all"].all())
    print(f"{v}: meets all six pre-registered rules at every depth: {ok}")
print(f"rules file {rules_prov['path']} read unchanged; commit {rules_prov['commit']}, "
      f"committed {rules_prov['committed_at']}; speculative runs started {run['started']['oracle']}")

# %% [markdown]
# ## Figures 4, 5 and 6

# %%
title = f"{engine_label}, {model_label}; eps = {eps:.3f}"
io.save_figure(figure4_saving(curves, metrics, title=f"Figure 4 analogue: saving S(n). {title}"),
               fig_dir / "06_fig4_saving.png")
io.save_figure(figure5_kstar(metrics, title=f"Figure 5 analogue: best draft length and bounds (20), (21). {title}"),
               fig_dir / "06_fig5_kstar_bounds.png")
io.save_figure(figure6_verify(curves, title=f"Figure 6 analogue: pre-registered versions. {title}", scores=scores,
                              rules_commit=rules_prov["commit"]),
               fig_dir / "06_fig6_preregistered.png")
inside20 = sum(mm["loss_inside_bound20"] for mm in metrics.values())
inside21 = sum(mm["speedup_inside_bound21"] for mm in metrics.values())
print(f"throughput lost inside bound (20): {inside20} of {len(metrics)} (version, depth) pairs; "
      f"best speedup inside (21): {inside21} of {len(metrics)}")


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

best = {v: bool(scores.loc[scores["version"] == v, "holds_all"].all()) for v in rules["versions_scored"]}
display(Markdown(
    f"**{profile} profile, {model_label}.** The prediction chain (22) against the whole-model runs, engine ε = {eps:.3f}: "
    + "; ".join(f"d = {d}: crossover predicted {metrics[('prediction', d)]['crossover_pred']}, measured "
                f"{metrics[('prediction', d)]['crossover_meas']}" for d in run["depths"])
    + ". Versions meeting all six pre-registered rules: "
    + (", ".join(v for v, ok in best.items() if ok) or "none") + f". Bound (20) held for {inside20} and (21) for "
      f"{inside21} of {len(metrics)} (version, depth) pairs. Notebook 08 turns this chain into settings."))
