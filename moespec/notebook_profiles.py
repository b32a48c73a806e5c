"""What the whole-model notebooks (05, 06, 07) share: the results folder and the CPU set-up, and
each notebook's run sizes per profile.

A notebook parameter left at ``None`` takes its profile's value (:data:`DEFAULTS`); a value the
caller set is kept as set, in either profile (:func:`resolve`), and the notebook prints which
values came from where. ``quick`` sizes finish in seconds on tiny models; ``full`` sizes are
those ``make reproduce`` runs. When the default subject became ``byte-faithful-all`` (issue 27:
its decode step 1.47x the byte-faithful one's on this machine's CPU), the full sizes of the real
draft (05: 6 quiet and 4 loaded prompts, 3 calibration turns), the fits' WikiText routing (06: 320
documents) and the oracle's text (07: 40 tokens per question) were cut so that ``make reproduce``
stays within 75 minutes. The real draft's precision (amendment of 2026-12-05, after the run of
2026-12-04): plain decoding runs ``plain_runs`` times per prompt and repetition of the real-draft
sweeps (every speedup of a prompt divides by its plain throughput), the test runs repeat
``real_reps`` times, and the draft's round calibration uses 5 MT-Bench turns instead of 3. Where
the real draft's calibration runs (amendment of 2026-12-05 evening): ``draft_calibration =
"interleaved"`` runs its turns in one shuffled sweep with the test turns, ``"before"`` (the earlier
protocol, selectable) in a sweep of their own before the oracle runs. The real draft's precision on
the quiet machine (amendment of 2026-12-06 c): the calibration turns run ``draft_cal_plain_runs``
plain runs each (V(0), which enters every point's prediction, rests on them) and the quiet test
runs repeat ``real_reps`` = 3 times (the loaded ones ``loaded_real_reps`` = 2 then). The loaded test
runs use as many prompts as the quiet ones, ``loaded_real_prompts`` = 6 (amendment of 2026-12-06 e),
and as many repetitions, ``loaded_real_reps`` = 3 (amendment of 2026-12-06 h: the number the loaded
noise row of the run published in 0a0f20f named). ``noise_resamples``: how often the real draft's
calibration turns are resampled to measure the prediction's own noise (:mod:`moespec.predict.noise`;
reported, it changes no prediction). The loaded state's round calibration runs
``loaded_draft_cal_prompts`` = 8 MT-Bench turns where the quiet one runs 5 (amendment of 2026-12-06
j: under the declared load the calibration's noise, not the test's, is the larger part of a
prediction's error). Amendment of 2026-12-06 l: the loaded test runs repeat ``loaded_real_reps`` =
5 times (the number the loaded noise row of the run published in d50ad8b named) and the quiet
calibration runs ``draft_cal_prompts`` = 8 turns, as many as the loaded one (its prediction's
noise, not its measurement's, was the quiet state's larger part). Where the oracle draft's depth
calibration runs (amendment of 2026-12-06 m): ``oracle_calibration = "interleaved"`` runs its
verify loops in one shuffled order with the oracle runs of their depth, ``"before"`` (the earlier
protocol, selectable) in a stretch of their own before them.
"""

from __future__ import annotations

from pathlib import Path

import torch

from moespec import paths

#: notebook -> profile -> parameter -> value (None: derived in the notebook from the subject,
#: e.g. the depths from its context, or read from the pre-registered rules).
DEFAULTS = {
    "05": {
        "quick": dict(depths=[24, 48], prompts_per_depth=3, verify_reps=3, n_boot=200, oracle_ks=[0, 1, 2, 3],
                      a_values=[0.5, 0.8, 0.95], n_tokens=10, oracle_prompts=2, oracle_reps=1, real_ks=[1, 2, 3],
                      real_tokens=6, real_prompts=2, draft_costs=[0.0, 0.3], agree_tokens=12, breakdown_reps=5,
                      ratio_reps=5, states=["quiet", "loaded"], cal_prompts=1, cal_reps=1, draft_cal_prompts=2,
                      loaded_oracle_prompts=1, loaded_oracle_reps=1, loaded_draft_costs=[0.0], loaded_real_prompts=2,
                      plain_runs=2, real_reps=3, draft_calibration="interleaved", draft_cal_plain_runs=3,
                      loaded_real_reps=2, noise_resamples=10, loaded_draft_cal_prompts=2,
                      oracle_calibration="interleaved"),
        "full": dict(depths=None, prompts_per_depth=5, verify_reps=4, n_boot=2000, oracle_ks=list(range(9)),
                     a_values=None, n_tokens=32, oracle_prompts=2, oracle_reps=1, real_ks=list(range(1, 9)),
                     real_tokens=32, real_prompts=6, draft_costs=None, agree_tokens=48, breakdown_reps=15,
                     ratio_reps=10, states=["quiet", "loaded"], cal_prompts=3, cal_reps=1, draft_cal_prompts=8,
                     loaded_oracle_prompts=1, loaded_oracle_reps=1, loaded_draft_costs=[0.0, 0.2],
                     loaded_real_prompts=6, plain_runs=4, real_reps=3, draft_calibration="interleaved",
                     draft_cal_plain_runs=12, loaded_real_reps=5, noise_resamples=200,
                     loaded_draft_cal_prompts=8, oracle_calibration="interleaved"),
    },
    "06": {
        "quick": dict(wiki_docs=3, context=32, bench_reps=2, u_count=3, windows_per_n=2, flush_bytes=2**20,
                      membw_bytes=2**22, loaded_bench_reps=2),
        "full": dict(wiki_docs=320, context=None, bench_reps=3, u_count=6, windows_per_n=6, flush_bytes=None,
                     membw_bytes=None, loaded_bench_reps=2),
    },
    "07": {
        "quick": dict(round_questions_per_category=1, round_categories=5, round_tokens=8, round_ks=[0, 1, 2, 3, 4, 5],
                      repeats=1, prompt_tokens=8, oracle_questions=2, oracle_categories=["math_reasoning", "coding"],
                      oracle_tokens=12, lmax=4, reuse=False),
        "full": dict(round_questions_per_category=2, round_categories=None, round_tokens=32,
                     round_ks=list(range(9)), repeats=2, prompt_tokens=96, oracle_questions=3, oracle_categories=None,
                     oracle_tokens=40, lmax=12, reuse=True),
    },
}


def resolve(notebook: str, profile: str, **given) -> tuple[dict, list[str]]:
    """(values, from_profile): every parameter of ``notebook``'s :data:`DEFAULTS` as ``given``
    where it is not None, else the profile's value; ``from_profile`` names the parameters that
    took the profile's value. Unknown parameters are refused."""
    if profile not in ("quick", "full"):
        raise ValueError(f"profile must be 'quick' or 'full', found {profile!r}")
    table = DEFAULTS[notebook][profile]
    if unknown := set(given) - set(table):
        raise ValueError(f"notebook {notebook}: no profile default for {sorted(unknown)}; known {sorted(table)}")
    values, defaulted = {}, []
    for name, default in table.items():
        value = given.get(name)
        if value is None:
            values[name] = default
            defaulted.append(name)
        else:
            values[name] = value
    return values, defaulted


def setup(profile: str, device: str, threads: int, out_dir: str = "") -> Path:
    """Check the profile and device, set torch's threads (one thread: batch-one passes on a
    shared CPU, where more threads wait on descheduled ones), and return the results folder
    (``out_dir`` or ``<run data>/engine/<profile>``, see :func:`moespec.paths.run_data_dir`)."""

    if profile not in ("quick", "full"):
        raise ValueError(f"profile must be 'quick' or 'full', found {profile!r}")
    if not (device == "cpu" or device.startswith("cuda")):
        raise ValueError(f"device must be 'cpu' or 'cuda[:i]', found {device!r}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: torch sees no CUDA device here")
    torch.set_num_threads(int(threads))
    return Path(out_dir) if out_dir else paths.run_data_dir() / "engine" / profile


def default_depths(context: int, n_tokens: int) -> list[int]:
    """The two context depths of the whole-model runs: a quarter of the context and the deepest
    that leaves room for ``n_tokens`` generated tokens and a draft of 9 (paper 1 used 512 and 4096)."""
    deep = context - n_tokens - 10
    if deep <= context // 4:
        raise ValueError(f"a context of {context} positions leaves no room for two depths with {n_tokens} tokens")
    return [context // 4, deep]
