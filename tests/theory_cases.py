"""Random instances for the theory tests (numpy Generator -> exact Fractions)."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np


def frac(rng: np.random.Generator, lo: int, hi: int, den: int = 40) -> F:
    """A Fraction p/den with lo*den <= p < hi*den."""
    return F(int(rng.integers(lo * den, hi * den)), den)


def acceptance(rng: np.random.Generator, den: int = 997) -> F:
    """An exact acceptance rate in [0, 1)."""
    return F(int(rng.integers(0, den)), den)


def step_times(rng: np.random.Generator, kmax: int | None = None) -> list[F]:
    """A positive step-time vector V(0..kmax) with increments of either sign (mostly positive),
    scaled so that speculation pays somewhere in [0, 1) often enough to be interesting."""
    kmax = int(rng.integers(1, 7)) if kmax is None else kmax
    V = [F(1)]
    for _ in range(kmax):
        c = F(int(rng.integers(-10, 60)), 100)
        V.append(max(V[-1] + c, F(1, 20)))
    return V


def convex_step_times(rng: np.random.Generator, kmax: int | None = None) -> list[F]:
    """V(0) > 0 with increments 0 <= c_1 <= c_2 <= ... (convex, non-decreasing; eq. B.36)."""
    kmax = int(rng.integers(1, 7)) if kmax is None else kmax
    c = sorted(F(int(rng.integers(0, 80)), 100) for _ in range(kmax))
    V = [F(int(rng.integers(50, 150)), 100)]
    for ci in c:
        V.append(V[-1] + ci)
    return V
