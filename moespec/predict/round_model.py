"""The round model: the time of one speculative round (a step) of draft length k,

    V(k) = t_draft(k) + tau_p(k + 1) + h(k),    k = 0..kmax,

paper 1's step time (Section 3.1, the denominator of eq. (9)) with the draft's time written out as
paper 2 fits it (eq. (A4): t_draft(k) = a_d k + b_d for k >= 1; no draft runs at k = 0, so
t_draft(0) = 0), with the one-draft round apart and a time per round whose draft began with two
tokens (:data:`DRAFT_FORM`, :class:`DraftTime`). tau_p(n) is the target's verify pass of n tokens
with expert kernel p (``slot``, ``dedup``, or the ``switch`` engine: per-slot below a crossover,
deduplicating from it) and h(k) the host's work of a round outside the draft and the verify pass
(acceptance, cache crop).

Every term is a :class:`Term`: its values, a 95 % interval of each value, the runs behind it, and
where it comes from (``source``: which measurement; ``protocol``: how it was timed). A
:class:`RoundModel` holds one set of terms for one context (a cache depth, or the prompts of a
workload), one draft and one machine state (its ``state`` label and the read bandwidth measured in
the same rounds), and is the only place in moespec that assembles a step time: notebook 05's
predictions, chain (22) and Tables 3/4/7/8, ``moespec advise`` and paper 2's cost model read it.

The interval of V(k) is the sum of its terms' intervals (each term's interval is that of its
estimate; their errors are not assumed to cancel). From it, the relative step-time error
delta_k = max(V(k)/V_lo(k) - 1, 1 - V(k)/V_hi(k)) enters paper 1's bounds (20)/(21) per k
(:func:`moespec.theory.speedup_interval_by_k`). A verify term predicted from bandwidths carries
the interval of bound (17) instead (:meth:`RoundModel.with_verify`).

Arrays over pass sizes are indexed by n - 1; arrays over draft lengths by k.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from moespec import io
from moespec.fit import KERNELS
from moespec.theory import crossover, expected_tokens, speedup_interval_by_k

SCHEMA_ID = "moespec.round_model/1"
ENGINES = ("slot", "dedup", "switch")
#: Protocols a term may have been measured under (docs/advise.md, "The round model").
PROTOCOLS = {
    "loop": "timed inside decode-loop rounds (the state a round leaves the machine in)",
    "grid": "timed in notebook 05's shuffled grid (each pass after an unrelated pass or a 256 MiB read)",
    "fit": "a least-squares fit over runs of the loop (intercept kept)",
    "prediction": "predicted by chain (22) from the expert-operation fits, interval of bound (17)",
    "given": "given by the user",
    "free": "taken as free (zero) by request",
}


class RoundModelError(ValueError):
    """A round model or one of its terms is malformed; the message names the term and the value."""


def _bootstrap_ends(value: float, boot, level: float) -> tuple[float, float]:
    """The ``level`` interval of the bootstrap values ``boot``, widened to hold ``value`` (the point
    estimate); (value, value) when there are none."""
    if len(boot) == 0:
        return value, value
    a, b = np.quantile(boot, ((1 - level) / 2, 1 - (1 - level) / 2))
    return min(float(a), value), max(float(b), value)


def _arr(x, what: str, ms: bool = False) -> np.ndarray:
    """``x`` as a flat float array of finite values; ``ms``: seconds, shown in ms as the file holds them."""
    a = np.asarray(x, dtype=float).reshape(-1)
    if a.size == 0 or not np.all(np.isfinite(a)):
        raise RoundModelError(f"{what}: finite values needed, found {(a * 1e3 if ms else a).tolist()}"
                              + (" ms" if ms else ""))
    return a


@dataclass(frozen=True)
class Term:
    """One term of a round per index (n - 1 for a verify pass, k for draft and host time), in
    seconds: ``values_s`` (the estimate), ``lo_s``/``hi_s`` (its 95 % interval), ``runs`` (the runs
    behind each value), ``source`` and ``protocol`` (a key of :data:`PROTOCOLS`)."""

    values_s: np.ndarray
    lo_s: np.ndarray
    hi_s: np.ndarray
    runs: np.ndarray
    source: str
    protocol: str

    def __post_init__(self):
        v = _arr(self.values_s, f"term ({self.source}) values_ms", ms=True)
        lo = _arr(self.lo_s, f"term ({self.source}) lo_ms", ms=True)
        hi = _arr(self.hi_s, f"term ({self.source}) hi_ms", ms=True)
        runs = np.asarray(self.runs, dtype=int).reshape(-1)
        if not (v.shape == lo.shape == hi.shape == runs.shape):
            raise RoundModelError(f"term ({self.source}): values, interval and runs differ in length "
                                  f"({v.size}, {lo.size}, {hi.size}, {runs.size})")
        if np.any(lo > v + 1e-15) or np.any(hi < v - 1e-15):
            i = int(np.argmax((lo > v + 1e-15) | (hi < v - 1e-15)))
            raise RoundModelError(f"term ({self.source}): interval [{1e3 * lo[i]:g}, {1e3 * hi[i]:g}] ms "
                                  f"(lo_ms, hi_ms) does not hold its value {1e3 * v[i]:g} ms (values_ms) at index {i}")
        if self.protocol not in PROTOCOLS:
            raise RoundModelError(f"term ({self.source}): protocol {self.protocol!r} is not one of {sorted(PROTOCOLS)}")
        for name, value in (("values_s", v), ("lo_s", lo), ("hi_s", hi), ("runs", runs)):
            object.__setattr__(self, name, value)

    def __len__(self) -> int:
        return len(self.values_s)

    @property
    def spread_s(self) -> np.ndarray:
        """The larger distance from the value to an end of its interval, per index."""
        return np.maximum(self.values_s - self.lo_s, self.hi_s - self.values_s)

    @classmethod
    def exact(cls, values, source: str, protocol: str, runs=None) -> "Term":
        """A term known without error (a given value, or zero for a free draft)."""
        v = np.asarray(values, float).reshape(-1)
        return cls(v, v.copy(), v.copy(), np.zeros(v.size, int) if runs is None else runs, source, protocol)

    @classmethod
    def from_samples(cls, samples: list, source: str, protocol: str, n_boot: int = 2000, seed: int = 0,
                     level: float = 0.95) -> "Term":
        """The mean of each index's samples (one value per run) and a bootstrap interval of that
        mean (runs resampled with replacement). Every index needs at least one sample."""
        rng = np.random.default_rng(seed)
        vals, lo, hi, runs = [], [], [], []
        for i, x in enumerate(samples):
            x = np.asarray(x, float).reshape(-1)
            if x.size == 0 or not np.all(np.isfinite(x)):
                raise RoundModelError(f"term ({source}): index {i} needs finite samples, found {x.tolist()}")
            vals.append(float(x.mean()))
            ends = _bootstrap_ends(vals[-1], x[rng.integers(x.size, size=(n_boot, x.size))].mean(axis=1), level)
            lo.append(ends[0])
            hi.append(ends[1])
            runs.append(x.size)
        return cls(np.array(vals), np.array(lo), np.array(hi), np.array(runs), source, protocol)

    @classmethod
    def difference(cls, a: "Term", b: "Term", source: str) -> "Term":
        """a - b where the two were not measured paired: the difference of the values, its interval
        from the ends of theirs (a.lo - b.hi, a.hi - b.lo), the fewer runs of the two."""
        return cls(a.values_s - b.values_s, a.lo_s - b.hi_s, a.hi_s - b.lo_s, np.minimum(a.runs, b.runs), source,
                   b.protocol)

    def to_dict(self) -> dict:
        return {"values_ms": (1e3 * self.values_s).tolist(), "lo_ms": (1e3 * self.lo_s).tolist(),
                "hi_ms": (1e3 * self.hi_s).tolist(), "runs": self.runs.tolist(), "source": self.source,
                "protocol": self.protocol}

    @classmethod
    def from_dict(cls, d: dict, what: str = "term") -> "Term":
        try:
            return cls(np.asarray(d["values_ms"], float) * 1e-3, np.asarray(d["lo_ms"], float) * 1e-3,
                       np.asarray(d["hi_ms"], float) * 1e-3, np.asarray(d["runs"], int), str(d["source"]),
                       str(d["protocol"]))
        except (KeyError, TypeError) as err:
            raise RoundModelError(f"{what}: needs values_ms, lo_ms, hi_ms, runs, source, protocol ({err})") from None


#: The form of the draft's time per round a calibration fits (:func:`fit_draft_time`).
DRAFT_FORM = ("t_draft(k) = a k + b + c [k = 1] + e s(k): paper 2's line (eq. (A4)), the one-draft round apart, "
              "and e per round whose draft began with two tokens (share s(k))")


@dataclass(frozen=True)
class DraftTime:
    """The draft's time per round, k = 0..kmax: ``term`` (t_draft(0) = 0), and the fit it was
    evaluated from, where there is one (:data:`DRAFT_FORM`),

        t_draft(k) = a k + b + c [k = 1] + e s(k),

    ``a_s``, ``b_s`` seconds per drafted token and per round (paper 2's line, eq. (A4)),
    ``one_token_s`` = c, the one-draft round's own departure from the line, and ``catch_up_s`` = e,
    the time of a round whose draft began by feeding two tokens (the last draft and the bonus
    token, after a round that accepted every draft) over one that fed one; s(k) the share of such
    rounds (:func:`moespec.runstats.catch_up_share`). ``catch_up_share`` per k = 0..kmax is the
    calibration's mean share the term is evaluated at; at another share s, the draft takes
    :meth:`shift_s` longer, e (s - s_cal(k)). A draft given as a line a k + b (by a user of ``moespec
    advise``) has no share: c = e = 0 and :attr:`form` ``"line"``."""

    name: str
    term: Term
    a_s: float | None = None
    b_s: float | None = None
    one_token_s: float = 0.0
    catch_up_s: float = 0.0
    catch_up_share: np.ndarray | None = None

    def __post_init__(self):
        if self.catch_up_share is not None:
            s = np.asarray(self.catch_up_share, float).reshape(-1)
            if s.size != len(self.term) or not np.all(np.isfinite(s)) or np.any((s < 0) | (s > 1)):
                raise RoundModelError(f"draft {self.name!r}: a catch-up share per k = 0..{len(self.term) - 1} in "
                                      f"[0, 1] is needed; found {s.tolist()}")
            object.__setattr__(self, "catch_up_share", s)
        if not (np.isfinite(self.one_token_s) and np.isfinite(self.catch_up_s) and self.catch_up_s >= 0):
            raise RoundModelError(f"draft {self.name!r}: one_token_ms and catch_up_ms: expected finite values, "
                                  f"catch_up_ms >= 0; found {1e3 * self.one_token_s:g} ms and "
                                  f"{1e3 * self.catch_up_s:g} ms")

    @property
    def form(self) -> str:
        """``"catch-up"`` where the fit has a catch-up share (:data:`DRAFT_FORM`), else ``"line"`` (a
        draft given as a k + b)."""
        return "line" if self.catch_up_share is None else "catch-up"

    def shift_s(self, k: int, share: float) -> float:
        """How much longer the draft takes at draft length ``k`` when a share ``share`` of the rounds
        begin with two tokens instead of the calibration's: e (share - s_cal(k)); 0 for the line form
        and at k = 0."""
        if self.catch_up_share is None or int(k) == 0:
            return 0.0
        if not (np.isfinite(share) and 0 <= share <= 1):
            raise RoundModelError(f"draft {self.name!r}: a catch-up share lies in [0, 1], found {share}")
        return self.catch_up_s * (float(share) - float(self.catch_up_share[int(k)]))

    def formula(self) -> str | None:
        """The fit as text, ms (None where the draft has no fit)."""
        if self.a_s is None:
            return None
        line = f"t_draft(k) = {1e3 * self.a_s:.4g} k + {1e3 * self.b_s:.4g}"
        if self.catch_up_share is None:
            return f"{line} ms"
        return (f"{line} {'-' if self.one_token_s < 0 else '+'} {1e3 * abs(self.one_token_s):.4g} [k = 1] + "
                f"{1e3 * self.catch_up_s:.4g} s(k) ms, s(k) the share of rounds whose draft began with two tokens")

    @classmethod
    def from_fit(cls, name: str, a_s: float, b_s: float, kmax: int, source: str, protocol: str = "given",
                 lo_s=None, hi_s=None, runs=None, one_token_s: float = 0.0, catch_up_s: float = 0.0,
                 catch_up_share=None) -> "DraftTime":
        """t_draft(k) = a k + b for k = 1..kmax and 0 at k = 0, plus c at k = 1 and e s(k) where a
        catch-up share s per k is given (the ``"catch-up"`` form); exact unless an interval is given."""
        k = np.arange(kmax + 1, dtype=float)
        share = np.zeros(kmax + 1) if catch_up_share is None else np.asarray(catch_up_share, float).reshape(-1)
        if share.size != kmax + 1:
            raise RoundModelError(f"draft {name!r}: a catch-up share per k = 0..{kmax} is needed; found {share.size}")
        v = np.where(k > 0, a_s * k + b_s + one_token_s * (k == 1) + catch_up_s * share, 0.0)
        if not (np.isfinite(a_s) and np.isfinite(b_s)) or not np.all(np.isfinite(v)) or np.any(v < 0):
            raise RoundModelError(f"draft {name!r}: t_draft(k) = {a_s * 1e3:g} k + {b_s * 1e3:g} ms"
                                  + ("" if catch_up_share is None else
                                     f" + {one_token_s * 1e3:g} ms [k = 1] + {catch_up_s * 1e3:g} ms s(k)")
                                  + f" must be a finite time >= 0 at every k = 1..{kmax}")
        term = Term(v, v if lo_s is None else lo_s, v if hi_s is None else hi_s,
                    np.zeros(kmax + 1, int) if runs is None else runs, source, protocol)
        return cls(name, term, float(a_s), float(b_s), float(one_token_s), float(catch_up_s),
                   None if catch_up_share is None else share)

    @classmethod
    def free(cls, kmax: int) -> "DraftTime":
        return cls("free draft", Term.exact(np.zeros(kmax + 1), "a draft taken as free (asked for by name)", "free"))

    def to_dict(self) -> dict:
        return {"name": self.name, "term": self.term.to_dict(), "form": self.form,
                "a_ms_per_token": None if self.a_s is None else 1e3 * self.a_s,
                "b_ms_per_round": None if self.b_s is None else 1e3 * self.b_s,
                "one_token_ms": 1e3 * self.one_token_s, "catch_up_ms": 1e3 * self.catch_up_s,
                "catch_up_share": None if self.catch_up_share is None else self.catch_up_share.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "DraftTime":
        a, b, share = d.get("a_ms_per_token"), d.get("b_ms_per_round"), d.get("catch_up_share")
        return cls(str(d["name"]), Term.from_dict(d["term"], f"draft {d.get('name')!r}"),
                   None if a is None else 1e-3 * float(a), None if b is None else 1e-3 * float(b),
                   1e-3 * float(d.get("one_token_ms") or 0.0), 1e-3 * float(d.get("catch_up_ms") or 0.0),
                   None if share is None else np.asarray(share, float))


def fit_draft_time(k, t_s, name: str, kmax: int, source: str, n_boot: int = 2000, seed: int = 0,
                   level: float = 0.95, *, share) -> DraftTime:
    """The draft's time per round (:data:`DRAFT_FORM`) fitted by least squares over runs (one mean
    draft time per round per run at its k >= 1, ``share`` each run's catch-up share,
    :func:`moespec.runstats.catch_up_share`): t_draft(k) = a k + b + c [k = 1] + e s with a, b, e >= 0
    and c free, evaluated at the runs' mean share per k, with a bootstrap interval of the fitted value
    at each k (runs resampled within each k). The one-draft round gets its own level (c) because its
    draft runs one pass, so nothing of a pass's set-up is shared with a second one; e is what the
    second token of a two-token first pass costs. The bounds keep a draft's time from going
    negative: where a few noisy runs tilt the unconstrained fit below zero, the constrained optimum
    on the boundary instead of a refusal."""
    k = np.asarray(k, float)
    t = np.asarray(t_s, float)
    s = np.asarray(share, float)
    if s.shape != k.shape:
        raise RoundModelError(f"draft {name!r}: {s.size} catch-up shares for {k.size} runs")
    ok = k >= 1
    k, t, s = k[ok], t[ok], s[ok]
    if np.unique(k).size < 3:
        raise RoundModelError(f"draft {name!r}: a fit a k + b + c [k = 1] + e s needs runs at three draft lengths or "
                              f"more; found k = {sorted(set(k.astype(int).tolist()))}")
    if not (np.all(np.isfinite(t)) and np.all(np.isfinite(s))):
        raise RoundModelError(f"draft {name!r}: non-finite draft times or catch-up shares")
    ks = np.arange(kmax + 1, dtype=float)
    mean_share = np.array([0.0] + [float(s[k == j].mean()) if np.any(k == j) else 0.0 for j in range(1, kmax + 1)])

    def values(idx) -> tuple[np.ndarray, tuple]:
        coef = _draft_coefficients(k[idx], t[idx], s[idx])
        a, b, c, e = coef
        return np.where(ks > 0, a * ks + b + c * (ks == 1) + e * mean_share, 0.0), coef

    v, (a, b, c, e) = values(np.arange(k.size))
    rng = np.random.default_rng(seed)
    groups = {int(x): np.flatnonzero(k == x) for x in np.unique(k)}
    boot = np.empty((n_boot, kmax + 1))
    for i in range(n_boot):
        boot[i] = values(np.concatenate([g[rng.integers(g.size, size=g.size)] for g in groups.values()]))[0]
    q = ((1 - level) / 2, 1 - (1 - level) / 2)
    lo, hi = np.minimum(np.quantile(boot, q[0], axis=0), v), np.maximum(np.quantile(boot, q[1], axis=0), v)
    runs = np.array([0] + [int(sum(g.size for g in groups.values()))] * kmax)
    return DraftTime.from_fit(name, a, b, kmax, source, "fit", lo, hi, runs, c, e, mean_share)


def _draft_coefficients(k, t, share) -> tuple[float, float, float, float]:
    """(a, b, c, e) of the draft fit (:func:`fit_draft_time`); a, b, e >= 0, c free."""
    from scipy.optimize import lsq_linear

    X = np.column_stack([k, np.ones_like(k), (k == 1).astype(float), share])
    fit = lsq_linear(X, t, bounds=([0, 0, -np.inf, 0], [np.inf, np.inf, np.inf, np.inf]), method="bvls")
    return tuple(float(x) for x in fit.x)


@dataclass(frozen=True)
class RoutingTerm:
    """How the deduplicating verify pass depends on the routing of the tokens it verifies (paper 1,
    Section 3: the deduplicating kernel reads each distinct expert once, so its bytes, and at a
    steady bandwidth its time, grow with u(n), the distinct experts a pass of n tokens touches per
    layer). ``distinct`` per k = 0..kmax: the calibration runs' mean distinct (expert, layer) pairs
    per verify pass of k + 1 tokens (u summed over the L layers); ``s_per_expert``: the seconds one
    more distinct pair costs, fitted over the calibration runs with one intercept per k
    (:meth:`fit`). With an intercept per k, least squares passes through each k's means, so

        tau_dedup(k + 1 | u) = tau_dedup(k + 1) + s_per_expert (u - distinct[k])

    is the fit's own value at u and equals the pooled term at the calibration's mean routing
    (:meth:`RoundModel.step_times_routed`)."""

    s_per_expert: float
    distinct: np.ndarray
    runs: int
    source: str

    def __post_init__(self):
        d = _arr(self.distinct, "routing term: distinct experts per pass")
        object.__setattr__(self, "distinct", d)
        if not np.isfinite(self.s_per_expert):
            raise RoundModelError(f"routing term: seconds per distinct expert must be finite, found "
                                  f"{self.s_per_expert}")
        if np.any(d <= 0):
            raise RoundModelError(f"routing term: distinct experts per pass must be positive, found {d.tolist()}")

    @classmethod
    def fit(cls, k, distinct, t_s, source: str) -> "RoutingTerm":
        """Least squares of verify times ``t_s`` (one per run) on one intercept per draft length
        ``k`` and a common slope in ``distinct`` (each run's mean distinct (expert, layer) pairs per
        pass); every k = 0..max(k) needs a run. Where the counts never vary within a k (one
        calibration prompt, say) the runs hold no slope: it is 0 (the term changes nothing) and the
        source says so. The slope is kept within what a pass can spend on its distinct pairs: at
        least 0 (a pass reading more experts is not faster) and at most the smallest mean verify
        time per mean distinct pair over the k (a pass cannot spend more on its pairs than its whole
        time), so that the routed pass stays positive at any routing; a slope outside, which only
        a few noisy runs give, is clipped and the source says so."""
        k = np.asarray(k, int).reshape(-1)
        u = np.asarray(distinct, float).reshape(-1)
        t = np.asarray(t_s, float).reshape(-1)
        if not (k.size == u.size == t.size) or k.size == 0:
            raise RoundModelError(f"routing fit: k, distinct and times need one value per run; found sizes "
                                  f"{k.size}, {u.size}, {t.size}")
        if not (np.isfinite(u).all() and np.isfinite(t).all()):
            raise RoundModelError("routing fit: every run needs a finite distinct count and verify time")
        ks = np.arange(int(k.max()) + 1)
        if missing := sorted(set(ks.tolist()) - set(k.tolist())):
            raise RoundModelError(f"routing fit: no run at k = {missing}")
        means_u = np.array([u[k == j].mean() for j in ks])
        means_t = np.array([t[k == j].mean() for j in ks])
        centred = u - means_u[k]
        spread = float(centred @ centred)
        t_centred = t - means_t[k]
        if spread <= 0:
            slope, source = 0.0, f"{source} (the distinct counts never vary within a k: no slope, taken as 0)"
        else:
            slope = float(centred @ t_centred / spread)   # within-k least squares (one intercept per k)
            ceiling = float(np.min(means_t / means_u))
            if not 0.0 <= slope <= ceiling:
                clipped = min(max(slope, 0.0), ceiling)
                source = (f"{source} (least squares gave {slope * 1e3:.4g} ms per pair, outside "
                          f"[0, {ceiling * 1e3:.4g}]: "
                          f"taken as {clipped * 1e3:.4g})")
                slope = clipped
        return cls(slope, means_u, int(k.size), source)

    def shift_s(self, k: int, distinct: float) -> float:
        """tau_dedup(k + 1 | u) - tau_dedup(k + 1): the verify term's change at ``distinct`` pairs per pass."""
        if not 0 <= int(k) < len(self.distinct):
            raise RoundModelError(f"routing term covers k = 0..{len(self.distinct) - 1}, asked k = {k}")
        return self.s_per_expert * (float(distinct) - float(self.distinct[int(k)]))

    def to_dict(self) -> dict:
        return {"s_per_expert": self.s_per_expert, "distinct": self.distinct.tolist(), "runs": self.runs,
                "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> "RoutingTerm":
        try:
            return cls(float(d["s_per_expert"]), np.asarray(d["distinct"], float), int(d["runs"]), str(d["source"]))
        except KeyError as err:
            raise RoundModelError(f"routing term: missing field {err}") from None


@dataclass(frozen=True)
class RoundModel:
    """One context's round: ``verify[p]`` (tau_p(n), n = 1..n_max), ``saving`` (S(n) = tau_slot -
    tau_dedup with an interval of its own, paired where it was measured paired; None when the
    kernels were not both measured), ``host`` (h(k)), ``draft`` (:class:`DraftTime`); what it is
    of (``subject``, ``context``, ``depth``: mean cache positions, ``state``: machine state,
    ``regime``, ``read_GBps``: median same-round read), ``routing`` (:class:`RoutingTerm`, where the
    calibration recorded its passes' routing; None otherwise) and ``notes`` (anything the consumer prints)."""

    subject: str
    context: str
    state: str
    verify: dict
    host: Term
    draft: DraftTime
    saving: Term | None = None
    depth: float | None = None
    regime: str = "one"
    read_GBps: float | None = None
    notes: dict = field(default_factory=dict)
    routing: RoutingTerm | None = None

    def __post_init__(self):
        if set(self.verify) != set(KERNELS):
            raise RoundModelError(f"round model {self.context!r}: verify terms for {sorted(self.verify)}, "
                                  f"need {KERNELS}")
        n = {p: len(t) for p, t in self.verify.items()}
        if len(set(n.values())) != 1 or n["slot"] < 1:
            raise RoundModelError(f"round model {self.context!r}: verify terms cover different pass sizes {n}")
        if self.saving is not None and len(self.saving) != n["slot"]:
            raise RoundModelError(f"round model {self.context!r}: saving covers {len(self.saving)} pass sizes, "
                                  f"verify {n['slot']}")
        for what, term, positive in (("verify.slot", self.verify["slot"], True),
                                     ("verify.dedup", self.verify["dedup"], True), ("host", self.host, False),
                                     ("draft.term", self.draft.term, False)):
            bad = term.values_s <= 0 if positive else term.values_s < 0
            if np.any(bad):
                i = int(np.argmax(bad))
                raise RoundModelError(f"round model {self.context!r}: {what}.values_ms[{i}]: expected a time "
                                      f"{'> 0' if positive else '>= 0'} ms; found {1e3 * term.values_s[i]:g} ms")
        if self.routing is not None and len(self.routing.distinct) != n["slot"]:
            raise RoundModelError(f"round model {self.context!r}: routing term covers {len(self.routing.distinct)} "
                                  f"draft lengths, verify {n['slot']} pass sizes")

    # --- sizes ----------------------------------------------------------------------------
    @property
    def n_max(self) -> int:
        return len(self.verify["slot"])

    @property
    def kmax(self) -> int:
        """The longest draft length every term covers (verify passes up to kmax + 1 tokens)."""
        return min(len(self.host) - 1, len(self.draft.term) - 1, self.n_max - 1)

    # --- terms ----------------------------------------------------------------------------
    def crossover(self) -> int | None:
        """The pass size from which deduplication is faster (point estimates; theory.crossover)."""
        return crossover(self.verify["slot"].values_s - self.verify["dedup"].values_s)

    def _verify(self, engine: str, n_switch: int | None, part: str) -> np.ndarray:
        if engine not in ENGINES:
            raise RoundModelError(f"engine must be one of {ENGINES}; found {engine!r}")
        if engine != "switch":
            return getattr(self.verify[engine], part).copy()
        slot, dedup = getattr(self.verify["slot"], part), getattr(self.verify["dedup"], part)
        if n_switch is None:
            return slot.copy()
        n = np.arange(1, self.n_max + 1)
        return np.where(n < n_switch, slot, dedup)

    def tau(self, engine: str = "dedup", n_switch: int | None = None) -> np.ndarray:
        """tau(n), n = 1..n_max, of ``engine`` (``switch``: per-slot below ``n_switch``)."""
        return self._verify(engine, n_switch, "values_s")

    def step_times(self, engine: str = "dedup", n_switch: int | None = None) -> np.ndarray:
        """V(k) = t_draft(k) + tau(k + 1) + h(k), k = 0..kmax."""
        return self.step_times_for(self.tau(engine, n_switch))

    def step_times_for(self, tau_s) -> np.ndarray:
        """V(k) = t_draft(k) + tau(k + 1) + h(k) with the verify times ``tau_s`` (seconds per n = 1..n_max,
        e.g. a chain (22) prediction, which may be non-positive where it predicts nothing) in place
        of this model's, k = 0..kmax."""
        K = self.kmax + 1
        tau = np.asarray(tau_s, float)
        if tau.size < K:
            raise RoundModelError(f"verify times for n = 1..{tau.size}; the round needs n = 1..{K}")
        return self.draft.term.values_s[:K] + tau[:K] + self.host.values_s[:K]

    def step_interval(self, engine: str = "dedup", n_switch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(V_lo(k), V_hi(k)): the sum of the terms' interval ends, k = 0..kmax."""
        K = self.kmax + 1
        lo = self.draft.term.lo_s[:K] + self._verify(engine, n_switch, "lo_s")[:K] + self.host.lo_s[:K]
        hi = self.draft.term.hi_s[:K] + self._verify(engine, n_switch, "hi_s")[:K] + self.host.hi_s[:K]
        return lo, hi

    def delta_by_k(self, engine: str = "dedup", n_switch: int | None = None) -> np.ndarray:
        """delta_k: the smallest delta with (1 - delta) V <= V_hat(k) <= (1 + delta) V for every V in
        the step's interval, V_hat the point estimate (the per-k input of bounds (20)/(21))."""
        V = self.step_times(engine, n_switch)
        lo, hi = self.step_interval(engine, n_switch)
        return np.maximum(V / lo - 1, 1 - V / hi)

    def speedups(self, tokens_per_step, engine: str = "dedup", n_switch: int | None = None) -> dict:
        """Predicted speedup over plain decoding at every k, E(k) V(0) / V(k) (paper 1, eq. (9) with
        the expected tokens per step E(k) given: G_a(k) for a geometric acceptance, or measured), and
        its interval from delta_k (:func:`moespec.theory.speedup_interval_by_k`). ``tokens_per_step``:
        one value per k = 0..kmax (E(0) = 1), or a scalar acceptance rate a in [0, 1)."""
        V = self.step_times(engine, n_switch)
        K = len(V)
        if np.ndim(tokens_per_step) == 0:
            E = np.asarray(expected_tokens(float(tokens_per_step), np.arange(K)), float)
        else:
            E = np.asarray(tokens_per_step, float)[:K]
            if E.size != K:
                raise RoundModelError(f"tokens per step: one value per k = 0..{K - 1} needed, found {E.size}")
        sp = E * V[0] / V
        lo, hi = speedup_interval_by_k(self.delta_by_k(engine, n_switch))
        return {"V_s": V, "speedup": sp, "speedup_lo": sp * lo, "speedup_hi": sp * hi, "tokens_per_step": E}

    def step_times_routed(self, k: int, distinct: float | None, catch_up: float | None = None) -> tuple[float, float]:
        """(V(0), V(k)) with the deduplicating verify pass of k + 1 tokens at ``distinct`` (expert,
        layer) pairs per pass instead of the calibration's mean (:class:`RoutingTerm`; None: at the
        calibration's) and, where ``catch_up`` is given, the draft at that share of rounds beginning
        with two tokens instead of the calibration's (:meth:`DraftTime.shift_s`); V(0) is unchanged
        (a one-token pass touches m experts per layer whatever the token, and nothing is drafted)."""
        if self.routing is None and distinct is not None:
            raise RoundModelError(f"round model {self.context!r}: no routing term (its calibration recorded no "
                                  f"routing)")
        V = self.step_times("dedup")
        if not 0 <= int(k) <= self.kmax:
            raise RoundModelError(f"round model {self.context!r} covers k = 0..{self.kmax}, asked k = {k}")
        Vk = float(V[int(k)]) + (self.routing.shift_s(int(k), distinct) if k and distinct is not None else 0.0)
        if catch_up is not None:
            Vk += self.draft.shift_s(int(k), catch_up)
        if Vk <= 0:
            raise RoundModelError(f"round model {self.context!r}: V({k}) at {distinct:g} distinct pairs is not "
                                  f"positive")
        return float(V[0]), Vk

    # --- variants ---------------------------------------------------------------------------
    def with_verify(self, tau: dict, source: str, protocol: str = "prediction", half_width: dict | None = None,
                    saving_half_width=None) -> "RoundModel":
        """The same round with the verify terms replaced (e.g. by a version of chain (22)): ``tau``
        {kernel: seconds per n}, ``half_width`` {kernel: the interval's half-width per n} (bound (17),
        eps/(1 - eps) M_p(n); zero when None), ``saving_half_width``: that of the saving (bound (18))."""
        terms = {}
        for p in KERNELS:
            v = np.asarray(tau[p], float)
            w = np.zeros_like(v) if half_width is None else np.asarray(half_width[p], float)
            terms[p] = Term(v, np.maximum(v - w, 1e-12), v + w, np.zeros(v.size, int), f"{source} ({p})", protocol)
        S = terms["slot"].values_s - terms["dedup"].values_s
        sw = np.zeros_like(S) if saving_half_width is None else np.asarray(saving_half_width, float)
        saving = Term(S, S - sw, S + sw, np.zeros(S.size, int), f"{source} (saving)", protocol)
        return replace(self, verify=terms, saving=saving)

    def with_draft(self, draft: DraftTime) -> "RoundModel":
        return replace(self, draft=draft)

    # --- files ------------------------------------------------------------------------------
    def key(self) -> tuple:
        return (self.state, self.context, self.draft.name)

    def to_dict(self) -> dict:
        return {"subject": self.subject, "context": self.context, "state": self.state, "depth": self.depth,
                "regime": self.regime, "read_GBps": self.read_GBps,
                "verify": {p: t.to_dict() for p, t in self.verify.items()},
                "saving": None if self.saving is None else self.saving.to_dict(), "host": self.host.to_dict(),
                "draft": self.draft.to_dict(), "notes": self.notes,
                "routing": None if self.routing is None else self.routing.to_dict()}

    @classmethod
    def from_dict(cls, d: dict) -> "RoundModel":
        try:
            ctx = d["context"]
            return cls(subject=str(d["subject"]), context=str(ctx), state=str(d["state"]),
                       verify={p: Term.from_dict(d["verify"][p], f"round model {ctx!r} verify {p}") for p in KERNELS},
                       host=Term.from_dict(d["host"], f"round model {ctx!r} host"),
                       draft=DraftTime.from_dict(d["draft"]),
                       saving=(None if d.get("saving") is None
                               else Term.from_dict(d["saving"], f"round model {ctx!r} saving")),
                       depth=d.get("depth"), regime=str(d.get("regime", "one")), read_GBps=d.get("read_GBps"),
                       notes=dict(d.get("notes") or {}),
                       routing=None if d.get("routing") is None else RoutingTerm.from_dict(d["routing"]))
        except KeyError as err:
            raise RoundModelError(f"round model: missing field {err}") from None


@dataclass
class RoundModels:
    """The round models of one run (every machine state, context and draft it calibrated), and the
    order of its measurements (``order``: phase -> UTC start time, so that a reader can check when
    every input of a prediction was measured against the runs that test it)."""

    models: list
    order: dict = field(default_factory=dict)

    def select(self, state: str | None = None, context: str | None = None, draft: str | None = None) -> list:
        out = [m for m in self.models if (state is None or m.state == state)
               and (context is None or m.context == context) and (draft is None or m.draft.name == draft)]
        return out

    def get(self, state: str | None = None, context: str | None = None, draft: str | None = None) -> RoundModel:
        """The one round model matching; an error listing what exists when none or several do."""
        found = self.select(state, context, draft)
        if len(found) != 1:
            have = sorted({m.key() for m in self.models})
            raise RoundModelError(f"round models: state={state!r}, context={context!r}, draft={draft!r} match "
                                  f"{len(found)}; the run has (state, context, draft) = {have}")
        return found[0]

    @property
    def states(self) -> list[str]:
        return list(dict.fromkeys(m.state for m in self.models))

    def save(self, path, run: dict | None = None) -> Path:
        """Write the file; ``run``: the stamp of the run that measured it
        (:func:`moespec.validate.run_identity.RunIdentity.record`)."""
        doc = {"schema": SCHEMA_ID, "order": self.order, "models": [m.to_dict() for m in self.models]}
        return io.write_json(path, doc if run is None else {**doc, "run": run})

    @classmethod
    def load(cls, path) -> "RoundModels":
        import json

        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise RoundModelError(f"round model file {path} does not exist (notebook 05 writes it)") from None
        except ValueError as err:
            raise RoundModelError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(d, dict) or d.get("schema") != SCHEMA_ID:
            raise RoundModelError(f"{path}: not a round-model file (schema {SCHEMA_ID!r} expected, found "
                                  f"{d.get('schema') if isinstance(d, dict) else type(d).__name__!r})")
        if not isinstance(d.get("models"), list) or not d["models"]:
            raise RoundModelError(f"{path}: field models: expected a list of at least 1 round model; found "
                                  f"{d.get('models')!r:.60}")
        try:
            return cls([RoundModel.from_dict(m) for m in d["models"]], dict(d.get("order") or {}))
        except RoundModelError as err:
            raise RoundModelError(f"{path}: {err}") from None
