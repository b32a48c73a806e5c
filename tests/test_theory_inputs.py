"""Theory inputs (issue 17, item 4): float input gives float arrays and exact input exact
Fractions; NaN or infinite arguments are refused with a message naming the argument and the
allowed interval; a key-value sequence too short for k is named, not a bare IndexError."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from moespec import theory as th

A = np.array([0.3, 0.6])
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("name,call", [
    ("reuse_threshold", lambda a: th.reuse_threshold(a, 2, 8, 100, 1.0, 50.0, 60.0)),
    ("reuse_threshold, int sizes", lambda a: th.reuse_threshold(a, 2, 8, 100, 1, 50, 60)),
    ("byte_threshold", lambda a: th.byte_threshold(a, 2, 8, 100)),
    ("byte_threshold with kv", lambda a: th.byte_threshold(a, 2, 8, 100, D=10, kv=[0, 1, 2])),
    ("dedup_speedup", lambda a: th.dedup_speedup(a, 2, 8, 100, 0.3, 1, 50, 60)),
])
def test_float_acceptance_gives_float_arrays(name, call):
    out = call(A)
    assert out.dtype == np.float64, f"{name}: {out.dtype}"
    assert not np.isnan(out).any()                       # np.isnan raised on the old object arrays
    scalar = call(0.3)
    assert type(scalar) is float and scalar == pytest.approx(float(out[0]), rel=1e-15)


def test_float_values_match_exact_ones():
    """The float path computes the same formula: equal to the exact result rounded."""
    exact = th.byte_threshold(F(13, 20), 2, 8, 100, D=10, kv=[0, 1, 2])
    assert isinstance(exact, F)
    assert th.byte_threshold(0.65, 2, 8, 100, D=10, kv=[0, 1, 2]) == pytest.approx(float(exact), rel=1e-14)
    exact = th.reuse_threshold(F(13, 20), 2, 8, 100, 1, 50, 60, delta_D=4, beta_D=8, delta_phi=F(-1, 10))
    assert isinstance(exact, F)
    assert th.reuse_threshold(0.65, 2, 8, 100, 1, 50, 60, delta_D=4, beta_D=8, delta_phi=-0.1) == \
        pytest.approx(float(exact), rel=1e-14)


def test_exact_input_stays_exact():
    # paper 1's worked example: a = 13/20 gives rho*_1 = 7/20 with one bandwidth (eq. 16)
    assert th.byte_threshold(F(13, 20), 1, 1, 1) == F(7, 20)
    arr = th.byte_threshold(np.array([F(13, 20), F(1, 2)], dtype=object), 1, 1, 1)
    assert arr.dtype == object and arr[0] == F(7, 20)
    assert th.slot_expert_bytes(8, 100, 3).tolist() == [800, 1600, 2400]
    assert th.slot_expert_bytes(8, 100.0, 3).dtype == np.float64


@pytest.mark.parametrize("kwargs,argument,interval", [
    (dict(delta_phi=NAN), "delta_phi", r"\(-inf, inf\)"),
    (dict(delta_phi=INF), "delta_phi", r"\(-inf, inf\)"),
    (dict(delta_D=NAN, beta_D=1.0), "delta_D", r"\[0, inf\)"),
    (dict(delta_D=1.0, beta_D=NAN), "beta_D", r"\(0, inf\)"),
    (dict(tau1=NAN), "tau1", r"\(0, inf\)"),
    (dict(B_k=INF), "B_k", r"\(0, inf\)"),
])
def test_reuse_threshold_refuses_non_finite(kwargs, argument, interval):
    args = dict(a=0.5, k=2, m=8, W=100, tau1=1.0, beta1=50.0, B_k=60.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=rf"^{argument}: must be .* in {interval}; found"):
        th.reuse_threshold(**args)


def test_byte_threshold_and_speedup_refuse_non_finite():
    with pytest.raises(ValueError, match=r"^D: must be non-negative and finite, in \[0, inf\); found nan"):
        th.byte_threshold(0.5, 2, 8, 100, D=NAN)
    with pytest.raises(ValueError, match=r"^kv\(2\): must be non-negative and finite, in \[0, inf\); found nan"):
        th.byte_threshold(0.5, 2, 8, 100, kv=[0, 1, NAN])
    with pytest.raises(ValueError, match=r"^rho_bar_k: must lie in \[0, 1\]; found nan"):
        th.dedup_speedup(0.5, 2, 8, 100, NAN, 1, 50, 60)
    with pytest.raises(ValueError, match=r"^W: must be positive and finite, in \(0, inf\); found inf"):
        th.byte_threshold(0.5, 2, 8, INF)


def test_short_kv_is_named():
    with pytest.raises(ValueError, match=r"kv: needs the cache bytes kv\(0..3\) \(4 values\) for k = 3; found 2"):
        th.byte_threshold(0.5, 3, 8, 100, kv=[0, 1])
    with pytest.raises(TypeError, match="kv: expected None, a sequence"):
        th.byte_threshold(0.5, 1, 8, 100, kv=3)


def test_draft_length_messages_name_the_interval():
    with pytest.raises(ValueError) as err:
        th.byte_threshold(0.5, 0, 8, 100)
    assert str(err.value) == "k: draft length must be an integer >= 1; found 0"
    with pytest.raises(ValueError, match=r"k: draft length must be an integer in \[0, 2\]; found 3"):
        th.speedup([1.0, 1.5, 1.9], 0.5, 3)
    with pytest.raises(TypeError, match=r"k: draft length must be an integer >= 1; found 1.5"):
        th.byte_threshold(0.5, 1.5, 8, 100)


def test_verify_time_refuses_nan_with_the_argument_named():
    with pytest.raises(ValueError, match=r"^expert_bytes: must be non-negative and finite, in \[0, inf\); found nan "
                                         r"at index \(1,\)"):
        th.VerifyTime([1.0, NAN], [1.0, 1.0])
    with pytest.raises(ValueError, match=r"^bandwidth \(beta_p\(n\)\): must be positive and finite"):
        th.VerifyTime([1.0, 2.0], [1.0, INF])
    with pytest.raises(ValueError, match=r"^t0: must be non-negative"):
        th.VerifyTime([1.0, 2.0], [1.0, 1.0], t0=NAN)
    with pytest.raises(ValueError, match=r"^ubar: must be positive and finite"):
        th.kernels_agree([0.5, NAN], [0.9, 0.8], 0.05)
