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
# # 07 — Paper 2: the verification-cost regression and the sequence-conditioned Bellman oracle
#
# Paper 2 ("The Limits of Speculation") on a subject of `moespec.engine.subject` (`subject`; by
# default the byte-faithful-all subject: the default MoE trained here with its experts embedded in
# OLMoE-shaped int8 experts and its attention and LM head in OLMoE-sized int8 matrices, and the draft trained here, whose token costs a small share of a
# target step: the regime of paper 2's EAGLE-3 draft). Every figure and table names the subject.
#
# 1. **Rounds**: speculative runs (the engine's loop, greedy verification, K = 0..8 in the full profile) on
#    Spec-Bench first turns; per round T_T, T_D, m = K + 1, Ubar_r (eq. 5), context L, generation, category,
#    and the bandwidth of a reference read taken before the round's generation (its regime).
# 2. **Cost regression** per bandwidth regime and over all rows: eq. (4), per-K fits (Table A4),
#    (A3), (A4); clustered standard errors; GroupKFold(5) by generation; Table A2's factors.
# 3. **Oracle**: junk tails (Section 4.2), Cost(i, k, a), the Bellman equation (8), on the target's
#    greedy text for the first questions of each Spec-Bench category (`oracle_categories`, the
#    profile's number per category; paper 2 ran its oracle on math reasoning and its Appendix B on
#    39 responses across categories).
# 4. **Analysis per cost model and per transition model** (`moespec.oracle.analysis.analyse_transitions`):
#    the oracle, the Lmax sweep (Figure 2), delta space (Figure 3), the alpha = 0 ablation, the
#    online early-exit policy on held-out sequences, and paper 1's per-kernel cost; for the round
#    model's cost (notebook 05's round model, when this run has one: the draft's, verify pass's and
#    host's time per round measured in decode loops, moved by the regression's alpha and c), the
#    fitted cost model of each regime, and as a sensitivity analysis for a draft `draft_scale` times
#    as expensive; each under paper 2's surrogate transitions (p = P_draft(reference token)) and the
#    greedy-exact ones (p = 1 exactly when the draft's argmax is the reference token: what this
#    engine's greedy verification of its greedy draft accepts).
# 5. **Measured fixed-K rounds beside both oracles**: the rounds' own speedup per K with a bootstrap
#    interval over generations.
#
# The computation and the files each section writes are `moespec.studies.ssp_oracle.SspOracleStudy`'s;
# this notebook calls its sections in order and shows what each found.
#
# **Differences from the paper.** Target and draft are small models trained here (context 256;
# the byte-faithful-all target reads OLMoE's expert and attention bytes), not Qwen3-Coder-30B-A3B with EAGLE-3; the
# engine is moespec's on a shared 2-core CPU, not vLLM on an A100. Paper 2's published scalars are
# shown beside ours, labelled as theirs; they are never inputs.

# %% tags=["parameters"]
profile = "quick"       # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce passes it)
device = "cpu"
seed = 0
threads = 1
untimed_threads = 0   # torch threads for work not timed (reference text, junk tails); 0: every core
backend = "auto"
subject = {}        # moespec.notebook_profiles.SubjectSpec fields, e.g. {"model": "replay"}; {}: the default subject
oracle_a = 0.7             # the oracle draft's acceptance, for a subject without a draft model
oracle_categories = None   # None: the profile's categories (full: every Spec-Bench category); a list names them
lmax = None                # None: the profile's longest draft of the oracle (quick 4, full 12)
draft_scale = 0.1          # the sensitivity analysis: the draft's time times this
reuse = None               # None: the profile's (full: reuse this run's recorded rounds and junk tails)
out_dir = ""           # "" : inside the run folder (paths.run_data_dir())

# %%
from pathlib import Path

from IPython.display import Markdown, display

from moespec import paths
from moespec.engine.subject import load_subject
from moespec.notebook_profiles import SubjectSpec, resolve, setup
from moespec.studies.ssp_oracle import SspOracleStudy

setup(profile, device, threads)
out = Path(out_dir) if out_dir else paths.run_data_dir() / "oracle" / profile
sub = load_subject(profile=profile, device=device, backend=backend, seed=seed, **SubjectSpec.from_dict(subject).args())
P, from_profile = resolve("07", profile, oracle_categories=oracle_categories, lmax=lmax, reuse=reuse)
study = SspOracleStudy(sub, P, out, paths.ensure(paths.figures_dir()), profile, device=device, seed=seed,
                       threads=threads, untimed_threads=untimed_threads, backend=backend, oracle_a=oracle_a,
                       draft_scale=draft_scale)
print("\n".join(study.describe()))
print(f"run sizes {study.P}; from the {profile} profile: {from_profile}; results -> {out}")

# %% [markdown]
# ## 1. Round records from speculative runs
#
# Every K on every question, each round's draft and verification times, its union Ubar_r and the
# read bandwidth before its generation; the bandwidth regimes split the rounds where the reads
# fall into two groups.

# %%
study.rounds()

# %% [markdown]
# ## 2. Cost regression: eq. (4), Table A4, (A3), (A4), Table A2 — per bandwidth regime and over all rows
#
# The headline fit is the dominant regime's (all rows where the reads form one regime); Figure 1
# and Figure A6 draw its rounds.

# %%
study.regression()

# %% [markdown]
# ## 2b. Appendix A: by category, the pooled form's transfer, robustness
#
# Paper 2's Appendix A on the headline regime's speculative rounds (K >= 1; the rows of the
# headline fit above). A category enters a per-category table only with at least
# `moespec.oracle.categories.MIN_GENERATIONS` generations (and, for eq. (4) within the category,
# `MIN_GENERATIONS_PER_K` at every K); the others are rows with the reason. Paper 2's published
# values stand beside ours in each table, labelled as theirs. Tables A1 and A3, Figure A1:

# %%
study.factors_by_category()

# %% [markdown]
# Table A5 and Figures A3, A4: eq. (4), T_T ~ Ubar x C(K) + L, within each category.

# %%
study.model_by_category()

# %% [markdown]
# Figure A5 and leave-one-K-out: the pooled form (A3) with a linear K, per K and on a K it has not seen.

# %%
study.budget_transfer()

# %% [markdown]
# Table A7 and Figure A7 on the largest-K rounds (OLS, clustered bootstrap, Huber, 1 % trimming, run
# halves, leave-one-category-out), the Breusch-Pagan test, binned residuals and A.9's ladder.

# %%
study.robustness()

# %% [markdown]
# ## 3. The oracle's inputs: reference sequences and junk tails (Section 4.2)
#
# From the same draft distribution the junk tails record, per position, paper 2's surrogate
# p = P_draft(reference token | reference prefix) and the greedy indicator g (1 when the draft's
# argmax is the reference token): under the engine's greedy verification a greedy draft's token is
# accepted exactly when g = 1 (and every token before it was). Half of the sequences are held out
# for the online early-exit policy.

# %%
study.oracle_inputs()

# %% [markdown]
# ## 4. The analysis per cost model and per transition model: measured per regime, and the sensitivity to a cheaper draft
#
# Every cost model is solved twice over the same unions and costs: with paper 2's surrogate
# transitions and with the greedy-exact ones (`analyse_transitions`); each table has a column
# `transitions`. The oracle's headline cost model is notebook 05's round model when this run has
# one (its levels, moved by the regression's alpha and c), else the headline fit.

# %%
study.analyses()

# %% [markdown]
# ## 5. Figures 2 and 3, the online policy, and the measured fixed-K rounds beside both oracles
#
# The measured speedup of a fixed K: tokens per round (accepted + 1) over the round's draft,
# verification and host time, against the K = 0 rounds' time per token, with a bootstrap interval
# over generations (`moespec.oracle.rounds.fixed_k_speedups`).

# %%
study.figures()

# %% [markdown]
# ## 5b. Appendix B: where the oracle stops on our text
#
# Each reference token gets one local context label from the decoded text
# (`moespec.oracle.boundaries.classify`: script change, code-prose transition, paragraph / heading,
# code formatting, markup / formula, sentence boundary, word continuation, prose vocabulary); a
# decision's context is that of its first drafted token. Per label, the share of k* = 1, of k* >= 4
# and the mean k* (Figure B3), new experts at script changes and at the first mismatch (Figure B5),
# the alpha = 0 cases (Figure B4) and a gallery chosen by rules in `moespec.oracle.gallery`, with
# 95% clustered bootstrap intervals over responses, for the headline cost model under both
# transition models. Paper 2 uses Lmax = 8; this is notebook 07's `lmax`. A label our text lacks
# (WikiText-trained models write no code or Cyrillic) is reported with 0 positions.

# %%
study.appendix_b()

# %% [markdown]
# ## 6. Ours beside paper 2's published scalars (theirs: A100, Qwen3-Coder-30B-A3B + EAGLE-3, vLLM)
#
# Like for like: our per-K fits beside the paper's per-K ranges (Section 3.5), our fits pooled over
# K beside the paper's full-pool values (Appendix A.7-A.9), Appendix A's values read back from
# section 2b's files; then every paper 2 item with our file and whether ours agrees, and the goals.

# %%
study.comparison()


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
display(Markdown(study.summary()))
