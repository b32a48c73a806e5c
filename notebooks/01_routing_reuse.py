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
# # 01 · Expert reuse of consecutive tokens (paper 1, Section 2, Figure 1)
#
# For each routing trace: the layer mean of $\hat\rho_l(n)$, the share of a token's $m$ experts
# that one of the $n-1$ tokens before it also selected (eq. (1), estimator of Appendix D.2), with
# document-level bootstrap bands, beside the uniform-routing curve $1-q^{n-1}$, $q = 1-m/N$.
# The table gives $\hat\rho(2)$, $\hat\rho(9)$ and the byte share $\bar u(n) = E_\text{dedup}(n)/E_\text{slot}(n)$
# at $n = 2, 8$, with the per-layer expert bytes $w_l$ of each model's format.
#
# **Until recorded traces exist, the traces here are synthetic**: a sticky routing process with the
# shape (N, m, L, $w_l$) of OLMoE, Qwen3 and gpt-oss, *calibrated to paper 1's published layer-mean
# $\rho(2)$ and $\rho(9)$*. Their $\hat\rho(2)$ and $\hat\rho(9)$ therefore reproduce the calibration
# targets by construction and are not a measurement; the shape of the curve between them and
# $\bar u(n)$ follow from the process. The published values are drawn as labelled reference points.
# Any trace saved as `*.npz` in the run's `data/traces/` or the shared `data/traces/` (e.g. by
# `moespec.routing.record`; `paths.trace_files()`) is loaded and shown beside them, labelled by its
# `source`, and so is `trace_file` (e.g. a trace imported from vLLM or SGLang with
# `moespec import-routing`).
#
# **Your own model** (`model` = a checkpoint folder): its routing is recorded on the WikiText test
# articles and saved into the run's `data/traces/`, where notebooks 02 and 03 of the same run find it
# and time its windows. `model` = the model's `config.json` (or a folder holding only it) with
# `trace_file` = an engine's routing: the trace must have the config's shape (L, N, m), else it is refused.

# %% tags=["parameters"]
profile = "quick"       # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce passes it)
device = "cpu"          # statistics run on the CPU; kept for the common notebook interface
seed = 0
model = "synthetic"     # "synthetic": OLMoE, Qwen3 and gpt-oss; a preset name: that one; "none": recorded only;
                        # a local transformers MoE checkpoint (folder or cached hub name): recorded on the WikiText
                        # test articles on `device` and saved into the run (its 32 fit articles are shown);
                        # a config.json without weights: the shape trace_file must have
resamples = 2000        # document-level bootstrap resamples (paper 1, App. D.2)
n_max = 9
calibrate_n9 = True     # calibrate the synthetic traces to rho(9) as well as rho(2)
load_recorded = True    # also show the saved traces (paths.trace_files(): the run's, then data/traces/*.npz)
recorded_split = "test"  # which saved traces: "test" (cut to the 32 fit articles, as Figure 1), "valid", or "all"
trace_file = ""         # also show this trace file (e.g. one `moespec import-routing` wrote from vLLM/SGLang)

# %%
import numpy as np
from tqdm.auto import tqdm

from moespec import io, paths
from moespec.model_shapes import PRESETS, get_spec
from moespec.validate.invariants import check_trace_shape
from moespec.plots.routing import figure1_reuse
from moespec.routing import RoutingTrace, synthetic
from moespec.routing.published import published_reuse, reuse_targets
from moespec.tables.routing import reuse_curves, reuse_table
from moespec.zoo import sources
from moespec.validate.run_identity import stamp_frame

if profile not in ("quick", "full"):
    raise ValueError(f"profile must be 'quick' or 'full', found {profile!r}")
num_docs, doc_len = {"quick": (6, 300), "full": (60, 4096)}[profile]
resamples = resamples if profile == "full" else min(resamples, 200)
checkpoint = model not in ("synthetic", "none") and model.lower() not in PRESETS
shape_only = checkpoint and not sources.has_weights(model)   # a config.json: the model's shape, no weights
if shape_only and not trace_file:
    raise ValueError(f"model={model!r} is a config.json without weights: give trace_file= (the model's routing, e.g. "
                     "from `moespec import-routing`), or model= a checkpoint folder with its weights to record")
synthetic_models = [] if checkpoint else {"synthetic": ["olmoe", "qwen3", "gpt-oss"], "none": []}.get(model, [model])
published = published_reuse()
print(f"profile={profile}: {num_docs} documents x {doc_len} tokens per synthetic trace, "
      f"{resamples} bootstrap resamples, seed={seed}")
if checkpoint:
    spec = get_spec(model)
    print(f"model {spec.name} ({spec.source}): L = {spec.num_moe_layers} MoE layers, N = {spec.num_experts} experts, "
          f"m = {spec.top_k} per token, H = {spec.hidden_size}, I = {spec.expert_intermediate}, "
          f"{spec.default_format}; " + ("no weights: routing from trace_file" if shape_only else
                                        f"recording 60 articles x {64 if profile == 'quick' else 'all'} tokens"))

# %% [markdown]
# ## Traces: synthetic (calibrated to the published values) and any recorded ones

# %%
traces = []
for i, name in enumerate(tqdm(synthetic_models, desc="synthetic traces")):
    spec = get_spec(name)
    targets = reuse_targets(name, published)
    targets = targets if calibrate_n9 else {2: targets[2]}
    print(f"{spec.paper_label}: calibration targets (paper 1, published) {targets}")
    traces.append(synthetic.calibrated(spec, targets, num_docs, doc_len, seed=seed + i))
own = None
if checkpoint and not shape_only:  # moespec.zoo.sources.record_checkpoint: raw WikiText test articles, context pieces
    own, what = sources.checkpoint_trace(model, device, max_tokens=None if profile == "full" else 64)
    print(f"{own.label}: {what}")
if load_recorded:
    traces += [t for t in sources.saved_traces(None if recorded_split == "all" else recorded_split)
               if own is None or t.path != own.path]
if trace_file:
    given = RoutingTrace.load(trace_file)
    if checkpoint:   # the trace is of this model: its shape (L, N, m) or refused
        check_trace_shape(given, spec, f"{spec.name} ({spec.source})")
    traces.append(given)
if own is not None:
    traces.append(sources.fit_subset(own))
if not traces:
    raise ValueError("no traces: set model to 'synthetic' or a preset, give trace_file, or record traces into "
                     f"{[str(d) for d in paths.trace_dirs()]}")
for tr in traces:
    print(tr)

# %% [markdown]
# ## Figure 1: layer-mean $\hat\rho(n)$ with bootstrap bands

# %%
curves = reuse_curves(traces, n_max=n_max, resamples=resamples, seed=seed)
title = "Layer-mean reuse rho_hat(n)"
if synthetic_models:
    title += ("\n'synthetic' traces are calibrated to paper 1's published rho(2)"
              + (" and rho(9)" if calibrate_n9 else "") + " (not a measurement); the others are recorded")
fig = figure1_reuse(curves, published=published, title=title)
fig_path = io.save_figure(fig, paths.figures_dir() / "01_fig1_reuse.png")
io.write_dataframe(paths.figures_dir() / "01_fig1_reuse_data.csv", stamp_frame(curves))
print(f"figure: {fig_path}")

# %% [markdown]
# ## Table: $\hat\rho(2)$, $\hat\rho(9)$, $\bar u(2)$, $\bar u(8)$ per trace (95% bootstrap intervals)

# %%
table = reuse_table(traces, resamples=resamples, seed=seed, published=published)
table_path = io.write_dataframe(paths.figures_dir() / "01_table_reuse.csv", stamp_frame(table))
print(f"table: {table_path}")
for _, r in table[table["tokens"].notna()].iterrows():
    print(f"{r['source']}: rho_hat(2) = {r['rho_hat_2']:.4f} [{r['rho_hat_2_low']:.4f}, {r['rho_hat_2_high']:.4f}], "
          f"rho_hat(9) = {r['rho_hat_9']:.4f} [{r['rho_hat_9_low']:.4f}, {r['rho_hat_9_high']:.4f}], "
          f"ubar(2) = {r['ubar_2']:.4f}, ubar(8) = {r['ubar_8']:.4f}, uniform m/N = {r['uniform_m_over_N']:.4f}")
table


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

rec = table[table["tokens"].notna()]
display(Markdown(
    f"**{profile} profile.** Layer-mean reuse ρ̂(n), the share of a token's experts already chosen by one of the "
    f"n − 1 tokens before it: " + "; ".join(f"{r['source']}: ρ̂(2) = {r['rho_hat_2']:.3f}, ρ̂(9) = {r['rho_hat_9']:.3f}, "
                                           f"byte share ū(8) = {r['ubar_8']:.3f}" for _, r in rec.iterrows())
    + ". Reuse above the independent-uniform curve is routing memory that deduplication can turn into fewer bytes."
    + ("" if profile == "full" else " Set `profile = \"full\"` for 60 documents of 4096 tokens and 2000 bootstrap resamples.")))
