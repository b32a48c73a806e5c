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
# # 05 — Whole-model runs: the dedup switch, verify time and speculative decoding
#
# Paper 1, Section 4 and Appendices D–E, on this engine (`moespec.engine`): a transformers MoE
# whose expert operation runs through `moespec.kernels`, one call per layer. **Dedup off**: the
# per-slot kernel for passes of up to 9 tokens; **dedup on**: the deduplicating kernel from n = 2
# (n = 1 is per-slot either way; prefill runs the deduplicating kernel either way).
#
# **The subject** (`subject = {"model": ...}`, docs/engine.md "Subjects"). By default the *byte-faithful-all* subject:
# the default MoE trained here with every expert embedded, function-preservingly, in an expert of
# OLMoE's shape in the kernels' int8 format, and its attention projections and LM head in
# OLMoE-sized matrices, so that its routing, tokens and draft acceptance are the trained models' and
# each component's share of a step's bytes is OLMoE's (`moespec.engine.widen`; `byte-faithful`
# keeps the trained attention and LM head).
# Every figure and table names the subject it was made on.
#
# 0. Where a decode step's time goes (expert operation, the rest, one drafted token), one interleaved run.
# 1. The output check of Appendix E (greedy tokens and verify argmax, dedup off and on) and, for a
#    widened subject, the same greedy tokens as the unwidened model in the same format.
# 2. Verify time tau_p(n), n = 1..9, both settings, at two context depths, in the shuffled grid
#    (each pass after an unrelated pass: the second protocol, beside the decode loops' in section 4).
# 3. Per machine state (a quiet machine, then a declared memory-bandwidth load on the other core),
#    each prediction's round model V(k) = t_draft(k) + tau_p(k + 1) + h(k) timed inside decode-loop
#    rounds on prompts the runs it predicts do not use, in one shuffled sweep with them
#    (`moespec.predict.round_model`):
#    a. speculative decoding with the oracle draft (every k x the pre-registered acceptance values,
#       dedup on) against its depth's round model;
#    b. the real draft model on MT-Bench first turns at several draft costs per token (its MLPs widened
#       function-preservingly), measured speedups beside the round model's.
# 4. The two verify protocols side by side, the goals, and the round-model file that notebooks 06 and 07
#    read and the run file of `moespec advise` carries.
#
# **Differences from the paper.** The trained model is small; the byte-faithful-all subject gives its
# experts and attention OLMoE's bytes per layer, not OLMoE's layer count (4 MoE layers, not 16; the
# LM head is sized to stand to 4 layers as OLMoE's stands to its 16). Its context
# is 256 positions, so the depths are a short one and the deepest leaving room for the generated
# tokens, not 512 and 4096. The machine is a shared 2-core CPU; every timed block carries a
# same-round reference read, and the machine state is an input (quiet, and under a declared load).
# The scoring rules were committed before any speculative run on this subject (the commit is printed below).

# %% tags=["parameters"]
profile = "quick"   # quick: seconds, for a person exploring; "full": the measurements behind figures/ (make reproduce)
device = "cpu"
seed = 0
threads = 1
backend = "auto"
subject = {}        # moespec.notebook_profiles.SubjectSpec fields, e.g. {"model": "byte-faithful", "draft_cost": 0.1}
sizes = {}          # the profile's run sizes to override, e.g. {"real_prompts": 4} (moespec.notebook_profiles.DEFAULTS)
out_dir = ""        # "": inside the run folder (paths.run_data_dir())

# %%
from moespec import paths, predict
from moespec.engine.subject import load_subject
from moespec.notebook_profiles import SubjectSpec, setup
from moespec.studies.whole_model import WholeModelStudy, run_sizes

out = setup(profile, device, threads, out_dir)
spec = SubjectSpec.from_dict(subject)
sub = load_subject(profile=profile, device=device, backend=backend, seed=seed, **spec.args())
rules = predict.load_rules(sub.rules_file)
rules_prov = predict.rules_provenance(sub.rules_file)
P, from_profile = run_sizes(profile, sizes, sub, rules)
study = WholeModelStudy(sub, P, out, paths.ensure(paths.figures_dir()), profile, device=device, seed=seed,
                        backend=backend, dtype=spec.dtype)
print(f"subject: {sub.label}")
for key, value in sub.description.items():
    print(f"  {key}: {value}")
print(f"profile={profile}, device={device}, torch threads={threads}, backend={backend}, results -> {out}")
print(f"run sizes: {P}; from the {profile} profile: {from_profile}")
print(f"scoring rules {rules_prov['path']}: commit {rules_prov['commit']} at {rules_prov['committed_at']}, "
      f"unchanged on disk: {rules_prov['unchanged']}; pre-registered for this subject: {sub.preregistered}")

# %% [markdown]
# ## 0. Where a decode step's time goes (one interleaved run)

# %%
study.breakdown()

# %% [markdown]
# ## 1. Same output with deduplication off and on (Appendix E's check), and the same function as unwidened

# %%
study.agreement()

# %% [markdown]
# ## 2. Verify time tau_p(n) in the shuffled grid
#
# Each repetition times the 18 (n, kernel) passes and a 256 MiB reference read in a fresh random
# order, the cache cropped back after every pass: a pass follows an unrelated one. Section 4 sets
# these beside the same passes timed inside decode loops.

# %%
study.verify_grid()

# %% [markdown]
# ## 3. Per machine state: the runs and the round calibration that predicts them
#
# **a. The oracle draft** (every k x acceptance value, dedup on), measured against G_a(k) V(0) / V(k).
# Its round model comes from teacher-forced decode loops (the oracle draft at acceptance 1 and
# k = n - 1: every verify pass holds n tokens and follows the previous round's) at each depth, on
# prompts the oracle runs do not use, in one shuffled order with the oracle runs of their depth, so
# both meet the same stretch of the machine. They give each term of
# V(k) = t_draft(k) + tau_p(k + 1) + h(k) with a 95 % interval.
#
# **b. The real draft** at every draft cost and k. Its round model comes from MT-Bench turns the
# test turns do not use (with the per-slot kernel too, for the draft as trained), run in one
# shuffled sweep with the test turns. Measured speedup against the median over prompts of each
# prompt's E_p(k) V(0) / V_p(k), E_p(k) the tokens per step the prompt's runs measured (a real
# draft's acceptance is not geometric; the geometric G_a(k) is shown beside it), V_p(k) with the
# prompt's own routing and catch-up share. Before any of it, each run is taken to its sweep's
# typical machine state by the two same-round reads that bracket it and its neighbours in time
# (`moespec.runstats.machine_adjust`); the files keep the runs as measured.

# %%
from IPython.display import display

for state in P["states"]:
    display(study.oracle_runs(state))
    display(study.real_draft(state))

# %% [markdown]
# ## 4. The two protocols side by side, the goals, and the round-model file

# %%
study.finish(rules_prov, subject_args=spec.args(), from_profile=from_profile, threads=threads,
             subject_kind=sub.kind)


# %% [markdown]
# ## What this shows
# (computed from this run's outputs above)

# %%
from IPython.display import Markdown, display

display(Markdown(study.summary()))
