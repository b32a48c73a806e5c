# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Fits of the operation time, the bandwidth error ε, and the transfer test (paper 1, eq. (4), (E.1), Section 4, Figure 7)
#
# On the passes with chosen ids at n = 2..9, per layer, by least squares:
#
# * per-slot, eq. (4): t_slot = t_op + c_u·U·b + c_re·(n·m − U)·b, re-read cost c_re/c_u;
# * deduplicating, eq. (E.1): t_dedup = t_op + c_g·U·b + c_t·n.
#
# Each fit is scored on the windows of routing, which it did not see: ε_p is the median over layers
# of each fit's median |relative error|, and the engine's ε the larger of the two kernels'
# (Section 4). The transfer test (Figure 7, Appendix E) fits log β_p(n) linear in log n and log b
# (expert bytes) on the other models and predicts the held-out one.
#
# The main model's rows are those of notebook 02 (same configuration; measured here if notebook 02
# has not run). The other models of the transfer test are measured in this notebook, on one layer,
# windows only, at n = 2, 4, 6, 8, with random weights at their published shapes and the same
# format and backend. Each model's run records its own read bandwidth: the machine drifts between
# runs, so the printed read bandwidths say how comparable the absolute numbers are.
#
# **Your own model**: `model` = its checkpoint folder or `config.json`, as in notebook 02 (its shape
# from the config, random weights at it, the windows of the routing notebook 01 saved in this run or
# of `trace_file`). The fits are of that model; notebook 08 and `moespec advise` read them with its
# shape (N, m, L), which `03_bandwidth_all_models.csv` carries.

# %% tags=["parameters"]
profile = "quick"       # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce passes it)
device = "cpu"
seed = 0
model = "olmoe"         # a preset (olmoe, qwen3, gpt-oss, deepseek-v2-lite), or a checkpoint folder or config.json
fmt = "f32"
backend = "auto"
trace_file = ""
out_dir = ""           # "" : inside the run folder (paths.run_data_dir())
transfer_models = ["qwen3", "gpt-oss", "deepseek-v2-lite"]
reuse_transfer_runs = False   # True: reuse complete runs of the transfer models instead of measuring
engine_fit_runs = None   # None: the committed benchmarks/bench_engine_fits.py runs (moespec.tables.bandwidth.ENGINE_FIT_RUNS); [] for none

# %%
from pathlib import Path

import pandas as pd

from IPython.display import display

from moespec import fit, io, paths
from moespec.measure import discard, expert_op
from moespec.plots.bandwidth import figure7_transfer
from moespec.tables.bandwidth import engine_fits, fit_table, fit_variants, load_engine_fit_runs
from moespec.validate.run_identity import stamp_frame

bench_out = Path(out_dir) if out_dir else paths.expert_op_dir()
figures = paths.ensure(paths.figures_dir())
main_config = expert_op.profile_config(profile, model, fmt, backend, device, seed, role="main")
doc_len = 64 if profile == "quick" else 512
num_docs = 4 if profile == "quick" else 16
main_name = main_config.spec().name
print(f"profile={profile}: main model {main_name} ({fmt}, backend {backend}, {device}); "
      f"transfer models {transfer_models}")
print(expert_op.describe_shape(main_config))

# %% [markdown]
# ## The main model's rows (notebook 02's run)

# %%
trace = expert_op.routing_for(model, trace_file, seed=seed, num_docs=num_docs, doc_len=doc_len)
main_dir = expert_op.run(main_config, out_dir=bench_out, trace=trace, reuse_complete=True)
decision = discard.apply_rule(expert_op.load_rows(main_dir), source=str(main_dir / "rows.csv"))
rows = decision.kept   # the discard rule of notebook 02 (moespec.measure.discard)
print(f"run {main_dir.name}: {len(decision.rows)} rows; windows from: {trace.label}")

# %% [markdown]
# ## Fit coefficients per layer: eq. (4) and (E.1)
# Least squares with every coefficient ≥ 0 (the theory's fixed work φ_p ≥ 0, of which t_op is the
# layer's share, and non-negative times per byte and per token); the unconstrained fit follows.

# %%
fits = fit.fit_layers(rows)
errors = fit.window_errors(fits, rows)
table = fit_table(fits, errors)
io.write_dataframe(figures / "03_fit_coefficients.csv", stamp_frame(table))
for r in table.itertuples():
    if r.kernel == "slot":
        print(f"layer {r.layer} slot  (4):  t_op={r.t_op * 1e3:.3f} ms  c_u={r.c_u * 1e9:.4f} s/GB  "
              f"c_re={r.c_re * 1e9:.4f} s/GB  re-read cost={r.reread_cost:.3f}  window error {r.window_median_abs_err:.3f}")
    else:
        print(f"layer {r.layer} dedup (E.1): t_op={r.t_op * 1e3:.3f} ms  c_g={r.c_g * 1e9:.4f} s/GB  "
              f"c_t={r.c_t * 1e3:.3f} ms/token  window error {r.window_median_abs_err:.3f}")

# %% [markdown]
# ## Both fits, with and without the discard rule
# Coefficients and window errors (`03_fit_variants.csv`) and ε (`03_epsilon_variants.csv`) of the
# non-negative and the unconstrained fit, on the kept rows and on every row. Table 1, ε and the
# predictions read the non-negative fit on the kept rows.

# %%
variants, eps_variants = fit_variants(decision)
io.write_dataframe(figures / "03_fit_variants.csv", stamp_frame(variants))
io.write_dataframe(figures / "03_epsilon_variants.csv", stamp_frame(eps_variants))
print(variants[["rows", "fit", "layer", "kernel", "t_op", "c_u", "c_re", "c_g", "c_t", "window_median_abs_err"]]
      .to_string(index=False))
print(eps_variants[["rows", "fit", "eps_slot", "eps_dedup", "eps_engine"]].round(5).to_string(index=False))

# %% [markdown]
# ## The bandwidth error ε (Section 4)

# %%
eps = fit.epsilon(errors)
io.write_dataframe(figures / "03_epsilon.csv", stamp_frame(eps))
io.write_dataframe(figures / "03_window_errors.csv", stamp_frame(
    errors[["model", "layer", "kernel", "n", "U", "pass_id", "t_median_s", "t_pred_s", "rel_err"]]))
for r in eps.itertuples():
    print(f"epsilon ({r.backend}): slot {r.eps_slot:.4f}, dedup {r.eps_dedup:.4f}, engine {r.eps_engine:.4f} "
          f"(over {r.fits_slot} layer fit(s) per kernel)")

# %% [markdown]
# ## Fits (4)/(E.1) and epsilon per engine
#
# The same benchmark (main profile, same routing) run on llama.cpp's CPU expert operation, ggml's
# MUL_MAT_ID, as a deduplicating kernel, and its per-slot counterpart (one call per token), by
# `benchmarks/bench_engine_fits.py` (committed runs; the peer is built outside `make reproduce`).
# Runs made at different times are set side by side with each run's read bandwidth.

# %%
engine_decisions = {f"moespec CPU, this run {main_dir.name}": decision, **load_engine_fit_runs(engine_fit_runs)}
engine_coefs, engine_eps = engine_fits(engine_decisions)
io.write_dataframe(figures / "03_fit_coefficients_engines.csv", stamp_frame(engine_coefs))
io.write_dataframe(figures / "03_epsilon_engines.csv", stamp_frame(engine_eps))
display(engine_coefs[["engine", "fmt", "layer", "kernel", "t_op", "c_u", "c_re", "c_g", "c_t", "reread_cost",
                      "window_median_abs_err", "read_GBps"]])
display(engine_eps[["engine", "eps_slot", "eps_dedup", "eps_engine", "read_GBps"]])

# %% [markdown]
# ## Figure 7: transfer of the bandwidth to a held-out model
# Bandwidths per model from windows at n = 2, 4, 6, 8 (Table 1's sums). Each transfer model runs
# with synthetic routing calibrated to its published reuse where the paper gives it (uniform
# otherwise), labelled in the printed lines.

# %%
bw_parts = [fit.bandwidth_table(rows).assign(read_GBps=expert_op.read_bandwidth(rows)["median_GBps"],
                                             **expert_op.shape_columns(main_config))]
read_bws = {main_name: expert_op.read_bandwidth(rows)}
decisions = [decision]
for name in transfer_models:
    cfg = expert_op.profile_config(profile, name, fmt, backend, device, seed, role="transfer")
    tr = expert_op.routing_for(name, seed=seed, num_docs=num_docs, doc_len=doc_len)
    run_dir = expert_op.run(cfg, out_dir=bench_out, trace=tr, reuse_complete=reuse_transfer_runs)
    decisions.append(discard.apply_rule(expert_op.load_rows(run_dir), source=str(run_dir / "rows.csv")))
    part = decisions[-1].kept
    read_bws[name] = expert_op.read_bandwidth(part)
    bw_parts.append(fit.bandwidth_table(part).assign(read_GBps=read_bws[name]["median_GBps"],
                                                     **expert_op.shape_columns(cfg)))
    print(f"{name}: run {run_dir.name}; windows from: {tr.label}")
bw_all = pd.concat(bw_parts, ignore_index=True)
io.write_dataframe(figures / "03_bandwidth_all_models.csv", stamp_frame(bw_all))
for name, rb in read_bws.items():
    print(f"read bandwidth during {name}'s run: {rb['median_GBps']:.2f} GB/s")
counts = discard.counts_table({"fits (4)/(E.1), epsilon": decision, "Figure 7 transfer": discard.combine(decisions)})
io.write_dataframe(figures / "03_discard_rule.csv", stamp_frame(counts))
print(counts.to_string(index=False))
transfer = fit.transfer(bw_all, ns=(2, 4, 6, 8))
io.write_dataframe(figures / "03_fig7_transfer.csv", stamp_frame(transfer))
engine = rows["backend"].iloc[0]
fig = figure7_transfer(transfer, title=f"moespec {engine} kernels ({fmt}), one machine; held out: each model in turn")
io.save_figure(fig, figures / "03_fig7_transfer.png")
for name, g in transfer.groupby("model", sort=False):
    print(f"transfer, held out {name}: |error| of beta median {g[['beta_slot_rel_err', 'beta_dedup_rel_err']].abs().stack().median():.3f}, "
          f"max {g[['beta_slot_rel_err', 'beta_dedup_rel_err']].abs().to_numpy().max():.3f}; "
          f"of r median {g['r_rel_err'].abs().median():.3f}")

# %% [markdown]
# Figure 7's consequence (Appendix E, "Transfer"): the crossover each held-out model gets from the
# transferred bandwidths against the one from its own measured bandwidths, both with its own byte
# share ubar(n) (eq. (6), f_l = 1, equal fixed work), on the measured grid of n. The paper counts
# agreement within one pass size against whole-model crossovers (1 of 6 CUDA and 2 of 8 Metal
# configurations transferred; 6 of 6 and 7 of 8 from each model's own bandwidths).

# %%
transfer_cross = fit.transfer_crossover(transfer, bw_all)
io.write_dataframe(figures / "03_fig7_crossover.csv", stamp_frame(transfer_cross))
display(transfer_cross[["model", "ns", "crossover_pred", "crossover_meas", "distance", "within_one"]])
print(f"transferred bandwidths place the crossover within one of the own-bandwidth one on "
      f"{int(transfer_cross['within_one'].sum())} of {len(transfer_cross)} held-out models")

# %% [markdown]
# The same test on bandwidths divided by the read bandwidth measured in each model's own run, which
# removes the machine's drift between the runs (the paper's machines did not drift like this one).

# %%
bw_norm = bw_all.copy()
for col in ("beta_slot_GBps", "beta_dedup_GBps"):
    bw_norm[col] = bw_norm[col] / bw_norm["read_GBps"]
transfer_norm = fit.transfer(bw_norm, ns=(2, 4, 6, 8))
io.write_dataframe(figures / "03_fig7_transfer_normalized.csv", stamp_frame(transfer_norm))
for name, g in transfer_norm.groupby("model", sort=False):
    print(f"transfer on bandwidth / read bandwidth, held out {name}: |error| of beta median "
          f"{g[['beta_slot_rel_err', 'beta_dedup_rel_err']].abs().stack().median():.3f}; of r median {g['r_rel_err'].abs().median():.3f}")


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

e = eps.iloc[0]
display(Markdown(
    f"**{profile} profile, {main_name}.** Fits (4) and (E.1) per layer; on routing windows they did not see they "
    f"err by "
    f"ε = {e['eps_slot']:.3f} (per-slot) and {e['eps_dedup']:.3f} (deduplicating): the engine's ε = {e['eps_engine']:.3f} "
    f"is what bounds (17)-(21) of notebook 04 and `moespec advise` (notebook 08) carry. Transfer to a held-out model, "
    f"median |error| of r: " + ", ".join(f"{name} {g['r_rel_err'].abs().median():.2f}"
                                        for name, g in transfer.groupby('model', sort=False)) + "."
    + ("" if profile == "full" else f" Set `profile = \"full\"` for {main_name.removesuffix('-shrunk')}'s own shapes "
                                    "and the published models' of the transfer test.")))
