"""What ``moespec advise`` decides on: one round model (:class:`moespec.predict.round_model.RoundModel`,
V(k) = t_draft(k) + tau_p(k + 1) + h(k) with every term's source and interval) for both expert
kernels at pass sizes n = 1..9, with what it rests on (:class:`VerifyCurves`); a round model
predicted from bandwidths (:func:`predicted_round`); the draft a user names (:func:`draft_option`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from moespec.predict.round_model import DraftTime, RoundModel, RoundModelError, Term

from .errors import AdviceInputError

N_MAX = 9


@dataclass
class VerifyCurves:
    """What the decision rests on: ``round_model`` (verify times tau_p(n) of the per-slot ("slot")
    and deduplicating ("dedup") kernel, n = 1..n_max, the saving's interval, the draft's and the
    host's time per round, each with its interval and source), ``interval`` (what the saving's
    interval is), ``eps`` (the bandwidth error where verify times are predicted from bandwidths;
    None where they are measured), ``covers`` (which terms the step-time band covers), ``subject``
    (model, engine, format, where measured, whose numbers), ``inputs`` and ``assumptions``;
    ``ubar``/``r`` for the margin (19) where the source has them; ``other_states``: the same round
    in the run's other machine states (state -> RoundModel); ``sources``: where each part came
    from, named once (part -> file or notebook)."""

    round_model: RoundModel
    interval: str
    eps: float | None
    subject: dict
    inputs: list = field(default_factory=list)
    assumptions: list = field(default_factory=list)
    covers: list = field(default_factory=list)
    ubar: np.ndarray | None = None
    r: np.ndarray | None = None
    other_states: dict = field(default_factory=dict)
    log_gap_range: np.ndarray | None = None
    sources: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.eps is not None and not (np.isfinite(self.eps) and 0 <= self.eps < 0.5):
            raise AdviceInputError(f"bandwidth error eps = {self.eps} is outside [0, 1/2): the bounds (18)-(21) "
                                   "say nothing there (C.7 needs eps < 1/2); the fits are not usable for a decision")
        if self.round_model.saving is None:
            raise AdviceInputError(f"round model {self.round_model.context!r}: no interval of the saving S(n) "
                                   "(both kernels must be measured or predicted)")
        if self.round_model.n_max < 2:
            raise AdviceInputError("verify times cover n = 1 only; the kernel decision needs n = 1..9")

    @property
    def tau(self) -> dict:
        return {p: self.round_model.tau(p) for p in ("slot", "dedup")}

    @property
    def S_lo(self) -> np.ndarray:
        return self.round_model.saving.lo_s

    @property
    def S_hi(self) -> np.ndarray:
        return self.round_model.saving.hi_s

    @property
    def n_max(self) -> int:
        return self.round_model.n_max

    @property
    def kmax(self) -> int:
        """The longest draft length decided on (every term covers k = 0..kmax)."""
        return self.round_model.kmax

    @property
    def saving(self) -> np.ndarray:
        return self.round_model.saving.values_s


def predicted_round(tau: dict, M: dict, eps: float, half_S, draft: DraftTime, subject: str, context: str,
                    source: str, n_max: int = N_MAX) -> RoundModel:
    """A round model whose verify times are predicted from bandwidths (the fits of notebook 03 or a
    bandwidth table): tau_p(n) with the interval of bound (17), eps/(1 - eps) M_p(n) around it
    (M_p the memory part), the saving with bound (18)'s ``half_S``; the host's time taken as zero
    (these sources do not measure it; stated in the assumptions); ``draft``: the given draft."""
    for p in ("slot", "dedup"):
        t = np.asarray(tau[p], float)
        if t.shape != (n_max,) or not np.all(np.isfinite(t)) or np.any(t <= 0):
            raise AdviceInputError(f"verify times tau_{p}(n) must be positive and finite; found {list(t)}")
    host = Term.exact(np.zeros(n_max), "not measured by this source: taken as 0", "given")
    base = RoundModel(subject=subject, context=context, state="as the source measured", host=host,
                      draft=draft, verify={p: Term.exact(np.asarray(tau[p], float), source, "prediction")
                                           for p in ("slot", "dedup")})
    r = eps / (1 - eps)
    return base.with_verify(tau, source, "prediction", half_width={p: r * np.asarray(M[p], float) for p in M},
                            saving_half_width=half_S)


def draft_option(draft_fit=None, free_draft: bool = False, kmax: int = N_MAX - 1) -> DraftTime | None:
    """The draft the user named: ``draft_fit`` (a, b) in ms per drafted token and per round
    (t_draft(k) = a k + b, paper 2's eq. (A4)), or ``free_draft``; None when neither (the run's own)."""
    if draft_fit is not None and free_draft:
        raise AdviceInputError("give either --draft-fit A,B or --free-draft, not both")
    if free_draft:
        return DraftTime.free(kmax)
    if draft_fit is None:
        return None
    try:
        a, b = (float(x) for x in (draft_fit.split(",") if isinstance(draft_fit, str) else draft_fit))
    except (TypeError, ValueError):
        raise AdviceInputError(f"--draft-fit needs two numbers A,B (ms per drafted token, ms per round); "
                               f"found {draft_fit!r}") from None
    try:
        return DraftTime.from_fit(f"a given draft: t_draft(k) = {a:g} k + {b:g} ms", a * 1e-3, b * 1e-3, kmax,
                                  "given (--draft-fit)", "given")
    except RoundModelError as err:
        raise AdviceInputError(f"--draft-fit {a:g},{b:g}: {err}") from None


def draft_or_refuse(draft: DraftTime | None, where: str) -> DraftTime:
    if draft is None:
        raise AdviceInputError(f"{where} has no draft of its own: name one with --draft-fit A,B (ms per drafted "
                               "token, ms per round; paper 2's t_draft(k) = a k + b) or ask for --free-draft")
    return draft


def draft_assumption(draft: DraftTime) -> str:
    if draft.term.protocol == "free":
        return "draft time t_draft(k) = 0: the draft taken as free (asked for by name: --free-draft)"
    if draft.a_s is not None:
        return f"draft time {draft.formula()} for k >= 1 ({draft.name}; {draft.term.source})"
    return f"draft time per round measured ({draft.name}; {draft.term.source})"


def finite(values, what: str, positive: bool = True) -> np.ndarray:
    arr = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(float)
    bad = ~np.isfinite(arr) | ((arr <= 0) if positive else False)
    if bad.any():
        raise AdviceInputError(f"{what}: {'positive ' if positive else ''}finite numbers needed; "
                               f"found {arr[bad][0]!r} at position {int(np.argmax(bad))}")
    return arr
