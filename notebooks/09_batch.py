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
# # 09 — Speculation under concurrency: the batch-size axis
#
# Both papers stop at one sequence; a serving engine decodes B sequences together. Each round every
# sequence drafts k tokens and the target verifies all of them in one pass of n = B(k + 1) tokens
# (`moespec.engine.batch_speculative`): attention per sequence, every MoE layer's expert operation over
# the whole batch's tokens (deduplicating kernel from n = 2), each sequence accepting its own drafts.
# Paper 1's byte model says what such a pass reads: the dense weights once, each sequence's cache, and
# the **union** of the experts all B(k + 1) tokens route to (`moespec.theory.batch`). MoESD (arXiv
# 2505.19645) argues that an MoE gains more from speculation at medium batch, because once a batch
# touches most experts, drafted tokens hit experts already being read. This notebook measures that on
# the subject, and checks the round model's prediction of it at every (B, k):
#
# 0. The routing of the prompts' greedy continuations: the union share U/N against the tokens of a
#    pass, for one sequence's window and for B sequences, and the union ratio U(B, k + 1) / U(B, 1),
#    the experts a k-draft pass reads over a plain pass at the same B.
# 1. Per machine state (a quiet machine, then a declared memory-bandwidth load on the other core), one
#    interleaved run: every repetition runs each (B, k) cell's batched speculative decoding and one block
#    of the round terms (the verify pass at n = B(k + 1), and the draft when it is the real draft) in a
#    shuffled order.
# 2. The throughput per sequence relative to plain decoding at the same B, predicted
#    G(k) V(0, B) / V(k, B) (V = verify + draft + host, G(k) at the runs' measured acceptance) against
#    measured; the measured best k per B against k*(B), the schedule an engine takes per batch size; and
#    whether the speedup first rises with B.
#
# **The subject** is notebook 05's (`subject = {"model": ...}`); the draft is the oracle draft at
# acceptance `a` per sequence (`sizes = {"draft_kind": "real"}`: the subject's own draft, batched).

# %% tags=["parameters"]
profile = "quick"   # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce)
device = "cpu"
seed = 0
threads = 1
backend = "auto"
subject = {}        # moespec.notebook_profiles.SubjectSpec fields, e.g. {"model": "byte-faithful"}
sizes = {}          # the profile's run sizes to override, e.g. {"reps": 3} (moespec.notebook_profiles.DEFAULTS)
out_dir = ""        # "": inside the run folder (paths.run_data_dir())

# %%
from pathlib import Path

from moespec import paths
from moespec.engine.subject import load_subject
from moespec.notebook_profiles import SubjectSpec, setup
from moespec.studies.batch_axis import BatchAxisStudy, run_sizes

setup(profile, device, threads, out_dir)
out = paths.ensure(Path(out_dir) if out_dir else paths.run_data_dir() / "batch" / profile)
spec = SubjectSpec.from_dict(subject)
sub = load_subject(profile=profile, device=device, backend=backend, seed=seed, **spec.args())
P, from_profile = run_sizes(profile, sizes)
study = BatchAxisStudy(sub, P, out, paths.ensure(paths.figures_dir()), profile, device=device, seed=seed)
print(f"subject: {sub.label}")
print(f"profile={profile}, device={device}, torch threads={threads}, backend={backend}, results -> {out}")
print(f"run sizes: {P}; from the {profile} profile: {from_profile}")

# %% [markdown]
# ## 0. The union of the experts B sequences route to
#
# One sequence's window of n consecutive tokens reuses experts along the text (paper 1's rho); B
# sequences x n/B tokens each share experts only as often as independent requests do. The union share
# of a pass is what the deduplicating kernel reads.

# %%
study.routing()

# %% [markdown]
# ## 1. Per machine state: the batched runs and the round terms, interleaved
#
# Each cell decodes the first B prompts together until every sequence holds `n_tokens` tokens, after a
# reference read (its bandwidth is in the rows). A pass's experts, and so its time, depend on the tokens
# it holds, so each block of round terms times its rounds at its share of `term_positions` places spread
# over the runs' text (each cache holding the prompt and the text up to there, cropped back before each
# call), with the oracle's drafts there (the text's next tokens, each replaced as the oracle replaces
# it), in the same shuffled order as the runs; a term is the mean over the places.

# %%
from IPython.display import display

for state in P["states"]:
    display(study.run_state(state))

# %% [markdown]
# ## 2. Predicted against measured, the best k per B, and the rise with B

# %%
study.finish()

# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

display(Markdown(study.summary()))
