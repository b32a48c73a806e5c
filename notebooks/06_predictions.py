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
# # 06 — The prediction chain against the whole-model runs (Tables 3, 4, 7, 8; Figures 4, 5, 6)
#
# Paper 1, Section 4 and 4.4, on the subject of notebook 05's run (read from its `run.json`; the
# `subject` fields here, when set, must match it). The expert operation of each of the engine's
# own layers (its real weights; for the byte-faithful subject the embedded experts at the
# published shape) is timed alone by `moespec.measure` on passes with chosen ids and on windows of
# recorded WikiText routing; `moespec.fit` fits (4) and (E.1) and gives the bandwidth error eps.
# Then eq. (22) turns per-layer operation times into whole-model verify times:
#
# * **prediction** (wiki): the fits evaluated at the union bytes of the WikiText windows;
# * **text**: the fits at the union bytes of the text the whole-model runs verified;
# * **measured-time**: the measured median operation time on each WikiText window;
# * **calibrated**: measured-time plus the measured growth with n outside the expert operation.
#
# They are compared with notebook 05's measurements (run notebook 05 with the same profile first),
# which none of them used (the calibrated version uses the dedup-off verify time by construction):
# the verify times of notebook 05's **round model** (passes timed inside decode loops, the state a
# round leaves the machine in) and its draft and host time per round, so that the measured and
# every predicted step time share every term but the verify pass. Machine states: the expert
# operation is timed in each state notebook 05 measured (quiet, and under the declared load), and
# the chain is scored against that state's round models. The scoring rules are read unchanged from
# the subject's pre-registration file. The paper's published rows are shown beside ours as labelled
# reference data (their hardware).

# %% tags=["parameters"]
profile = "quick"   # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce)
device = "cpu"
seed = 0
threads = 1
untimed_threads = 0   # torch threads for work not timed (the fits' WikiText routing); 0: every core
backend = "auto"
subject = {}        # SubjectSpec fields that must match notebook 05's run (empty: its subject)
sizes = {}          # the profile's run sizes to override, e.g. {"wiki_docs": 40} (moespec.notebook_profiles.DEFAULTS)
out_dir = ""        # "": inside the run folder (paths.run_data_dir())

# %%
from IPython.display import Markdown, display

from moespec import paths
from moespec.engine.subject import load_subject
from moespec.notebook_profiles import SubjectSpec, resolve, setup
from moespec.studies.prediction_chain import PredictionChainStudy
from moespec.studies.whole_model import read_run

out = setup(profile, device, threads, out_dir)
spec = SubjectSpec.from_run(read_run(out)["subject_args"], subject)
sub = load_subject(profile=profile, device=device, backend=backend, seed=seed, **spec.args())
P, from_profile = resolve("06", profile, sizes)
study = PredictionChainStudy(sub, P, out, paths.ensure(paths.figures_dir()), profile, device=device, seed=seed,
                             backend=backend, untimed_threads=untimed_threads)
print(f"subject: {sub.label}")
print(f"whole-model runs of notebook 05: {out}; machine states {study.states}; run sizes {P}, from the {profile} "
      f"profile: {from_profile}")
print(f"scoring rules read unchanged from commit {study.rules_prov['commit']} (sha256 "
      f"{study.rules_prov['sha256'][:16]}..., file identical to the commit: {study.rules_prov['unchanged']}); "
      f"pre-registered for this subject: {sub.preregistered}")

# %% [markdown]
# ## The expert operation alone: timing, fits (4)/(E.1) and eps, in every machine state

# %%
display(study.wiki_routing())
for state in study.states:
    display(study.bench(state))

# %% [markdown]
# ## Figure 3 (right): the distinct share of the verified text against WikiText
# Notebook 05's oracle runs record the routing of the text they verify (`routing_text_d*.npz` in
# its run folder); the WikiText routing of the same engine is the one recorded above for the fits.

# %%
display(study.distinct_share())

# %% [markdown]
# ## The chain (22) per depth and state, scored against the round model

# %%
for state in study.states:
    display(study.chain(state))

# %% [markdown]
# ## Tables 3, 4, 7 and 8 (ours first, then the paper's published rows, labelled), and Figures 4, 5 and 6

# %%
study.tables()


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
display(Markdown(study.summary()))
