"""Input checks and array helpers shared by the theory modules.

Every theory function accepts Python numbers, ``fractions.Fraction`` or numpy arrays. Exact
inputs (ints and Fractions) stay exact: they are held in numpy *object* arrays, on which
``+ - * /`` and comparisons act element by element with Python's exact arithmetic. Float
inputs become float64 arrays, so the same code is vectorized.
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction

import numpy as np


def is_exact(x) -> bool:
    """True when ``x`` (a number or an array/sequence of them) holds only ints and Fractions."""
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            return all(isinstance(v, (int, Fraction)) and not isinstance(v, bool) for v in x.flat)
        return x.dtype.kind in "iu"
    if isinstance(x, (list, tuple)):
        return all(is_exact(v) for v in x)
    return isinstance(x, (numbers.Rational, np.integer)) and not isinstance(x, (bool, np.bool_))


def as_array(x, name: str) -> np.ndarray:
    """``x`` as an array: object dtype (exact) when it holds only ints/Fractions, else float64."""
    if is_exact(x):
        arr = np.asarray(x, dtype=object)
        return np.vectorize(lambda v: Fraction(int(v)) if isinstance(v, (int, np.integer)) else v,
                            otypes=[object])(arr) if arr.size else arr
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected numbers or an array of numbers, got {x!r}") from err


def scalar_out(value, like_scalar: bool):
    """Return a Python scalar (int, float or Fraction) when the caller passed scalars, else the array."""
    if like_scalar and isinstance(value, np.ndarray):
        return value.reshape(()).item() if value.ndim == 0 else value
    if like_scalar and isinstance(value, np.generic):
        return value.item()
    return value


def is_scalar(x) -> bool:
    return np.ndim(x) == 0


def check_acceptance(a, name: str = "a") -> np.ndarray:
    """The acceptance rate(s) as an array; every value must lie in [0, 1) (geometric acceptance)."""
    arr = as_array(a, name)
    if arr.dtype == float and np.isnan(arr).any():
        raise ValueError(f"{name}: acceptance rate is NaN")
    bad = (arr < 0) | (arr >= 1)
    if np.any(bad):
        first = arr[bad].flat[0] if arr.ndim else arr.item()
        raise ValueError(f"{name}: acceptance rate must lie in [0, 1); found {first!r}")
    return arr


def check_step_times(V, name: str = "V", min_len: int = 1) -> np.ndarray:
    """The step-time vector (V(0), ..., V(kmax)) as a 1-D array of positive, finite values."""
    arr = as_array(V, name)
    if arr.ndim != 1:
        raise ValueError(f"{name}: step times must be a 1-D vector V(0..kmax); found shape {arr.shape}")
    if arr.shape[0] < min_len:
        raise ValueError(f"{name}: need at least {min_len} step time(s) V(0..kmax); found {arr.shape[0]}")
    if arr.dtype == float and not np.isfinite(arr).all():
        raise ValueError(f"{name}: step times must be finite; found {arr[~np.isfinite(arr)][0]!r}")
    if np.any(arr <= 0):
        raise ValueError(f"{name}: step times must be positive; found V({int(np.argmax(arr <= 0))}) = "
                         f"{arr[arr <= 0][0]!r}")
    return arr


def check_draft_length(k, kmax: int | None = None, name: str = "k", min_k: int = 0) -> int:
    """A draft length: an integer in [min_k, kmax] (or >= min_k when there is no kmax)."""
    allowed = f"an integer in [{min_k}, {kmax}]" if kmax is not None else f"an integer >= {min_k}"
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}: draft length must be {allowed}; found {k!r}")
    k = int(k)
    if k < min_k or (kmax is not None and k > kmax):
        raise ValueError(f"{name}: draft length must be {allowed}; found {k}")
    return k


def check_unit_interval(x, name: str, upper: float = 1.0) -> float:
    """A relative error bound in [0, upper)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: expected a number in [0, {upper}); found {x!r}")
    if not (0 <= x < upper) or (isinstance(x, float) and math.isnan(x)):
        raise ValueError(f"{name}: must lie in [0, {upper}); found {x!r}")
    return x


def check_range(x, name: str, low: float = -math.inf, high: float = math.inf,
                low_open: bool = False, high_open: bool = True, what: str = ""):
    """Every value of ``x`` (a number or an array) is a number in the interval from ``low`` to
    ``high`` (open or closed at each end; an infinite end is always open). NaN is never in range.
    Returns ``x`` unchanged; raises ``ValueError`` naming the argument, the interval and the
    first value outside it."""
    arr = as_array(x, name)
    low_open = low_open or low == -math.inf
    high_open = high_open or high == math.inf
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    bad = (arr <= low) if low_open else (arr < low)
    bad = bad | ((arr >= high) if high_open else (arr > high))
    if arr.dtype == float:
        bad = bad | np.isnan(arr)
    bad = np.asarray(bad, dtype=bool)
    if bad.any():
        where = "" if arr.ndim == 0 else f" at index {tuple(int(i) for i in np.argwhere(bad)[0])}"
        first = arr[bad].flat[0]
        first = first.item() if isinstance(first, np.generic) else first
        shown = str(first) if isinstance(first, Fraction) else repr(first)
        rule = f"be {what}, in {interval}" if what else f"lie in {interval}"
        raise ValueError(f"{name}: must {rule}; found {shown}{where}")
    return x


def check_positive(x, name: str):
    """Positive and finite: every value in (0, inf)."""
    return check_range(x, name, 0, low_open=True, what="positive and finite")


def check_nonnegative(x, name: str):
    """Non-negative and finite: every value in [0, inf)."""
    return check_range(x, name, 0, what="non-negative and finite")


def check_finite(x, name: str):
    """Finite: every value in (-inf, inf)."""
    return check_range(x, name, what="finite")


def exact_or_float(*values):
    """The inputs of one formula in one arithmetic. When every input is exact (ints, Fractions or
    arrays of them; ``None`` is passed through) ints become Fractions, so that divisions stay exact;
    as soon as one input is a float (or a float array) every number becomes a float and every array
    float64, so that float input gives float arrays, never object arrays of Fractions and floats."""
    exact = all(is_exact(v) for v in values if v is not None)

    def convert(v):
        if v is None:
            return None
        if isinstance(v, (list, tuple, np.ndarray)):
            return as_array(v, "value") if exact else np.asarray(v, dtype=float)
        return num(v) if exact else float(v)

    return [convert(v) for v in values]


def harmonize(*arrays: np.ndarray) -> list[np.ndarray]:
    """Keep all arrays exact (object) only when all are exact; otherwise make all float64,
    so that mixed exact/float input never yields slow object arrays of floats."""
    if all(arr.dtype == object for arr in arrays):
        return list(arrays)
    return [arr.astype(float) for arr in arrays]


def num(x):
    """A scalar input made safe for exact division: Python/numpy ints become Fractions
    (int / int would give a float), every other number is returned unchanged."""
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return Fraction(int(x))
    return x
