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
    """A draft length: an integer in [min_k, kmax]."""
    if isinstance(k, (bool, np.bool_)) or not isinstance(k, (numbers.Integral, np.integer)):
        raise TypeError(f"{name}: draft length must be an integer; found {k!r}")
    k = int(k)
    if k < min_k or (kmax is not None and k > kmax):
        hi = "" if kmax is None else f", {kmax}"
        raise ValueError(f"{name}: draft length must lie in [{min_k}{hi}]; found {k}")
    return k


def check_unit_interval(x, name: str, upper: float = 1.0) -> float:
    """A relative error bound in [0, upper)."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        raise TypeError(f"{name}: expected a number in [0, {upper}); found {x!r}")
    if not (0 <= x < upper) or (isinstance(x, float) and math.isnan(x)):
        raise ValueError(f"{name}: must lie in [0, {upper}); found {x!r}")
    return x


def check_positive(x, name: str):
    arr = as_array(x, name)
    if (arr.dtype == float and not np.isfinite(arr).all()) or np.any(arr <= 0):
        raise ValueError(f"{name}: must be positive and finite; found {x!r}")
    return x


def check_nonnegative(x, name: str):
    arr = as_array(x, name)
    if (arr.dtype == float and not np.isfinite(arr).all()) or np.any(arr < 0):
        raise ValueError(f"{name}: must be non-negative and finite; found {x!r}")
    return x


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
