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
# # 02 · The expert operation alone: effective bandwidth of each kernel (paper 1, Section 2; Figure 2, Table 1, Figure 3 right)
#
# One MoE layer's expert operation runs alone with the per-slot kernel (one expert read per
# (token, slot)) and the deduplicating kernel (each distinct expert read once per pass). Each pass
# size n = 1..9 is one interleaved group: passes with *chosen ids* (exactly U distinct experts,
# from U = m to U = min(N, n·m)), *windows* of n consecutive tokens of routing, both kernels on
# every pass, the read ceiling (the best of the kernels' read patterns, `moespec.measure.ceiling`) and a
# `torch.sum` read beside it, repetitions round-robin, each call after a cache flush of 4x the machine's
# last-level cache (at least the paper's 256 MiB; reads as large). The effective bandwidth of a kernel is its
# requested expert bytes over its time (per-slot: n·m·b; deduplicating: U·b);
# r(n) = β_dedup/β_slot and ū(n) = Σ U·b / Σ n·m·b over layers and windows (Table 1's definition).
#
# **Your own model**: `model` = its checkpoint folder, or its `config.json` alone (e.g. beside an
# engine's routing dump): the shape (N, m, L, H, I) is read from the config
# (`moespec.model_shapes.spec_from_config`) and the weights are random at that shape, since only the
# timing matters here; the windows come from the routing notebook 01 recorded and saved in this run,
# or from `trace_file`, which must have the model's shape (L, N, m) or is refused.
#
# **What differs from the paper.** Weights are random at the model's published shapes (kernel time
# depends on shapes and format, not on values); the kernels are moespec's own (`moespec.kernels`:
# torch, C++ CPU, CUDA), not llama.cpp's or MLX's; the machine is this one (recorded in the run's
# `provenance.json`). Windows come from recorded routing when a trace folder holds a trace of the
# model, else from a synthetic trace calibrated to the paper's published reuse, labelled as such.
# On a shared CPU the read bandwidth drifts by tens of percent within minutes: compare ratios
# (r, ū, re-read cost) from one interleaved run, not absolute GB/s across runs.

# %% tags=["parameters"]
profile = "quick"       # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce passes it)
device = "cpu"
seed = 0
model = "olmoe"       # a preset (olmoe, qwen3, gpt-oss, deepseek-v2-lite), or a checkpoint folder or config.json
fmt = "f32"           # f32, bf16 or int8_b32 (moespec.kernels formats)
backend = "auto"      # auto, torch, cpp or cuda
trace_file = ""       # "" : a recorded trace of the model (paths.trace_files(), e.g. notebook 01's), else synthetic
out_dir = ""          # "" : the run's data/bench/expert_op (paths.expert_op_dir())
resume = True         # continue an interrupted run of the same configuration
breadth_csv = ""      # "" : the committed bench_kernels.py --ggml run at paper 1's breadth (moespec.tables.bandwidth.BREADTH_RUN)

# %%
from datetime import datetime, timezone
from pathlib import Path

import json

from moespec import fit, io, paths
from moespec.measure import discard, expert_op
from moespec.plots.bandwidth import figure2_bandwidth, figure2_grid, figure3_distinct_share
from moespec.routing import RoutingTrace
from moespec.tables.bandwidth import (PAPER_LABEL, bandwidth_by_n, breadth_bandwidths, discard_effect,
                                      distinct_share, load_breadth_run, table1, table1_breadth)
from moespec.validate.run_identity import stamp_frame

config = expert_op.profile_config(profile, model, fmt, backend, device, seed, role="main")
spec = config.spec()
bench_out = Path(out_dir) if out_dir else paths.expert_op_dir()
figures = paths.ensure(paths.figures_dir())
print(expert_op.describe_shape(config))
print(f"profile={profile}: model={model} fmt={fmt} backend={backend} device={device}; "
      f"layers {config.layers}, n = {config.ns[0]}..{config.ns[-1]}, {config.u_count} values of U and "
      f"{config.windows_per_n} windows per n, {config.reps} reps, flush {config.flush_bytes >> 20} MiB, "
      f"read reference {config.membw_bytes / 2**30:.3g} GiB, {config.threads} torch thread(s)")

# %% [markdown]
# ## Routing whose windows are timed

# %%
doc_len = 64 if profile == "quick" else 512
trace = expert_op.routing_for(model, trace_file, seed=seed, num_docs=4 if profile == "quick" else 16,
                              doc_len=doc_len)
print(f"windows from: {trace.label}")

# %% [markdown]
# ## The benchmark (rows are written as each (layer, n) group finishes; an interrupted run resumes)

# %%
run_dir = expert_op.run(config, out_dir=bench_out, trace=trace, resume=resume)
rows = expert_op.load_rows(run_dir)
side = json.loads((run_dir / "provenance.json").read_text())
cpu = side["provenance"]["hardware"]["cpu"].get("cpu_model", "unknown CPU")
gpus = side["provenance"]["hardware"]["gpus"]
machine = gpus[0]["name"] if device.startswith("cuda") and gpus else cpu
print(f"run {side['run_id']}: {len(rows)} rows, backend {side['backend_resolved']}, machine: {machine}")

# %% [markdown]
# ## The discard rule (`moespec.measure.discard`)
# A group (the passes timed together) is discarded when its read bandwidth departs from the run's
# median read by more than the stated share, or when the machine swapped or a GPU throttled while
# it ran. Figure 2, Table 1 and the fits below read the kept rows.

# %%
decision = discard.apply_rule(rows, source=str(run_dir / "rows.csv"))
counts = discard.counts_table({"Figure 2, Table 1, 02_bandwidth_by_n": decision})
io.write_dataframe(figures / "02_discard_groups.csv", stamp_frame(decision.groups))
io.write_dataframe(figures / "02_discard_rule.csv", stamp_frame(counts))
rows = decision.kept
print(decision.groups[["layer", "n", "read_GBps", "departure", "discard_reason"]].round(4).to_string(index=False))
print(counts.to_string(index=False))

# %% [markdown]
# ## Figure 2: effective bandwidth against n
# Median and interquartile range over layers and windows; dotted: the read ceiling measured in
# the same run, inside each n's interleaved group (it drifts between groups on a shared machine;
# within a group both kernels and the read see the same machine); red rings: a share above 1.

# %%
passes = fit.window_bandwidths(rows)
read_bw = expert_op.read_bandwidth(rows)
bw = bandwidth_by_n(rows)     # Table 1's bandwidths per n, shares of the read ceiling, the check of a share > 1
fig = figure2_bandwidth(passes, {passes["model"].iloc[0]: bw},
                        title=f"moespec {side['backend_resolved']} kernels, {fmt}, {machine}; windows: {trace.label}")
io.save_figure(fig, figures / "02_fig2_bandwidth.png")
print(f"read ceiling ({read_bw['probe']}, same run): median {read_bw['median_GBps']:.2f} GB/s (IQR "
      f"{read_bw['q25_GBps']:.2f}-{read_bw['q75_GBps']:.2f}); cold: {json.dumps(side.get('cold', {}).get('cache'))}")

# %% [markdown]
# ## Table 1: bandwidths, r(n), ū(n) at n = 2 and 8, re-read cost c_re/c_u of eq. (4)
# Our row first (this machine, this run), then the paper's published rows, labelled as such.

# %%
bw = bw.assign(**expert_op.shape_columns(config))   # the model's shape (N, m, L) beside its rows
fits = fit.fit_layers(rows)
date = datetime.now(timezone.utc).strftime("%Y-%m-%d")
t1 = table1(bw, fits, engine=f"moespec {side['backend_resolved']} ({fmt})", source=f"moespec, measured here ({date}, {machine})")
io.write_dataframe(figures / "02_table1_bandwidth.csv", stamp_frame(t1))
io.write_dataframe(figures / "02_bandwidth_by_n.csv", stamp_frame(bw))
print(t1.round(3).to_string(index=False))
for n in (2, 8):
    at = bw[bw["n"] == n].iloc[0]
    print(f"n={n}: beta_slot={at['beta_slot_GBps']:.5g} GB/s beta_dedup={at['beta_dedup_GBps']:.5g} GB/s "
          f"r={at['r']:.4f} ubar={at['ubar']:.4f} -> dedup {'faster' if at['ubar'] < at['r'] else 'slower'} (eq. 7)")
print("per-slot / dedup bandwidth over the read ceiling of the same group, n = 1..9: "
      + ", ".join(f"{r.slot_over_read:.2f}/{r.dedup_over_read:.2f}" + (f" [{r.above_read} > 1]" if r.above_read else "")
                  for r in bw.itertuples()))
slot_fits = fits[fits["kernel"] == "slot"]
print("re-read cost c_re/c_u per layer: " + ", ".join(f"layer {int(r.layer)}: {r.reread_cost:.3f}"
                                                      for r in slot_fits.itertuples()))

# %% [markdown]
# ## Figure 2 and Table 1 at paper 1's breadth: four models x three formats x two engines
# Not measured by this notebook: read from a committed `benchmarks/bench_kernels.py --ggml` run
# (`breadth_csv`; docs/ggml_peer.md), moespec's kernels and llama.cpp's CPU expert operation (ggml's
# MUL_MAT_ID, with its per-slot counterpart: one call per token) in the same interleaved rounds, at
# each published shape with random weights. The paper's published rows follow ours, labelled.

# %%
breadth_rows, breadth_path = load_breadth_run(breadth_csv)
breadth = breadth_bandwidths(breadth_rows)
io.save_figure(figure2_grid(breadth, title=f"Figure 2 at paper 1's breadth, run {breadth_path.stem} ({machine})"),
               figures / "02_fig2_breadth.png")
t1_breadth = table1_breadth(breadth, source=f"moespec, measured here (run {breadth_path.stem})")
io.write_dataframe(figures / "02_table1_breadth.csv", stamp_frame(t1_breadth))
print(t1_breadth[t1_breadth.source != PAPER_LABEL].round(3).to_string(index=False))

# %% [markdown]
# ## Table 1's bandwidths with and without the discard rule

# %%
effect = discard_effect(decision)
io.write_dataframe(figures / "02_discard_effect.csv", stamp_frame(effect))
print(effect.round(4).to_string(index=False))


# %% [markdown]
# ## Figure 3, right panel: share of distinct slots U/(n·m) of windows
# The paper compares the windows its whole-model runs verified with WikiText-103 windows. Here: the
# traces available — the one timed above and every recorded trace (`paths.trace_files()`) — each labelled
# by its source. **The left panel (DRAM bytes read per union byte) needs a GPU profiler (Nsight
# Compute) and is omitted here.**

# %%
traces = [trace] + [t for t in (RoutingTrace.load(p) for p in paths.trace_files())
                    if t.label != trace.label]
shares = distinct_share(traces)
io.write_dataframe(figures / "02_fig3_distinct_share.csv", stamp_frame(shares))
fig = figure3_distinct_share(shares, title="U/(n·m) of windows (right panel of Figure 3; left panel needs a GPU profiler)")
io.save_figure(fig, figures / "02_fig3_distinct_share.png")
for r in shares.itertuples():
    print(f"distinct share n={r.n}: {r.share:.3f}  ({r.label})")


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

at2, at8 = bw[bw["n"] == 2].iloc[0], bw[bw["n"] == 8].iloc[0]
display(Markdown(
    f"**{profile} profile, {machine}.** Effective bandwidth per kernel ({spec.name}, {fmt}, "
    f"backend {rows['backend'].iloc[0]}): "
    f"r(2) = {at2['r']:.3f} against ū(2) = {at2['ubar']:.3f}, r(8) = {at8['r']:.3f} against ū(8) = {at8['ubar']:.3f}: "
    f"deduplication is {'faster' if at2['ubar'] < at2['r'] else 'slower'} at n = 2 and "
    f"{'faster' if at8['ubar'] < at8['r'] else 'slower'} at n = 8 (eq. (7): faster where ū(n) < r(n))."
    + ("" if profile == "full" else f" The quick profile times shrunk shapes for seconds; set `profile = \"full\"` for "
                                    f"{spec.name.removesuffix('-shrunk')}'s own shapes (several minutes, with a "
                                    "progress bar; an interrupted run resumes).")))
