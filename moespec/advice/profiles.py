"""The acceptance advise decides at: geometric rates (``-a``, ``--acceptance-table``: what-if
questions, G_a(k) = (1 - a^(k+1)) / (1 - a) assumed and said), or a measured per-position profile
(``--acceptance-from`` an engine's metrics, logs or responses, :mod:`moespec.acceptance`; or, with
no acceptance option, the run's own real-draft runs): tokens per step G(k) from the profile, per
prompt the median prompt's as notebook 05 scores its runs."""

from __future__ import annotations

from moespec import acceptance as A

from .errors import AdviceInputError

GEOMETRIC = "geometric acceptance assumed"


def geometric(rates, label: str = "given") -> list[tuple[float, str]]:
    """(a, label) pairs of what-if rates, each label saying that geometric acceptance is assumed."""
    return [(float(a), f"{label}; {GEOMETRIC}") for a in rates]


def profile_item(prof: A.AcceptanceProfile, kmax: int, label: str) -> dict:
    """The decision's acceptance from a profile: tokens per step E(k), k = 0..kmax
    (:meth:`~moespec.acceptance.AcceptanceProfile.tokens_per_step`), its geometric fit as ``a``."""
    try:
        E, how = prof.tokens_per_step(kmax)
    except A.AcceptanceError as err:
        raise AdviceInputError(str(err), where=err.where, field=err.field) from None
    a, dist = prof.geometric_fit()
    fallback = prof.counts is None and prof.scalar is not None
    how = how + ("" if fallback else f"; the best geometric fit a = {a:.3f} differs by up to {100 * dist:.1f} %")
    return {"a": min(a, 0.9999), "label": label, "tokens": E, "how": how}


def from_files(files, kmax: int) -> dict:
    """``--acceptance-from FILE [FILE]``: the profile of an engine's files (or a moespec run)."""
    try:
        prof = A.load(files)
    except A.AcceptanceError as err:
        raise AdviceInputError(str(err), where=err.where, field=err.field) from None
    what = "scalar fallback, " + GEOMETRIC if prof.counts is None and prof.scalar is not None else "measured profile"
    return profile_item(prof, kmax, f"{prof.source} ({what}; {', '.join(prof.files)})")


def from_run(rf, state: str, kmax: int) -> dict:
    """The run's own measured profile in machine ``state`` (its run file), refused where it has none."""
    prof = rf.acceptance_profile(state)
    if prof is None:
        raise AdviceInputError(f"{rf.path}: field acceptance.{state}.profile: expected the real-draft runs' acceptance "
                               "profile (notebook 05); found none. Give -a A (what-if, geometric), --acceptance-table "
                               "or --acceptance-from FILE", where=str(rf.path), field=f"acceptance.{state}.profile")
    return profile_item(prof, kmax, f"the run's measured acceptance profile, {state} machine ({prof.source})")
