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
# # 05 — Whole-model runs: the dedup switch, verify time and speculative decoding
#
# Paper 1, Section 4 and Appendices D–E, on this engine (`moespec.engine`): the default MoE
# (an `OlmoeForCausalLM` trained here) with its expert operation run through `moespec.kernels`,
# one Python call per layer. **Dedup off**: the per-slot kernel for passes of up to 9 tokens;
# **dedup on**: the deduplicating kernel from n = 2 (n = 1 is per-slot either way; prefill runs
# the deduplicating kernel either way, as the paper's engines run their tiled kernels above the cap).
#
# 1. The output check of Appendix E: greedy tokens and the verify argmax, dedup off and on.
# 2. Verify time tau_p(n), n = 1..9, both settings, at two context depths on six WikiText
#    validation articles truncated to d tokens; medians with bootstrap intervals; saving S(n).
# 3. Speculative decoding with the oracle draft (the target's greedy token corrupted with
#    probability 1 − a, seeded): k = 0..8 × 11 acceptance values, dedup on.
# 4. The real draft model on MT-Bench first turns, plain decoding against k = 1..8 (App. D.3).
#
# **Differences from the paper.** The model is small and trained here; its context is the
# model's own (`max_position_embeddings`), so the two depths are a short one and the deepest
# that leaves room for the generated tokens, not 512 and 4096. The machine is a shared 2-core CPU,
# so times are dominated by per-pass host work, and other processes add noise (recorded below).
# The scoring rules of Table 8 were committed before any speculative run
# (`data/preregistration/scoring_rules.json`; the commit is printed below).

# %% tags=["parameters"]
profile = "quick"       # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce passes it)
device = "cpu"
seed = 0
threads = 1
backend = "auto"
out_dir = ""           # "" : inside the run folder (paths.run_data_dir())

# %%
import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
from moespec import io, paths, predict, provenance
from moespec.engine import Engine
from moespec.engine import prompts as P
from moespec.engine.profiles import setup, target_model
from moespec.engine.runs import greedy_agreement, oracle_sweep, real_draft_sweep
from moespec.engine.verify import measure_verify_times, summarize_verify
from moespec.plots.predictions import oracle_figure, real_draft_figure, verify_time_figure
from moespec.routing import RoutingTrace
from moespec.tables.predictions import oracle_cells
from moespec import zoo

out = setup(profile, device, threads, out_dir)
model, model_label = target_model(profile)
fig_dir = paths.ensure(paths.figures_dir())
rules_prov = predict.rules_provenance()
print(f"profile={profile}, torch threads={threads}, backend={backend}, results -> {out}")
print(f"scoring rules: commit {rules_prov['commit']} at {rules_prov['committed_at']}, "
      f"unchanged on disk: {rules_prov['unchanged']}")

if profile == "quick":
    draft = zoo.tiny_draft(seed=2, vocab_size=256)
    rng = np.random.default_rng(seed)
    depths = [24, 48]
    prompts_by_depth = {d: [rng.integers(1, 256, size=d) for _ in range(2)] for d in depths}
    mt_prompts = [rng.integers(1, 256, size=12) for _ in range(2)]
    verify_reps, n_boot = 3, 200
    ks, a_values, n_tokens, oracle_reps = [0, 1, 2, 3], [0.5, 0.8, 0.95], 10, 1
    real_ks, real_tokens = [1, 2], 6
    agree_tokens = 12
else:
    draft = zoo.load_draft()
    tok = zoo.load_tokenizer()
    ctx = model.config.max_position_embeddings
    n_tokens = 64
    depths = [ctx // 4, ctx - n_tokens]
    prompts_by_depth = {d: P.validation_prompts(tok, d, count=6)[0] for d in depths}
    # every second first turn: 40 prompts, 5 of each of the 8 categories (10 each, in file order), for time
    mt_prompts = P.tokenize_prompts(P.mt_bench_first_turns()[::2], tok, max_tokens=ctx - 64)
    verify_reps, n_boot = 20, 2000
    ks, a_values, oracle_reps = list(range(9)), predict.load_rules()["acceptance_values"], 3
    real_ks, real_tokens = list(range(1, 9)), 32
    agree_tokens = 64
engine = Engine(model, backend=backend)
print(f"model: {model_label}; L={engine.num_layers} MoE layers, N={model.config.num_experts}, "
      f"m={model.config.num_experts_per_tok}, context={model.config.max_position_embeddings}; depths {depths}")

# %% [markdown]
# ## 1. Same output with deduplication off and on (Appendix E's check)

# %%
agree = pd.concat([greedy_agreement(engine, prompts_by_depth[d][:3], agree_tokens).assign(d=d) for d in depths])
io.write_dataframe(out / "agreement.csv", agree)
io.write_dataframe(fig_dir / "05_agreement.csv", agree)
g_eq, g_all = int(agree["greedy_equal"].sum()), int(agree["tokens"].sum())
v_eq, v_all = int(agree["verify_argmax_equal"].sum()), int(agree["verify_rows"].sum())
print(f"greedy tokens equal with dedup off and on: {g_eq} of {g_all}")
print(f"verify argmax equal with dedup off and on: {v_eq} of {v_all} rows")
print(f"verify argmax equal to batch-one greedy: {int(agree['verify_matches_greedy'].sum())} of {v_all} rows")

# %% [markdown]
# ## 2. Verify time tau_p(n) and the measured saving S(n)

# %%
started = {"verify": dt.datetime.now(dt.timezone.utc).isoformat()}
verify_parts, text_routing, argmax = [], [], {"rows": 0, "settings": 0, "greedy": 0}
for d in depths:
    rows, info = measure_verify_times(engine, prompts_by_depth[d], n_max=9, reps=verify_reps, seed=seed, depth=d)
    verify_parts.append(rows)
    argmax["rows"] += info["argmax_rows"]
    argmax["settings"] += info["argmax_agree_settings"]
    argmax["greedy"] += info["argmax_agree_greedy"]
verify_rows = pd.concat(verify_parts, ignore_index=True)
summary = summarize_verify(verify_rows, n_boot=n_boot, seed=seed)
io.write_dataframe(out / "verify_rows.csv", verify_rows)
io.write_dataframe(out / "verify_summary.csv", summary)
io.write_dataframe(fig_dir / "05_verify_summary.csv", summary)
io.save_figure(verify_time_figure(summary, title=f"moespec engine, {model_label}, CPU"), fig_dir / "05_verify_time.png")
print(f"verify argmax (n = 9 passes) equal with dedup off and on: {argmax['settings']} of {argmax['rows']} rows")
print(f"other processes' share of the CPUs during the verify timings: median {verify_rows['other_load'].median():.2f}, "
      f"max {verify_rows['other_load'].max():.2f}")
for d in depths:
    s = summary[summary["d"] == d].sort_values("n")
    print(f"d={d}: tau(1) = {s['tau_slot_s'].iloc[0] * 1e3:.3f} ms; "
          f"tau_slot(9) = {s['tau_slot_s'].iloc[-1] * 1e3:.3f} ms, tau_dedup(9) = {s['tau_dedup_s'].iloc[-1] * 1e3:.3f} ms")
    print(f"  S(n) ms, n=2..9: " + ", ".join(f"{x * 1e3:+.3f}" for x in s["S_s"].iloc[1:]))
    print(f"  measured crossover: {predict.crossover(s['S_s'].to_numpy())}")

# %% [markdown]
# ## 3. Speculative decoding with the oracle draft (dedup on)
#
# The greedy continuation of each prompt is decoded once, untimed; each run reuses the prompt's
# cache. Realized acceptance is the geometric estimate accepted / (accepted + rejections).

# %%
started["oracle"] = dt.datetime.now(dt.timezone.utc).isoformat()
oracle_parts = []
for d in depths:
    routing = []
    oracle_parts.append(oracle_sweep(engine, prompts_by_depth[d], ks, a_values, n_tokens, reps=oracle_reps,
                                     seed=seed, depth=d, routing_out=routing))
    text_routing.append(RoutingTrace(routing, num_experts=model.config.num_experts,
                                     source=f"greedy continuations verified at d={d}"))
    text_routing[-1].save(out / f"routing_text_d{d}.npz")
oracle = pd.concat(oracle_parts, ignore_index=True)
io.write_dataframe(out / "oracle_runs.csv", oracle)
io.save_figure(oracle_figure(oracle, title=f"oracle draft, {model_label}"), fig_dir / "05_oracle_acceptance.png")
cells = oracle_cells(oracle)
io.write_dataframe(fig_dir / "05_oracle_cells.csv", cells)
drafted = cells[cells["k"] > 0]
print(f"oracle runs: {len(oracle)}; largest |realized a - a| over (d, k, a) cells: "
      f"{np.max(np.abs(drafted['realized_a'] - drafted['a'])):.3f}")
print(f"tokens per step / G_a(k): median {drafted['tps_over_G'].median():.3f}, "
      f"range {drafted['tps_over_G'].min():.3f} to {drafted['tps_over_G'].max():.3f}")
print(f"steps cut short (batched argmax differs from batch-one greedy): {int(oracle['cut_short'].sum())} "
      f"of {int(oracle['steps'].sum())}")

# %% [markdown]
# ## 4. Real draft model on MT-Bench first turns (Appendix D.3 analogue)

# %%
started["real_draft"] = dt.datetime.now(dt.timezone.utc).isoformat()
real = real_draft_sweep(engine, draft, mt_prompts, real_ks, real_tokens)
io.write_dataframe(out / "real_draft.csv", real)
best_k = real.loc[real.groupby("prompt")["throughput"].idxmax(), "k"]
plain_best = int((best_k == 0).sum())
med = real[real["k"] > 0].groupby("k")["speedup"].median()
summ = real.groupby("k").agg(speedup_median=("speedup", "median"), tokens_per_step=("tokens_per_step", "median"),
                             realized_a=("realized_a", "median")).reset_index()
io.write_dataframe(fig_dir / "05_real_draft.csv", summ)
scalars = pd.read_csv(paths.reference_dir() / "paper1_scalars.csv")
paper_sp = {1: float(scalars.loc[scalars["quantity"] == "real_draft_median_speedup_k1", "value"].iloc[0]),
            8: float(scalars.loc[scalars["quantity"] == "real_draft_median_speedup_k8", "value"].iloc[0])}
io.save_figure(real_draft_figure(real, paper_sp if profile == "full" else None,
                                 title=f"real draft on MT-Bench first turns, {model_label}"),
               fig_dir / "05_real_draft.png")
print(f"plain decoding fastest on {plain_best} of {real['prompt'].nunique()} prompts")
print(f"median speedup over plain decoding: k=1 {med.iloc[0]:.3f}, k={med.index[-1]} {med.iloc[-1]:.3f}")

# %%
record = {"profile": profile, "model": model_label, "depths": depths, "threads": threads,
          "backend": backend, "started": started, "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
          "rules": rules_prov, "verify_argmax": argmax, "n_tokens": n_tokens, "ks": ks,
          "a_values": list(a_values), "provenance": provenance.full_record()}
io.write_json(out / "run.json", record)
print(f"rules committed {rules_prov['committed_at']} before the speculative runs started {started['oracle']}: "
      f"{rules_prov['committed_at'] is not None and dt.datetime.fromisoformat(rules_prov['committed_at']) < dt.datetime.fromisoformat(started['oracle'])}")


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

crossovers = {d: predict.crossover(summary[summary["d"] == d].sort_values("n")["S_s"].to_numpy()) for d in depths}
display(Markdown(
    f"**{profile} profile, {model_label}.** Deduplication off and on give the same greedy tokens ({g_eq} of {g_all}); "
    f"the measured saving makes deduplication faster from n = "
    + ", ".join(f"{c} (d = {d})" for d, c in crossovers.items())
    + f". With the real draft, plain decoding is fastest on {plain_best} of {real['prompt'].nunique()} prompts "
      f"(median speedup {med.iloc[0]:.3f} at k = {med.index[0]})."
    + ("" if profile == "full" else " The quick profile runs a tiny random model; set `profile = \"full\"` for the "
                                    "trained default MoE (several minutes, with progress bars).")))
