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
# # 08 — The answer: which expert kernel, from which pass size, and which draft length
#
# `moespec.advise` on this run's **run file** (`moespec_run.json`), which holds everything the
# answer needs from the run: notebook 05's **round models** (every term of a round,
# V(k) = t_draft(k) + tau_p(k + 1) + h(k), timed inside decode loops, with its 95 % interval; the
# run's own draft), the engine's eps and read bandwidth per machine state, and the acceptance and
# speedups the real-draft runs measured; a run without notebook 05 holds notebook 03's fits of the
# expert operation instead (paper 1, Sections 3–4). It decides first at the run's own measured
# acceptance profile (the real-draft runs' tokens per step at every draft length, no geometric
# assumption), then at the what-if rates of `acceptance` (geometric acceptance assumed, said so).
# For each acceptance it gives the pass
# size from which the deduplicating kernel is faster (with the saving's interval), the best draft
# length k*(a) per kernel with its predicted speedup and its band at every k (bound (21) with the
# round model's delta_k), the share of throughput a wrong choice loses, the answer in every machine
# state the run measured, and settings for vLLM, SGLang and llama.cpp. The same answer comes from
# the command line: `moespec advise RUN_FOLDER` (the run's profile), `-a 0.5 0.7 0.9` (what-if),
# `--acceptance-from FILE` (an engine's metrics, logs or responses); `--explain` for the derivation.
#
# With `run_folder = ""` the notebook builds the run file from the tables this run wrote and reads
# it; when they give no decision (a notebook opened on its own, without notebooks 03/05, or
# quick-profile fits that err beyond the bounds on a busy machine) it says why and reads the
# committed full run's run file in `figures/`. A `run_folder` without a run file gets one built
# from its tables.

# %% tags=["parameters"]
profile = "quick"        # this notebook computes nothing heavy; the profile is that of the run it reads
device = "cpu"
seed = 0
run_folder = ""          # empty: this run's tables (else the committed full run's figures/)
acceptance = [0.5, 0.7, 0.9]   # what-if rates (geometric acceptance assumed), after the run's measured profile
draft_fit = ""           # another draft: "A,B" for A k + B ms per round; empty: the draft of the run (measured)
free_draft = False       # True: take the draft as free (the theory's idealization; only when asked for)
dense_ratio = None       # dense bytes per pass / (m W) where the run has no round models (notebook 03's fits); None: 0.5

# %%
from pathlib import Path

from IPython.display import Markdown, display

from moespec import advice, io, paths
from moespec.advice.figure import advice_figure
from moespec.predict.run_file import ensure_run_file
from moespec.validate.run_identity import stamp_frame

figures = paths.ensure(paths.figures_dir())
options = dict(draft_fit=draft_fit or None, free_draft=free_draft, dense_ratio=dense_ratio)
source = Path(run_folder) if run_folder else figures
try:
    print("run file:", ensure_run_file(source, rebuild=not run_folder, error=advice.AdviceInputError))
    result = advice.advise(source, acceptance, with_run_profile=True, **options)
except advice.AdviceInputError as refused:
    if run_folder:
        raise
    print(f"this run's tables give no decision ({refused}); reading the committed full run's run file instead")
    source = paths.committed_figures_dir()
    result = advice.advise(source, acceptance, with_run_profile=True, **options)
print(advice.format_text(result))
print("written:", advice.write_json(result, figures / "08_advice.json"))

# %% [markdown]
# ## advise beside what the run measured
#
# At the run's own measured acceptance profile (notebook 05's real-draft runs, per machine state),
# the speedup advise predicts at every draft length, with its band, against the speedup those runs
# measured with the same draft; whether advise recommends what the run measured best; and the
# regret: the share of the measured best speedup lost by running advise's k, with its interval from
# the repetitions (paired bootstrap), beside the regret of the geometric answer at the measured a.
# (A run file without the real-draft runs' acceptance skips this.)

# %%
if advice.run_file(source).doc["acceptance"] and not free_draft and not draft_fit:
    check, regret, check_goals = advice.measured.against_runs(source, dense_ratio=dense_ratio)
    io.write_dataframe(figures / "08_advise_vs_measured.csv", stamp_frame(check))
    io.write_dataframe(figures / "08_advise_regret.csv", stamp_frame(regret))
    io.write_dataframe(figures / "08_goals.csv", stamp_frame(check_goals))
    display(check.round(3))
    display(regret.round(4))
    display(check_goals)
else:
    print(f"{source}: no real-draft acceptance in the run file (or another draft was named); "
          "nothing measured to compare")

# %% [markdown]
# ## The answer as a figure

# %%
fig = advice_figure(result)
io.save_figure(fig, figures / "08_advice.png")

# %% [markdown]
# ## What this shows

# %%
kd, best = result["dedup"], result["acceptance"]
display(Markdown(
    f"**{result['subject']['model']}**, {result['subject']['engine']}, from {result['subject']['from']} "
    f"({result['subject']['source']}). "
    + (f"Deduplication pays from **n = {kd['from_n']}** tokens per pass (guaranteed by bound (18) from "
       f"n = {kd['guaranteed_from_n']}). " if kd["from_n"] else "Deduplication does not pay at any pass size up to 9. ")
    + " ".join((f"At the run's measured acceptance profile: " if x.get("acceptance_model") == "profile"
                else f"At a = {x['a']:.2f} (geometric): ") + (f"draft **k = {x['recommended']['k']}** "
                                            f"({x['recommended']['engine_name']}), predicted speedup "
                                            f"{x['recommended']['speedup']:.2f} [{x['recommended']['speedup_lo']:.2f}, "
                                            f"{x['recommended']['speedup_hi']:.2f}]; "
                                            if x["recommended"]["speculate"] else "plain decoding is fastest; ")
               + f"the per-slot kernel alone would lose {100 * x['loss_if_wrong']['per_slot_kernel_only']:.1f} % of "
                 "the throughput." for x in best)
    + f" Assumptions: {'; '.join(result['assumptions'])}."))
