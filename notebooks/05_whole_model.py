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
# Paper 1, Section 4 and Appendices D–E, on this engine (`moespec.engine`): a transformers MoE
# whose expert operation runs through `moespec.kernels`, one call per layer. **Dedup off**: the
# per-slot kernel for passes of up to 9 tokens; **dedup on**: the deduplicating kernel from n = 2
# (n = 1 is per-slot either way; prefill runs the deduplicating kernel either way).
#
# **The subject** (`model=`, docs/engine.md "Subjects"). By default the *byte-faithful* subject:
# the default MoE trained here with every expert embedded, function-preservingly, in an expert of
# OLMoE's shape in the kernels' int8 format, so that its routing, tokens and draft acceptance are
# the trained models' and each expert read is an OLMoE expert read (`moespec.engine.widen`).
# Every figure and table names the subject it was made on.
#
# 0. Where a decode step's time goes (expert operation, the rest, one drafted token), one interleaved run.
# 1. The output check of Appendix E (greedy tokens and verify argmax, dedup off and on) and, for a
#    widened subject, the same greedy tokens as the unwidened model in the same format.
# 2. Verify time tau_p(n), n = 1..9, both settings, at two context depths; medians with bootstrap
#    intervals; saving S(n); every repetition paired with a same-round reference read, summaries
#    in the dominant bandwidth regime (the pre-registered protocol) and over all rows.
# 3. Speculative decoding with the oracle draft: every k of the profile x its acceptance values (the full
#    profile: k = 0..8 x the acceptance values of the pre-registered rules), dedup on.
# 4. The real draft model on MT-Bench first turns at several draft costs per token (the draft's MLPs
#    widened function-preservingly), measured speedups beside the theory's prediction.
#
# **Differences from the paper.** The trained model is small; the byte-faithful subject gives its
# experts OLMoE's bytes, not OLMoE's attention or layer count (4 MoE layers, not 16). Its context
# is 256 positions, so the depths are a short one and the deepest leaving room for the generated
# tokens, not 512 and 4096. The machine is a shared 2-core CPU whose read bandwidth switches
# between regimes; both are recorded below. The scoring rules were committed before any
# speculative run on this subject (the commit is printed below).

# %% tags=["parameters"]
profile = "quick"       # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce passes it)
device = "cpu"
seed = 0
threads = 1
backend = "auto"
model = "byte-faithful"
like = ""
fmt = ""
dtype = ""
draft = ""
trace_file = ""
layers = 0
draft_cost = 0.0
depths = None
prompts_per_depth = None
verify_reps = None
n_boot = None
oracle_ks = None
a_values = None
n_tokens = None
oracle_prompts = None
oracle_reps = None
real_ks = None
real_tokens = None
real_prompts = None
draft_costs = None
agree_tokens = None
breakdown_reps = None
ratio_reps = None
out_dir = ""           # "" : inside the run folder (paths.run_data_dir())

# %%
import copy
import datetime as dt

import numpy as np
import pandas as pd
from moespec import io, paths, predict, provenance
from moespec.measure.regimes import ReferenceRead
from moespec.engine import breakdown as B
from moespec.engine import draftcost as DC
from moespec.engine import goals as G
from moespec.engine import summaries as SM
from moespec.notebook_profiles import default_depths, resolve, setup
from moespec.engine.runs import greedy_agreement, oracle_sweep
from moespec.engine.subject import load_subject, widen_draft
from moespec.engine.verify import measure_verify_times, regime_summaries
from moespec.plots.engine import breakdown_figure, draft_cost_figure
from moespec.plots.predictions import oracle_figure, real_draft_figure, verify_time_figure
from moespec.routing import RoutingTrace
from moespec.tables.predictions import oracle_cells

out = setup(profile, device, threads, out_dir)
subject_args = dict(model=model, like=like, fmt=fmt, dtype=dtype, draft=draft, trace_file=trace_file, layers=layers,
                    draft_cost=draft_cost, layout="published")
sub = load_subject(profile=profile, device=device, backend=backend, seed=seed, **subject_args)
rules = predict.load_rules(sub.rules_file)
rules_prov = predict.rules_provenance(sub.rules_file)
P, from_profile = resolve("05", profile, depths=depths, prompts_per_depth=prompts_per_depth, verify_reps=verify_reps,
                          n_boot=n_boot, oracle_ks=oracle_ks, a_values=a_values, n_tokens=n_tokens,
                          oracle_prompts=oracle_prompts, oracle_reps=oracle_reps, real_ks=real_ks,
                          real_tokens=real_tokens, real_prompts=real_prompts, draft_costs=draft_costs,
                          agree_tokens=agree_tokens, breakdown_reps=breakdown_reps, ratio_reps=ratio_reps)
P["a_values"] = P["a_values"] or rules["acceptance_values"]
P["draft_costs"] = P["draft_costs"] if P["draft_costs"] is not None else rules.get("draft_cost_grid", {}).get("values", [0.0])
P["depths"] = P["depths"] or default_depths(sub.context, P["n_tokens"])
fig_dir = paths.ensure(paths.figures_dir())
label = sub.label
prompts_by_depth = {d: sub.depth_prompts(d, P["prompts_per_depth"], seed) for d in P["depths"]}
ref = ReferenceRead(device=device)
print(f"subject: {label}")
for key, value in sub.description.items():
    print(f"  {key}: {value}")
print(f"profile={profile}, device={device}, torch threads={threads}, backend={backend}, results -> {out}")
print(f"run sizes: {P}; from the {profile} profile: {from_profile}")
print(f"scoring rules {rules_prov['path']}: commit {rules_prov['commit']} at {rules_prov['committed_at']}, "
      f"unchanged on disk: {rules_prov['unchanged']}; pre-registered for this subject: {sub.preregistered}")

# %% [markdown]
# ## 0. Where a decode step's time goes (one interleaved run)

# %%
bd = B.decode_breakdown({sub.kind: sub}, {sub.kind: prompts_by_depth[P["depths"][0]][0]}, reps=P["breakdown_reps"],
                        device=device)
shares = B.shares(bd).assign(label=label)
io.write_dataframe(out / "breakdown.csv", bd)
io.write_dataframe(fig_dir / "05_breakdown.csv", shares)
io.save_figure(breakdown_figure(shares, title=f"decode step at d = {P['depths'][0]}: {label}"),
               fig_dir / "05_breakdown.png")
s0 = shares.iloc[0]
print(f"n = 1 step {s0.step_ms:.3f} ms: expert operation {s0.experts_ms:.3f} ms ({100 * s0.expert_share:.1f} %), "
      f"without it {s0.step_without_experts_ms:.3f} ms; one drafted token {s0.draft_token_ms:.3f} ms "
      f"({s0.draft_ratio:.3f} of a step); read {s0.read_GBps:.1f} GB/s; peak memory {s0.peak_memory_GiB:.2f} GiB")

# %% [markdown]
# ## 1. Same output with deduplication off and on (Appendix E's check), and the same function as unwidened

# %%
agree = pd.concat([greedy_agreement(sub.engine, prompts_by_depth[d][:3], P["agree_tokens"]).assign(d=d)
                   for d in P["depths"]])
io.write_dataframe(out / "agreement.csv", agree)
io.write_dataframe(fig_dir / "05_agreement.csv", agree.assign(subject=label))
tot = SM.agreement_totals(agree)
print(f"greedy tokens equal with dedup off and on: {tot['greedy_equal']} of {tot['tokens']}")
print(f"verify argmax equal with dedup off and on: {tot['verify_argmax_equal']} of {tot['verify_rows']} rows")
print(f"verify argmax equal to batch-one greedy: {tot['verify_matches_greedy']} of {tot['verify_rows']} rows")
if sub.kind == "byte-faithful":
    unwidened = load_subject("default", profile=profile, device=device, backend=backend, fmt=sub.description["fmt"],
                             dtype=dtype, seed=seed)
    same = pd.concat([SM.compare_engines(sub.engine, unwidened.engine, prompts_by_depth[d][:3],
                                         P["agree_tokens"]).assign(d=d) for d in P["depths"]])
    io.write_dataframe(fig_dir / "05_function_preserved.csv", same.assign(subject=label))
    print(f"greedy tokens equal to the unwidened model in {sub.description['fmt']}: {int(same.greedy_equal.sum())} of "
          f"{int(same.tokens.sum())}; largest |logit difference| {same.max_abs_logit_diff.max():.3g} "
          f"(logits up to {same.max_abs_logit.max():.3g})")
    del unwidened

# %% [markdown]
# ## 2. Verify time tau_p(n) and the measured saving S(n)

# %%
started = {"verify": dt.datetime.now(dt.timezone.utc).isoformat()}
verify_parts, argmax = [], {"rows": 0, "settings": 0, "greedy": 0}
for d in P["depths"]:
    rows, info = measure_verify_times(sub.engine, prompts_by_depth[d], n_max=9, reps=P["verify_reps"], seed=seed,
                                      depth=d, reference=ref)
    verify_parts.append(rows)
    argmax["rows"] += info["argmax_rows"]
    argmax["settings"] += info["argmax_agree_settings"]
    argmax["greedy"] += info["argmax_agree_greedy"]
verify_rows = pd.concat(verify_parts, ignore_index=True)
summary, summary_all, regimes = regime_summaries(verify_rows, n_boot=P["n_boot"], seed=seed)
io.write_dataframe(out / "verify_rows.csv", verify_rows)
io.write_dataframe(out / "verify_summary.csv", summary)
io.write_dataframe(out / "verify_summary_all.csv", summary_all)
io.write_dataframe(fig_dir / "05_verify_summary.csv", summary.assign(subject=label, rows=regimes["dominant"]))
io.write_dataframe(fig_dir / "05_verify_summary_all_rows.csv", summary_all.assign(subject=label, rows="all"))
io.save_figure(verify_time_figure(summary, title=f"{label}; {device}, regime {regimes['dominant']} "
                                                 f"(threshold {regimes['threshold_GBps']} GB/s)"),
               fig_dir / "05_verify_time.png")
print(f"verify argmax (n = 9 passes) equal with dedup off and on: {argmax['settings']} of {argmax['rows']} rows")
print(f"other processes' share of the CPUs during the verify timings: median {verify_rows['other_load'].median():.2f}, "
      f"max {verify_rows['other_load'].max():.2f}")
print(f"bandwidth regimes of the repetitions (reference read {ref.nbytes >> 20} MiB): {regimes['regimes']}; "
      f"threshold {regimes['threshold_GBps']}; rules use regime {regimes['dominant']!r}: {regimes['depths']}")
for name, table in (("rules' regime", summary), ("all rows", summary_all)):
    for r in SM.verify_report(table):
        print(f"[{name}] d={r['d']}: tau(1) = {r['tau1_ms']:.3f} ms; tau_slot(9) = {r['tau_slot_last_ms']:.3f} ms, "
              f"tau_dedup(9) = {r['tau_dedup_last_ms']:.3f} ms; measured crossover {r['crossover']}")
        print(f"  S(n) ms, n=2..9: " + ", ".join(f"{x:+.3f} [{lo:+.3f}, {hi:+.3f}]"
                                                  for x, lo, hi in zip(r["S_ms"], r["S_lo_ms"], r["S_hi_ms"])))

# %% [markdown]
# ## 3. Speculative decoding with the oracle draft (dedup on)
#
# The greedy continuation of each prompt is decoded once, untimed; each run reuses the prompt's
# cache. Realized acceptance is the geometric estimate accepted / (accepted + rejections).

# %%
started["oracle"] = dt.datetime.now(dt.timezone.utc).isoformat()
oracle_parts = []
for d in P["depths"]:
    routing = []
    oracle_parts.append(oracle_sweep(sub.engine, prompts_by_depth[d][:P["oracle_prompts"]], P["oracle_ks"],
                                     P["a_values"], P["n_tokens"], reps=P["oracle_reps"], seed=seed, depth=d,
                                     routing_out=routing, reference=ref))
    RoutingTrace(routing, num_experts=int(sub.description["expert_shape"][0]),
                 source=f"greedy continuations verified at d={d}").save(out / f"routing_text_d{d}.npz")
oracle = pd.concat(oracle_parts, ignore_index=True)
io.write_dataframe(out / "oracle_runs.csv", oracle)
io.save_figure(oracle_figure(oracle, title=f"oracle draft, {label}"), fig_dir / "05_oracle_acceptance.png")
cells = oracle_cells(oracle)
io.write_dataframe(fig_dir / "05_oracle_cells.csv", cells.assign(subject=label))
orc = SM.oracle_report(oracle, cells)
print(f"oracle runs: {orc['runs']}; largest |realized a - a| over (d, k, a) cells: {orc['max_abs_a_error']:.3f}")
print(f"tokens per step / G_a(k): median {orc['tps_over_G_median']:.3f}, range {orc['tps_over_G_min']:.3f} to "
      f"{orc['tps_over_G_max']:.3f}")
print(f"steps cut short (batched argmax differs from batch-one greedy): {orc['cut_short']} of {orc['steps']}")

# %% [markdown]
# ## 4. Real draft on MT-Bench first turns at several draft costs (Appendix D.3; paper 2's EAGLE-3 regime)
#
# The same trained draft, its dense MLPs widened function-preservingly so that a drafted token
# reads `draft_cost` x the target's expert bytes per token: the drafts propose the same tokens,
# only their time differs. The cost ratio c (drafted token / target step) is measured in its own
# interleaved rounds. The theory's prediction uses the measured acceptance at each k and the
# separately measured parts of a step (draft time fit per draft, verify time, host time).

# %%
started["real_draft"] = dt.datetime.now(dt.timezone.utc).isoformat()
if sub.draft is None:
    print(f"no real draft for this subject ({sub.description['real']}); section skipped")
else:
    drafts = {}
    for r in P["draft_costs"]:
        drafts[float(r)] = copy.deepcopy(sub.draft)
        widen_draft(drafts[float(r)], sub.expert_bytes_per_token(), float(r), seed=seed + 1)
    mt_prompts = sub.chat_prompts(P["real_prompts"], max_tokens=sub.context - P["real_tokens"] - 10, seed=seed)
    ratios = DC.draft_cost_ratios(sub.engine, drafts, mt_prompts[0], reps=P["ratio_reps"], reference=ref)
    real = DC.draft_cost_sweep(sub.engine, drafts, mt_prompts, P["real_ks"], P["real_tokens"], seed=seed, reference=ref)
    pred = DC.predict_speedups(real)
    stop = DC.stop_paying(pred, ratios)
    summ, rep = SM.real_draft_report(real)
    io.write_dataframe(out / "real_draft.csv", real)
    io.write_dataframe(out / "draft_cost_ratios.csv", ratios)
    io.write_dataframe(fig_dir / "05_draft_cost_ratios.csv", ratios.assign(subject=label))
    io.write_dataframe(fig_dir / "05_draft_cost_predictions.csv", pred.assign(subject=label))
    io.write_json(fig_dir / "05_draft_cost_stop.json", {**stop, "subject": label})
    io.write_dataframe(fig_dir / "05_real_draft.csv", summ.assign(subject=label))
    refs = DC.paper_references()
    io.save_figure(draft_cost_figure(pred, ratios, refs if profile == "full" else None,
                                     title=f"real draft on MT-Bench first turns at several draft costs: {label}"),
                   fig_dir / "05_draft_cost.png")
    io.save_figure(real_draft_figure(real[(real.k == 0) | (real.draft_cost == rep["draft_cost"])],
                                     {1: refs["paper1_k1"]} if profile == "full" else None,
                                     title=f"real draft (draft cost {rep['draft_cost']:g}), {label}"),
                   fig_dir / "05_real_draft.png")
    print(ratios[["draft_cost", "t_draft_token_s", "t_target_step_s", "cost_ratio", "cost_ratio_q25", "cost_ratio_q75"]]
          .round(4).to_string(index=False))
    print(pred[["draft_cost", "k", "a", "predicted", "measured", "rel_error"]].round(3).to_string(index=False))
    print(f"prediction within 10 % at {int((pred.rel_error.abs() <= 0.10).sum())} of {len(pred)} (cost, k) points; "
          f"largest |error| {100 * pred.rel_error.abs().max():.1f} %")
    print(f"drafting stops paying from draft cost {stop['stop_cost_measured']} (measured), "
          f"{stop['stop_cost_predicted']} (predicted): {stop['grid_steps_apart']} grid steps apart; "
          f"cost ratios {np.round(stop['cost_ratio'], 3).tolist()}")
    goals = G.draft_cost_goals(pred, stop).assign(subject=label)
    io.write_dataframe(fig_dir / "05_goals.csv", goals)
    print(goals.drop(columns="subject").to_string(index=False))
    print(f"draft cost {rep['draft_cost']:g}: plain decoding fastest on {rep['plain_fastest']} of {rep['prompts']} prompts")
    print(f"median speedup over plain decoding: k=1 {rep['speedup_k1']:.3f}, k={rep['k_last']} {rep['speedup_k_last']:.3f}")

# %%
record = {"profile": profile, "subject": label, "subject_kind": sub.kind, "subject_args": subject_args,
          "description": sub.description, "depths": P["depths"], "sizes": P, "from_profile": from_profile,
          "threads": threads, "backend": backend, "device": device, "started": started,
          "finished": dt.datetime.now(dt.timezone.utc).isoformat(), "rules": rules_prov, "regimes": regimes,
          "verify_argmax": argmax, "n_tokens": P["n_tokens"], "ks": P["oracle_ks"], "a_values": list(P["a_values"]),
          "provenance": provenance.full_record()}
io.write_json(out / "run.json", record)
before = (rules_prov["committed_at"] is not None
          and dt.datetime.fromisoformat(rules_prov["committed_at"]) < dt.datetime.fromisoformat(started["oracle"]))
print(f"rules committed {rules_prov['committed_at']} before the speculative runs started {started['oracle']}: {before}")


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

crossovers = {r["d"]: r["crossover"] for r in SM.verify_report(summary)}
shown = (f"**{profile} profile, {label}.** A decode step at n = 1 spends {100 * s0.expert_share:.0f} % of its time in the "
         f"expert operation and a drafted token costs {s0.draft_ratio:.2f} of a step. Deduplication off and on give the "
         f"same greedy tokens ({tot['greedy_equal']} of {tot['tokens']}); the measured saving makes deduplication faster "
         f"from n = " + ", ".join(f"{c} (d = {d})" for d, c in crossovers.items()) + ".")
if sub.draft is not None:
    shown += (f" With the real draft at draft cost {rep['draft_cost']:g}, plain decoding is fastest on "
              f"{rep['plain_fastest']} of {rep['prompts']} prompts (median speedup {rep['speedup_k1']:.3f} at k = 1); "
              f"the theory's speedup is within 10 % of the measured one at {int((pred.rel_error.abs() <= 0.10).sum())} "
              f"of {len(pred)} (draft cost, k) points.")
if profile != "full":
    shown += " The quick profile runs tiny models; set `profile = \"full\"` for the measurements behind figures/."
display(Markdown(shown))
