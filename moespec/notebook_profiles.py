"""What the whole-model notebooks (05, 06, 07) share: the results folder and the CPU set-up, the
subject they run on (:class:`SubjectSpec`), and each notebook's run sizes per profile.

A notebook's sizes are its profile's (:data:`DEFAULTS`), overridden by the ``sizes`` dict a caller
passes (:func:`resolve`); the notebook prints which values came from where. ``quick`` sizes finish
in seconds on tiny models (notebook 05 on a user's checkpoint: a minute or two), for a person
exploring and for the tests; notebook 05's quick profile drafts k = 1..8 as the full one does.
``full`` sizes are those ``make reproduce`` runs on the byte-faithful-all subject, sized so that
the whole reproduction stays within 75 minutes on a 2-core CPU:

* notebook 05's real draft: every speedup of a prompt divides by its plain throughput, so plain
  decoding runs ``plain_runs`` = 4 times per prompt and repetition and the round calibration's
  plain step V(0), which enters every prediction, rests on ``draft_cal_plain_runs`` = 12 plain runs
  per calibration turn; the test runs 6 MT-Bench turns in both machine states, 3 repetitions quiet
  and 5 loaded (where the machine's noise is larger), the calibration 8 turns in each state; the
  calibration is resampled ``noise_resamples`` = 200 times for the prediction's own noise;
* notebook 05's oracle draft: 2 prompts per depth at every k = 0..8 and every pre-registered
  acceptance, 3 calibration prompts per depth for the verify loops;
* notebook 06: the fits' routing from 320 WikiText documents;
* notebook 07: 40 tokens of reference text per Spec-Bench question, 2 questions per category for
  the measured rounds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from moespec import paths

#: notebook -> profile -> size -> value (None: derived in the notebook from the subject, e.g. the
#: depths from its context, or read from the pre-registered rules).
DEFAULTS = {
    "05": {
        "quick": dict(depths=[24, 48], prompts_per_depth=3, verify_reps=3, n_boot=200, oracle_ks=list(range(9)),
                      a_values=[0.5, 0.8, 0.95], n_tokens=10, oracle_prompts=2, oracle_reps=1,
                      real_ks=list(range(1, 9)), real_tokens=6, real_prompts=2, draft_costs=[0.0, 0.3],
                      agree_tokens=12, breakdown_reps=5, ratio_reps=5, states=["quiet", "loaded"], cal_prompts=1,
                      cal_reps=1, draft_cal_prompts=2,
                      loaded_oracle_prompts=1, loaded_oracle_reps=1, loaded_draft_costs=[0.0], loaded_real_prompts=2,
                      plain_runs=2, real_reps=3, draft_cal_plain_runs=3, loaded_real_reps=2, noise_resamples=10,
                      loaded_draft_cal_prompts=2),
        "full": dict(depths=None, prompts_per_depth=5, verify_reps=4, n_boot=2000, oracle_ks=list(range(9)),
                     a_values=None, n_tokens=32, oracle_prompts=2, oracle_reps=1, real_ks=list(range(1, 9)),
                     real_tokens=32, real_prompts=6, draft_costs=None, agree_tokens=48, breakdown_reps=15,
                     ratio_reps=10, states=["quiet", "loaded"], cal_prompts=3, cal_reps=1, draft_cal_prompts=8,
                     loaded_oracle_prompts=1, loaded_oracle_reps=1, loaded_draft_costs=[0.0, 0.2],
                     loaded_real_prompts=6, plain_runs=4, real_reps=3, draft_cal_plain_runs=12, loaded_real_reps=5,
                     noise_resamples=200, loaded_draft_cal_prompts=8),
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
    "09": {
        "quick": dict(batch_sizes=[1, 2], ks=[0, 1, 2, 3], draft_kind="oracle", oracle_a=0.8, n_tokens=8,
                      prompt_tokens=12, reps=2, term_positions=2, states=["quiet", "loaded"], union_resamples=50),
        "full": dict(batch_sizes=[1, 2, 4, 8], ks=list(range(9)), draft_kind="oracle", oracle_a=0.8, n_tokens=32,
                     prompt_tokens=24, reps=4, term_positions=8, states=["quiet", "loaded"], union_resamples=200),
    },
}
PROFILES = ("quick", "full")


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"profile must be 'quick' or 'full', found {profile!r}")


def resolve(notebook: str, profile: str, sizes: dict | None = None, **given) -> tuple[dict, list[str]]:
    """(values, from_profile): every size of ``notebook``'s :data:`DEFAULTS` as ``sizes`` (or the
    keywords ``given``) set it where that is not None, else the profile's value; ``from_profile``
    names the sizes that took the profile's value. A key the profile does not have is refused."""
    _check_profile(profile)
    table = DEFAULTS[notebook][profile]
    given = {**(sizes or {}), **given}
    if unknown := sorted(set(given) - set(table)):
        raise ValueError(f"notebook {notebook}: sizes {unknown} are not sizes of the {profile} profile; "
                         f"known {sorted(table)}")
    values, defaulted = {}, []
    for name, default in table.items():
        value = given.get(name)
        if value is None:
            values[name] = default
            defaulted.append(name)
        else:
            values[name] = value
    return values, defaulted


@dataclass(frozen=True)
class SubjectSpec:
    """What a whole-model notebook runs on (the arguments of
    :func:`moespec.engine.subject.load_subject`; docs/engine.md, "Subjects"): ``model`` (a subject
    kind or a checkpoint folder), ``like`` (the published model whose shapes a byte-faithful or
    replay subject takes; "" its default, OLMoE), ``fmt`` (the experts' format; "" the kind's
    default), ``dtype`` (a checkpoint's dtype), ``draft`` (a draft checkpoint), ``trace_file`` (a
    replay subject's routing trace), ``layers`` (a replay subject's MoE layers; 0: the published
    count), ``draft_cost`` (the draft widened to this share of the target's expert bytes per token)
    and ``layout`` (how a byte-faithful subject embeds its experts)."""

    model: str = "byte-faithful-all"
    like: str = ""
    fmt: str = ""
    dtype: str = ""
    draft: str = ""
    trace_file: str = ""
    layers: int = 0
    draft_cost: float = 0.0
    layout: str = "published"

    @classmethod
    def types(cls) -> dict:
        """{field: the Python type its value takes}."""
        return {f.name: type(f.default) for f in fields(cls)}

    @classmethod
    def from_dict(cls, given: dict | None, where: str = "subject") -> "SubjectSpec":
        """The spec of ``given`` (a notebook's ``subject`` parameter), every field it does not set at
        its default; an unknown field or a value of the wrong type is refused in one line."""
        given = dict(given or {})
        types = cls.types()
        for name, value in given.items():
            if name not in types:
                raise ValueError(f"{where}: unknown field {name!r}; expected one of {sorted(types)}")
            kind = types[name]
            ok = (isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float
                  else isinstance(value, kind) and not (kind is int and isinstance(value, bool)))
            if not ok:
                raise ValueError(f"{where}: field {name!r}: expected {kind.__name__}; found {value!r}")
        return cls(**{k: (float(v) if types[k] is float else v) for k, v in given.items()})

    @classmethod
    def from_run(cls, recorded: dict, given: dict | None = None, where: str = "subject") -> "SubjectSpec":
        """The spec a run recorded (``recorded``: notebook 05's ``subject_args``), checked against the
        fields a later notebook was ``given``: a given value that is set (not "", 0) must equal the
        recorded one, so that notebook 06 predicts the runs of the subject it times."""
        run = cls.from_dict(recorded, "the run's subject_args")
        for name, value in asdict(cls.from_dict(given, where)).items():
            if name in (given or {}) and value not in ("", 0, 0.0) and value != getattr(run, name):
                raise ValueError(f"{where}: field {name!r} is {value!r}, notebook 05's run used "
                                 f"{getattr(run, name)!r}; run notebook 05 on this subject first, or leave it unset")
        return run

    def args(self) -> dict:
        """The fields as keyword arguments of :func:`moespec.engine.subject.load_subject`."""
        return asdict(self)


def setup(profile: str, device: str, threads: int, out_dir: str = "") -> Path:
    """Check the profile and device, set torch's threads (one thread: batch-one passes on a
    shared CPU, where more threads wait on descheduled ones), and return the results folder
    (``out_dir`` or ``<run data>/engine/<profile>``, see :func:`moespec.paths.run_data_dir`)."""

    _check_profile(profile)
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
