"""One per-position acceptance profile: p_i, the share of verify steps that accepted at least i
drafts (i = 1..K), pooled over every verify step of its source, per prompt where the source has
prompts, and per draft length where the source ran several (moespec's own runs).

Tokens per step at draft length k <= K: G(k) = 1 + p_1 + ... + p_k; G(K) is the mean acceptance
length (the bonus token included, as the engines print it). For k > K nothing was measured: the
rule here holds the last conditional rate c_K = p_K / p_{K-1} (p_0 = 1), p_{K+j} = p_K c_K^j, and
every number it gives is labelled an extrapolation. Intervals: p_i by Wilson's binomial interval
over the verify steps; G(k) by the normal interval of the mean over verify steps of min(accepted,
k) (its variance from the histogram the counts imply); over prompts, where there are prompts, by
a bootstrap that resamples prompts (pooled G and the median prompt's G).

A source that gives only a mean acceptance length (a scalar fallback: SGLang's gauge and log
field, llama.cpp's older log line) has no counts; it carries a geometric acceptance rate and says
so (:attr:`AcceptanceProfile.scalar`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from moespec.validate.errors import InputError

Z95 = 1.959963984540054
BOOTSTRAP = 2000


class AcceptanceError(InputError):
    """An acceptance input that is malformed or inconsistent; the message names file, line or field."""


@dataclass(frozen=True)
class Counts:
    """Verify steps and, per position i = 1..K, the steps that accepted at least i drafts. Counts
    may be reconstructed from printed rates (a log line), so they are floats."""

    steps: float
    at_least: np.ndarray

    @property
    def K(self) -> int:
        return int(self.at_least.size)

    @property
    def p(self) -> np.ndarray:
        return self.at_least / self.steps

    def G(self, kmax: int | None = None) -> np.ndarray:
        """G(k) = 1 + p_1 + ... + p_k for k = 0..min(kmax, K)."""
        p = self.p[: self.K if kmax is None else kmax]
        return np.concatenate([[1.0], 1.0 + np.cumsum(p)])

    def histogram(self) -> np.ndarray:
        """Steps that accepted exactly j drafts, j = 0..K."""
        a = np.concatenate([[self.steps], self.at_least, [0.0]])
        return a[:-1] - a[1:]

    def __add__(self, other: "Counts") -> "Counts":
        if other.K != self.K:
            raise ValueError(f"counts of {self.K} and {other.K} positions do not add")
        return Counts(self.steps + other.steps, self.at_least + other.at_least)


def check_counts(steps, at_least, where: str, field: str = "") -> Counts:
    """Counts, refused in one line naming ``where`` and ``field`` when a count is negative or not a
    number, a position's count is above the step count, or the profile rises with the position."""
    at = f"{field} " if field else ""
    try:
        n = float(steps)
        a = np.asarray(at_least, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise AcceptanceError(f"{where}: {at}counts: expected numbers; found steps {steps!r}, per position "
                              f"{at_least!r:.80}", where=where, field=field or "counts") from None
    if not np.isfinite(n) or n <= 0:
        raise AcceptanceError(f"{where}: {at}verify steps: expected a count > 0; found {steps!r}", where=where,
                              field=field or "steps", expected="> 0", found=steps)
    if a.size == 0:
        raise AcceptanceError(f"{where}: {at}per-position counts: expected at least position 1; found none",
                              where=where, field=field or "positions")
    bad = ~np.isfinite(a) | (a < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise AcceptanceError(f"{where}: {at}position {i + 1}: expected a count >= 0; found {a[i]:g}", where=where,
                              field=f"{field}position {i + 1}", expected=">= 0", found=float(a[i]))
    over = a > n * (1 + 1e-9)
    if over.any():
        i = int(np.argmax(over))
        raise AcceptanceError(f"{where}: {at}position {i + 1}: expected at most the {n:g} verify steps; found "
                              f"{a[i]:g} steps accepting at least {i + 1}", where=where,
                              field=f"{field}position {i + 1}", expected=f"<= {n:g}", found=float(a[i]))
    rise = np.flatnonzero(a[1:] > a[:-1] * (1 + 1e-9) + 1e-9)
    if rise.size:
        i = int(rise[0]) + 1
        raise AcceptanceError(f"{where}: {at}position {i + 1}: expected at most position {i}'s {a[i - 1]:g} (a step "
                              f"that accepted {i + 1} drafts accepted {i}); found {a[i]:g}: the profile rises",
                              where=where, field=f"{field}position {i + 1}", expected=f"<= {a[i - 1]:g}",
                              found=float(a[i]))
    return Counts(n, a)


def wilson(successes, trials, z: float = Z95) -> tuple[np.ndarray, np.ndarray]:
    """Wilson's score interval of a binomial share (arrays)."""
    k, n = np.asarray(successes, float), np.asarray(trials, float)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)


def geometric_G(a: float, kmax: int) -> np.ndarray:
    """G_a(k) = 1 + a + ... + a^k, k = 0..kmax."""
    return np.cumsum(float(a) ** np.arange(kmax + 1))


def best_geometric(G: np.ndarray) -> float:
    """The a in [0, 1) whose G_a(k) is closest to ``G`` (k = 0..K) in least squares."""
    K = len(G) - 1
    grid = np.linspace(0.0, 0.9999, 10000)
    err = ((np.cumsum(grid[:, None] ** np.arange(K + 1), axis=1) - G) ** 2).sum(axis=1)
    a0 = grid[int(np.argmin(err))]
    fine = np.clip(np.linspace(a0 - 1e-4, a0 + 1e-4, 201), 0.0, 0.99999)
    err = ((np.cumsum(fine[:, None] ** np.arange(K + 1), axis=1) - G) ** 2).sum(axis=1)
    return float(fine[int(np.argmin(err))])


@dataclass
class AcceptanceProfile:
    """A per-position acceptance profile (module docstring). ``counts``: pooled over every verify
    step (None for a scalar fallback); ``prompts``: per prompt (empty where the source has none);
    ``at_k``: for sources that ran several draft lengths, the runs at each k (their own profile, K
    = k); ``tokens_at_k``: measured tokens per step of the runs at each k where only those are
    known (no per-position counts); ``scalar``: a geometric acceptance rate standing in for a
    profile the source does not give; ``engine``, ``source`` (the format read), ``files``,
    ``notes`` (what the reader should know: fallbacks, formats not verified)."""

    counts: Counts | None
    engine: str
    source: str
    files: list = field(default_factory=list)
    prompts: dict = field(default_factory=dict)
    at_k: dict = field(default_factory=dict)
    tokens_at_k: dict = field(default_factory=dict)
    scalar: float | None = None
    notes: list = field(default_factory=list)
    scalar_length: float | None = None

    # --- the profile ----------------------------------------------------------------------------
    @property
    def K(self) -> int | None:
        if self.counts is not None:
            return self.counts.K
        return max(self.tokens_at_k) if self.tokens_at_k else None

    @property
    def p(self) -> np.ndarray:
        return self.counts.p

    @property
    def conditional(self) -> np.ndarray:
        """c_i = p_i / p_{i-1} (p_0 = 1); NaN where p_{i-1} = 0."""
        prev = np.concatenate([[1.0], self.p[:-1]])
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(prev > 0, self.p / np.where(prev > 0, prev, 1), np.nan)

    def G(self, kmax: int | None = None) -> np.ndarray:
        """G(k), k = 0..kmax (default K): measured for k <= K, the extrapolation beyond
        (:meth:`extrapolated_from`); a scalar fallback: G_a(k)."""
        if self.counts is None:
            if self.scalar is None or kmax is None:
                raise ValueError("G(k) of a profile without per-position counts: name kmax (a scalar fallback) or "
                                 "read measured_G()")
            return geometric_G(self.scalar, kmax)
        K = self.K
        kmax = K if kmax is None else kmax
        G = self.counts.G(min(kmax, K))
        if kmax <= K:
            return G
        c = np.nan_to_num(self.conditional[-1], nan=0.0)
        extra = self.p[-1] * c ** np.arange(1, kmax - K + 1)
        return np.concatenate([G, G[-1] + np.cumsum(extra)])

    def extrapolated_from(self) -> int | None:
        """The first k whose G(k) is extrapolated (K + 1); None for a scalar fallback."""
        return None if self.counts is None else self.K + 1

    @property
    def mean_acceptance_length(self) -> float:
        """G(K): tokens per verify step, the bonus token included."""
        if self.counts is None:
            return float(self.scalar_length if self.scalar is not None else self.tokens_at_k[self.K])
        return float(self.G()[-1])

    # --- intervals ------------------------------------------------------------------------------
    def p_interval(self) -> tuple[np.ndarray, np.ndarray]:
        """Wilson 95 % interval of each p_i over the verify steps."""
        return wilson(self.counts.at_least, self.counts.steps)

    def G_interval(self) -> tuple[np.ndarray, np.ndarray]:
        """95 % interval of G(k), k = 1..K, over the verify steps: G(k) - 1 is the mean over steps
        of min(accepted, k), its variance from the histogram of accepted counts."""
        h, n = self.counts.histogram(), self.counts.steps
        j = np.arange(h.size)
        lo, hi = [], []
        for k in range(1, self.K + 1):
            x = np.minimum(j, k)
            mean = (h * x).sum() / n
            se = np.sqrt(max((h * x * x).sum() / n - mean * mean, 0.0) / n)
            lo.append(1 + mean - Z95 * se)
            hi.append(1 + mean + Z95 * se)
        return np.array(lo), np.array(hi)

    def prompt_G(self) -> tuple[list, np.ndarray]:
        """(prompt names, G_p(k) for k = 0..K per prompt) of the prompts with K positions."""
        names = [n for n, c in self.prompts.items() if c.K == self.K]
        return names, np.array([self.prompts[n].G() for n in names])

    def median_prompt_G(self) -> np.ndarray | None:
        """The median over prompts of each prompt's G(k), k = 0..K; None without prompts."""
        names, Gp = self.prompt_G()
        return np.median(Gp, axis=0) if names else None

    def bootstrap(self, B: int = BOOTSTRAP, seed: int = 0) -> dict | None:
        """Prompts resampled with replacement ``B`` times: 95 % intervals (k = 1..K) of the pooled
        G(k) and of the median prompt's G(k); None with fewer than two prompts."""
        names, Gp = self.prompt_G()
        if len(names) < 2:
            return None
        A = np.array([self.prompts[n].at_least for n in names])
        N = np.array([self.prompts[n].steps for n in names])
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, len(names), size=(B, len(names)))
        W = np.zeros((B, len(names)))
        np.add.at(W, (np.arange(B)[:, None], idx), 1.0)
        pooled = 1 + np.cumsum((W @ A) / (W @ N)[:, None], axis=1)
        median = np.median(Gp[idx][:, :, 1:], axis=1)
        q = lambda x: (np.quantile(x, 0.025, axis=0), np.quantile(x, 0.975, axis=0))   # noqa: E731
        return {"prompts": len(names), "resamples": B, "pooled": q(pooled), "median_prompt": q(median)}

    # --- against geometric acceptance -----------------------------------------------------------
    def geometric_fit(self) -> tuple[float, float]:
        """(a, distance): the geometric acceptance rate whose G_a(k) is closest to this G(k)
        (k = 0..K, least squares) and the largest relative difference |G_a(k) / G(k) - 1|."""
        if self.counts is None and self.scalar is not None:
            return self.scalar, 0.0
        G = self.G() if self.counts is not None else self.measured_G()
        a = best_geometric(G)
        return a, float(np.max(np.abs(geometric_G(a, len(G) - 1) / G - 1)))

    def measured_G(self) -> np.ndarray:
        """G(k), k = 0..K, from the runs at each draft length where the source has them
        (:attr:`tokens_at_k` or :attr:`at_k`), else the pooled profile."""
        if self.tokens_at_k:
            return np.array([1.0] + [self.tokens_at_k[k] for k in range(1, self.K + 1)])
        return self.G()

    # --- tokens per step for a decision -----------------------------------------------------------
    def tokens_per_step(self, kmax: int, per_prompt: bool | None = None) -> tuple[np.ndarray, str]:
        """(E(k) for k = 0..kmax, how): the tokens per step a decision uses. Per prompt (default
        where the source has prompts): the median over prompts of each prompt's tokens per step,
        as notebook 05 scores its runs; else pooled over every verify step. The runs at each k
        give E(k) where the source has them; beyond what was measured, the extrapolation."""
        if self.counts is None and self.scalar is not None:
            return geometric_G(self.scalar, kmax), f"geometric G_a(k) at a = {self.scalar:.3f} ({self.source})"
        use_prompts = bool(self.prompts) if per_prompt is None else per_prompt
        E = np.ones(kmax + 1)
        measured = []
        for k in range(1, kmax + 1):
            if k in self.tokens_at_k:
                E[k] = self.tokens_at_k[k]
            elif k in self.at_k:
                run = self.at_k[k]
                med = run.median_prompt_G() if use_prompts else None
                E[k] = med[k] if med is not None else run.counts.G()[k]
            else:
                continue
            measured.append(k)
        what = "the median prompt's" if use_prompts and self.prompts else "pooled"
        if self.tokens_at_k:
            what = "the measured"
        if measured:
            rest = [k for k in range(1, kmax + 1) if k not in measured]
            how = f"{what} tokens per step of the runs at each draft length k = {_span(measured)}"
            if rest and self.counts is not None:
                G = self.G(kmax)
                E[rest] = G[rest]
                how += f"; k = {_span(rest)} from the pooled profile"
            elif rest:
                raise AcceptanceError(f"{', '.join(self.files) or self.source}: runs at k = {_span(measured)}; the "
                                      f"decision needs k up to {kmax}", where=", ".join(self.files), field="k")
        else:
            base = self.median_prompt_G() if use_prompts and self.prompts else None
            E = self.G(kmax)
            if base is not None:
                E[: base.size] = base
            how = f"{what} G(k) = 1 + p_1 + ... + p_k of the profile (K = {self.K})"
        if self.counts is not None and kmax > max(self.K, max(measured, default=0)):
            first = max(self.K, max(measured, default=0)) + 1
            how += (f"; k >= {first}: extrapolated (the last conditional rate "
                    f"{np.nan_to_num(self.conditional[-1]):.3f} held)")
        return E, how

    # --- output ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """The profile as JSON: ``K``, ``p`` (p_1 first), ``G`` (G(1) first), ``mean_acceptance_length``,
        intervals, conditional rates, the geometric fit, per-prompt profiles where there are prompts."""
        out = {"engine": self.engine, "source": self.source, "files": list(self.files), "notes": list(self.notes),
               "K": self.K, "scalar_fallback": self.counts is None and self.scalar is not None}
        if self.counts is None:
            G = self.measured_G() if self.scalar is None else [1.0]
            a, dist = self.geometric_fit()
            out.update(p=None, G=[float(x) for x in G[1:]], mean_acceptance_length=self.mean_acceptance_length,
                       geometric_fit={"a": a, "largest_relative_difference": dist},
                       a=self.scalar, verify_steps=None)
            if self.tokens_at_k:
                out["G_measured_at_k"] = {str(k): float(v) for k, v in sorted(self.tokens_at_k.items())}
            return out
        p_lo, p_hi = self.p_interval()
        G_lo, G_hi = self.G_interval()
        a, dist = self.geometric_fit()
        out.update(verify_steps=float(self.counts.steps), p=_floats(self.p), p_lo=_floats(p_lo), p_hi=_floats(p_hi),
                   conditional=[None if np.isnan(c) else float(c) for c in self.conditional],
                   G=_floats(self.G()[1:]), G_lo=_floats(G_lo), G_hi=_floats(G_hi),
                   mean_acceptance_length=self.mean_acceptance_length,
                   geometric_fit={"a": a, "largest_relative_difference": dist},
                   beyond_K=f"k > {self.K}: the last conditional rate held (an extrapolation)")
        if self.prompts:
            med = self.median_prompt_G()
            out["median_prompt_G"] = None if med is None else _floats(med[1:])
            boot = self.bootstrap()
            if boot is not None:
                out["bootstrap_over_prompts"] = {
                    "prompts": boot["prompts"], "resamples": boot["resamples"],
                    "G_lo": _floats(boot["pooled"][0]), "G_hi": _floats(boot["pooled"][1]),
                    "median_prompt_G_lo": _floats(boot["median_prompt"][0]),
                    "median_prompt_G_hi": _floats(boot["median_prompt"][1])}
            out["prompts"] = [{"prompt": n, "verify_steps": float(c.steps), "K": c.K, "p": _floats(c.p),
                               "G": _floats(c.G()[1:])} for n, c in self.prompts.items()]
        if self.at_k:
            out["G_measured_at_k"] = {str(k): float(run.counts.G()[k]) for k, run in sorted(self.at_k.items())}
        return out


def _floats(x) -> list:
    return [float(v) for v in x]


def _span(ks) -> str:
    ks = sorted(ks)
    return f"{ks[0]}..{ks[-1]}" if len(ks) > 1 and ks == list(range(ks[0], ks[-1] + 1)) else ", ".join(map(str, ks))


def pool(profiles: list, where: str) -> AcceptanceProfile:
    """Profiles of one kind pooled by their counts (verify steps and per-position counts add);
    prompts kept apart (a prompt named in two files is refused)."""
    first = profiles[0]
    if len(profiles) == 1:
        return first
    if any(p.counts is None for p in profiles):
        raise AcceptanceError(f"{where}: expected per-position counts in every file to pool them; found a scalar "
                              "fallback among them", where=where)
    Ks = sorted({p.K for p in profiles})
    if len(Ks) > 1:
        raise AcceptanceError(f"{where}: expected one draft length K in the files pooled; found K = {Ks}",
                              where=where, field="K", found=Ks)
    counts, prompts = first.counts, dict(first.prompts)
    for p in profiles[1:]:
        counts = counts + p.counts
        for name, c in p.prompts.items():
            if name in prompts:
                raise AcceptanceError(f"{where}: prompt {name!r}: expected once across the files; found twice",
                                      where=where, field="prompt", found=name)
            prompts[name] = c
    return AcceptanceProfile(counts, first.engine, first.source, [f for p in profiles for f in p.files], prompts,
                             notes=list(dict.fromkeys(n for p in profiles for n in p.notes)))
