"""The fits (4) and (E.1), epsilon, Table 1's bandwidths and the transfer test, on synthetic timings."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moespec import fit
from moespec.measure.ids import chosen_ids, u_grid
from moespec.routing.stats import pass_union

M, N, B = 8, 64, 6_000_000
TRUE = {"slot": {"t_op": 2e-4, "c_u": 3e-11, "c_re": 0.8e-11},
        "dedup": {"t_op": 5e-4, "c_g": 5e-11, "c_t": 1e-4}}


def synthetic_rows(noise=0.02, seed=0, layers=(0, 1), model="toy", b=B, true=TRUE, windows=True):
    rng = np.random.default_rng(seed)
    rows = []
    pid = 0
    for layer in layers:
        for n in range(1, 10):
            for U in u_grid(n, M, N, 6):
                pid += 1
                for kernel in fit.KERNELS:
                    t = fit.fitted_time(kernel, true[kernel], n, M, U, b)[0] * (1 + noise * rng.standard_normal())
                    rows.append(dict(model=model, backend="torch", fmt="bf16", layer=layer, kind="chosen",
                                     kernel=kernel, n=n, m=M, U=U, expert_bytes=b, t_median_s=t, pass_id=pid))
            if windows:
                for _ in range(4):
                    pid += 1
                    U = int(rng.integers(M, min(N, n * M) + 1))
                    for kernel in fit.KERNELS:
                        t = fit.fitted_time(kernel, true[kernel], n, M, U, b)[0] * (1 + noise * rng.standard_normal())
                        rows.append(dict(model=model, backend="torch", fmt="bf16", layer=layer, kind="window",
                                         kernel=kernel, n=n, m=M, U=U, expert_bytes=b, t_median_s=t, pass_id=pid))
    return pd.DataFrame(rows)


def test_fits_recover_known_coefficients_with_noise():
    fits = fit.fit_layers(synthetic_rows(noise=0.01))
    assert len(fits) == 4  # 2 layers x 2 kernels
    for _, r in fits.iterrows():
        for name, true in TRUE[r["kernel"]].items():
            assert r[name] == pytest.approx(true, rel=0.15), (r["kernel"], name)
    slot = fits[fits["kernel"] == "slot"]
    assert np.allclose(slot["reread_cost"], 0.8 / 3, rtol=0.15)


def test_fits_exact_without_noise():
    fits = fit.fit_layers(synthetic_rows(noise=0.0))
    for _, r in fits.iterrows():
        for name, true in TRUE[r["kernel"]].items():
            assert r[name] == pytest.approx(true, rel=1e-6)
        assert r["fit_median_rel_err"] < 1e-9


def test_epsilon_zero_on_exact_model_and_tracks_noise():
    exact = synthetic_rows(noise=0.0)
    err = fit.window_errors(fit.fit_layers(exact), exact)
    assert np.abs(err["rel_err"]).max() < 1e-8
    eps = fit.epsilon(err)
    assert eps["eps_engine"].iloc[0] < 1e-8
    noisy = synthetic_rows(noise=0.05, seed=3)
    eps = fit.epsilon(fit.window_errors(fit.fit_layers(noisy), noisy)).iloc[0]
    # median |N(0, 0.05)| = 0.05 * 0.674; a fit on ~60 passes adds little
    assert 0.02 < eps["eps_slot"] < 0.06 and 0.02 < eps["eps_dedup"] < 0.06
    assert eps["eps_engine"] == max(eps["eps_slot"], eps["eps_dedup"])
    assert eps["fits_slot"] == 2


def test_bandwidth_table_sums_hand_checked():
    rows = pd.DataFrame([
        dict(model="a", layer=0, kind="window", kernel="slot", n=2, m=2, U=3, expert_bytes=1e9, t_median_s=1.0, pass_id=1),
        dict(model="a", layer=0, kind="window", kernel="dedup", n=2, m=2, U=3, expert_bytes=1e9, t_median_s=2.0, pass_id=1),
        dict(model="a", layer=1, kind="window", kernel="slot", n=2, m=2, U=2, expert_bytes=1e9, t_median_s=3.0, pass_id=2),
        dict(model="a", layer=1, kind="window", kernel="dedup", n=2, m=2, U=2, expert_bytes=1e9, t_median_s=2.0, pass_id=2),
    ])
    bw = fit.bandwidth_table(rows).iloc[0]
    assert bw["beta_slot_GBps"] == pytest.approx(8 / 4)      # (4+4) GB over (1+3) s
    assert bw["beta_dedup_GBps"] == pytest.approx(5 / 4)     # (3+2) GB over (2+2) s
    assert bw["r"] == pytest.approx(5 / 8)
    assert bw["ubar"] == pytest.approx(5 / 8)


def test_transfer_recovers_exact_power_law():
    rows = []
    for model, b in (("a", 2e6), ("b", 6e6), ("c", 2e7), ("d", 5e7)):
        for n in range(2, 10):
            rows.append(dict(model=model, n=n, expert_bytes=b,
                             beta_slot_GBps=30 * n ** 0.4 * (b / 1e7) ** 0.2,
                             beta_dedup_GBps=10 * n ** 0.3 * (b / 1e7) ** 0.1))
    bw = pd.DataFrame(rows)
    bw["r"] = bw["beta_dedup_GBps"] / bw["beta_slot_GBps"]
    out = fit.transfer(bw)
    assert np.abs(out[["beta_slot_rel_err", "beta_dedup_rel_err", "r_rel_err"]].to_numpy()).max() < 1e-9
    with pytest.raises(ValueError, match="at least 3 models"):
        fit.transfer(bw[bw["model"].isin(["a", "b"])])


@pytest.mark.parametrize("col,value,match", [
    ("t_median_s", np.nan, "t_median_s.*not a number"),
    ("t_median_s", -1.0, "t_median_s must be > 0"),
    ("t_median_s", 0.0, "t_median_s must be > 0"),
    ("U", 100, "outside"),
    ("t_median_s", np.inf, r"column 't_median_s' must be finite; row 5 has inf"),
    ("t_median_s", -np.inf, r"column 't_median_s' must be finite; row 5 has -inf"),
    ("expert_bytes", np.inf, r"column 'expert_bytes' must be finite; row 5 has inf"),
    ("t_median_s", "inf", r"column 't_median_s' must be finite; row 5 has inf"),   # as read from a CSV
])
def test_bad_rows_rejected(col, value, match):
    rows = synthetic_rows(noise=0.0, layers=(0,))
    rows[col] = rows[col].astype(object if isinstance(value, str) else float)
    rows.loc[5, col] = value
    with pytest.raises(ValueError, match=match):
        fit.fit_layers(rows)


def test_infinite_window_timing_is_named_before_epsilon():
    """An inf in a window row (which the fits do not use) stops window_errors, naming the row,
    instead of giving epsilon NaN."""
    rows = synthetic_rows(noise=0.0, layers=(0,))
    fits = fit.fit_layers(rows)
    i = rows.index[rows["kind"] == "window"][3]
    rows.loc[i, "t_median_s"] = np.inf
    with pytest.raises(ValueError, match=rf"'t_median_s' must be finite; row {i} has inf"):
        fit.window_errors(fits, rows)


def test_missing_column_rejected():
    rows = synthetic_rows(noise=0.0, layers=(0,)).drop(columns=["expert_bytes"])
    with pytest.raises(ValueError, match=r"missing column.*expert_bytes"):
        fit.fit_layers(rows)


def test_undetermined_fit_rejected():
    rows = synthetic_rows(noise=0.0, layers=(0,))
    with pytest.raises(ValueError, match="undetermined"):
        fit.fit_layers(rows, ns=[2])  # n = 2 only: for dedup, n is constant -> rank 2


@pytest.mark.parametrize("n,m,N", [(1, 8, 64), (2, 8, 64), (5, 4, 32), (9, 8, 64), (9, 6, 64), (3, 8, 128), (4, 3, 5)])
def test_chosen_ids_hit_every_reachable_u(n, m, N):
    rng = np.random.default_rng(n * 100 + m)
    for U in range(m, min(N, n * m) + 1):
        ids = chosen_ids(n, m, N, U, rng)
        assert ids.shape == (n, m)
        assert pass_union(ids, N) == U
        assert ids.min() >= 0 and ids.max() < N
        assert all(len(set(row)) == m for row in ids), "an expert repeats within a token"


@pytest.mark.parametrize("n,m,N,U", [(2, 8, 64, 7), (2, 8, 64, 17), (9, 8, 64, 65), (3, 4, 8, 9), (1, 8, 64, 9), (0, 8, 64, 8)])
def test_chosen_ids_reject_impossible(n, m, N, U):
    with pytest.raises(ValueError, match="U=|need n >= 1"):
        chosen_ids(n, m, N, U, np.random.default_rng(0))


def test_u_grid_spans_both_ends():
    assert u_grid(9, 8, 64, 5) == [8, 22, 36, 50, 64]
    assert u_grid(2, 8, 64) == list(range(8, 17))


# --- the non-negative fit (phi_p >= 0, eq. (5)) -------------------------------------------------

def _hand_passes(kernel):
    """Chosen-id passes at n = 2..9 (U over its range) for one layer: arrays n, m, U, b."""
    n, U = zip(*[(k, u) for k in range(2, 10) for u in u_grid(k, M, N, 4)])
    n, U = np.array(n), np.array(U)
    return n, np.full_like(n, M), U, np.full(len(n), float(B))


@pytest.mark.parametrize("kernel", fit.KERNELS)
def test_nonnegative_fit_binds_t_op_at_zero_with_the_exact_nnls_slopes(kernel):
    # a law with t_op = 0, every pass shortened by the same 0.3 ms: the unconstrained intercept
    # is exactly -0.3 ms; with t_op >= 0 the bound binds and the slopes are the least squares
    # through the origin on the other two regressors (the NNLS solution, as its KKT conditions say)
    law = {**TRUE[kernel], "t_op": 0.0}
    n, m, U, b = _hand_passes(kernel)
    t = fit.fitted_time(kernel, law, n, m, U, b) - 3e-4
    free = fit.fit_one(kernel, n, m, U, b, t, fit=fit.UNCONSTRAINED)
    assert free["t_op"] == pytest.approx(-3e-4, rel=1e-9) and free["fit"] == "unconstrained"
    bound = fit.fit_one(kernel, n, m, U, b, t)
    assert bound["fit"] == "nonnegative" and bound["t_op"] == 0.0
    X = fit.design(kernel, n, m, U, b)
    slopes = np.linalg.solve(X[:, 1:].T @ X[:, 1:], X[:, 1:].T @ t)   # normal equations without t_op
    assert (slopes > 0).all()
    names = fit.COEFS[kernel]
    assert [bound[c] for c in names[1:]] == pytest.approx(slopes.tolist(), rel=1e-9)
    beta = np.array([bound[c] for c in names])
    resid = X @ beta - t
    grad = (X / np.abs(X).max(axis=0)).T @ resid   # KKT on the scaled columns: > 0 at the bound, 0 where free
    assert grad[0] > 1e-3 * np.abs(resid).sum()
    assert grad[1:] == pytest.approx([0, 0], abs=1e-9 * np.abs(resid).sum())


@pytest.mark.parametrize("kernel", fit.KERNELS)
def test_nonnegative_fit_agrees_with_scipy_nnls(kernel):
    from scipy.optimize import nnls

    rng = np.random.default_rng(3)
    n, m, U, b = _hand_passes(kernel)
    law = {**TRUE[kernel], "t_op": 0.0}
    t = fit.fitted_time(kernel, law, n, m, U, b) * (1 + 0.05 * rng.standard_normal(len(n))) - 2e-4
    X = fit.design(kernel, n, m, U, b)
    scale = np.abs(X).max(axis=0)
    ref, _ = nnls(X / scale, t)           # Lawson-Hanson, an independent active-set solver
    ours = fit.fit_one(kernel, n, m, U, b, t)
    assert [ours[c] for c in fit.COEFS[kernel]] == pytest.approx((ref / scale).tolist(), rel=1e-7, abs=1e-15)
    assert ours["t_op"] == 0.0


def test_nonnegative_fit_equals_unconstrained_when_every_coefficient_is_positive():
    rows = synthetic_rows(noise=0.01)
    free = fit.fit_layers(rows, fit=fit.UNCONSTRAINED)
    bound = fit.fit_layers(rows)
    assert (free[["t_op", "c_u", "c_re", "c_g", "c_t"]].fillna(1) > 0).all().all()
    cols = ["t_op", "c_u", "c_re", "c_g", "c_t", "fit_median_rel_err"]
    pd.testing.assert_frame_equal(bound[cols], free[cols])
    assert set(bound["fit"]) == {"nonnegative"} and set(free["fit"]) == {"unconstrained"}


def test_unknown_fit_rejected():
    n, m, U, b = _hand_passes("slot")
    with pytest.raises(ValueError, match="fit must be one of"):
        fit.fit_one("slot", n, m, U, b, np.ones(len(n)), fit="ridge")


def test_transfer_crossover_on_a_hand_case():
    """S(n)/E_slot(n) = (1/beta_slot)(1 - ubar/r) (eq. (6)) on the grid n = 2, 4, 6, 8; the
    crossover is the first grid n from which it stays positive."""
    ns = [2, 4, 6, 8]
    ubar = {"x": [0.9, 0.6, 0.5, 0.4], "y": [0.9, 0.8, 0.7, 0.6]}
    r_meas = {"x": [0.8, 0.7, 0.7, 0.7], "y": [0.5, 0.5, 0.5, 0.5]}
    r_pred = {"x": [0.95, 0.5, 0.55, 0.45], "y": [0.5, 0.5, 0.5, 0.5]}
    tr = pd.DataFrame([dict(model=m, n=n, beta_slot_meas=10.0, beta_slot_pred=20.0, r_meas=r_meas[m][i],
                            r_pred=r_pred[m][i]) for m in ("x", "y") for i, n in enumerate(ns)])
    bw = pd.DataFrame([dict(model=m, n=n, ubar=ubar[m][i]) for m in ("x", "y") for i, n in enumerate(ns)])
    out = fit.transfer_crossover(tr, bw).set_index("model")
    # x, own: 1 - ubar/r = -0.125, +0.143, +0.286, +0.429 -> 4; transferred: +0.053, -0.2, +0.091, +0.111 -> 6
    assert out.loc["x", "crossover_meas"] == 4 and out.loc["x", "crossover_pred"] == 6
    assert out.loc["x", "distance"] == 2 and not out.loc["x", "within_one"]
    first = float(out.loc["x", "saving_s_per_GB_meas"].split()[0])
    assert first == pytest.approx(0.1 * (1 - 0.9 / 0.8), rel=1e-3)
    # y: ubar > r everywhere with both bandwidths: no crossover, which agrees
    assert pd.isna(out.loc["y", "crossover_meas"]) and pd.isna(out.loc["y", "crossover_pred"])
    assert out.loc["y", "distance"] == 0 and out.loc["y", "within_one"]
    with pytest.raises(ValueError, match="no ubar for held-out model 'y' at n = \\[8\\]"):
        fit.transfer_crossover(tr, bw[~((bw.model == "y") & (bw.n == 8))])
    with pytest.raises(ValueError, match="missing column\\(s\\) \\['r_pred'\\]"):
        fit.transfer_crossover(tr.drop(columns="r_pred"), bw)


def test_reread_cost_undefined_when_c_u_binds_at_zero():
    """Per-slot times that fall with the distinct bytes (noise on a tiny model can do that): the
    non-negative fit holds c_u at 0, and the re-read cost c_re/c_u is NaN, not a division error."""
    true = {**TRUE, "slot": {"t_op": 1e-2, "c_u": -1e-12, "c_re": 2e-11}}
    rows = synthetic_rows(noise=0.0, true=true, windows=False)
    fits = fit.fit_layers(rows)
    slot = fits[fits.kernel == "slot"]
    assert (slot.c_u == 0).all() and slot.reread_cost.isna().all()
    assert (fit.fit_layers(rows, fit="unconstrained").query("kernel == 'slot'").reread_cost < 0).all()


def batch_rows(time_of, seed=0, batch_sizes=(1, 2, 4, 8), windows=range(1, 10), per=3):
    """Rows of kind batch as the benchmark's batch mode writes them: B windows of k + 1 tokens from B
    documents of a uniform trace (N = 64, m = 8), timed by ``time_of(kernel, n, U)``."""
    from moespec.measure.ids import batch_windows
    from moespec.routing import synthetic

    tr = synthetic.uniform(8, 32, 1, N, M, seed=seed)
    rng, rows = np.random.default_rng(seed), []
    for bs in batch_sizes:
        for w in windows:
            for i, (_, ids) in enumerate(batch_windows(tr.docs, 0, bs, w, per, rng)):
                U = pass_union(ids, N)
                for kernel in fit.KERNELS:
                    rows.append(dict(model="toy", backend="cpp", fmt="f32", layer=0, kind="batch", kernel=kernel,
                                     n=bs * w, m=M, U=U, expert_bytes=B, B=bs, k_plus_1=w, pass_id=f"b{bs}x{w}:{i}",
                                     t_median_s=time_of(kernel, bs * w, U)))
    return pd.DataFrame(rows)


def bytes_time(kernel, n, U):
    return float(fit.fitted_time(kernel, TRUE[kernel], n, M, U, B)[0])


def test_batch_fits_recover_known_coefficients_exactly_up_to_72_tokens():
    rows = batch_rows(bytes_time)
    assert rows["n"].max() == 72 and rows["U"].nunique() > 20
    fits = fit.fit_layers(rows, ns=range(2, 73), kinds=("batch",))
    for _, r in fits.iterrows():
        for name, true in TRUE[r["kernel"]].items():
            assert r[name] == pytest.approx(true, rel=1e-6), (r["kernel"], name)
    reg = fit.regimes(rows)     # bytes explain every n: one regime per kernel, over the whole range
    assert reg["regime"].tolist() == [fit.BYTES, fit.BYTES] and set(reg["n_to"]) == {72}
    assert set(reg["n_from"]) == {2}
    for _, r in reg.iterrows():
        for name, true in TRUE[r["kernel"]].items():
            assert r[name] == pytest.approx(true, rel=1e-6)
    ex = fit.byte_excess(fit.fit_layers(rows, kinds=("batch",)), rows)
    assert np.abs(ex["excess"]).max() < 1e-9


def compute_bound_time(kernel, n, U, c_n=8e-4):
    """The deduplicating kernel reads its bytes and computes its tokens at once: the longer of the
    two (a roofline), so the time per token c_n takes over where c_n·n exceeds the bytes' time."""
    t = bytes_time(kernel, n, U)
    if kernel == "slot":
        return t
    t_op = TRUE["dedup"]["t_op"]
    return t_op + max(t - t_op, c_n * n)


def test_regime_beyond_bytes_detected_where_the_time_per_token_takes_over():
    rows = batch_rows(compute_bound_time)
    reg = fit.regimes(rows)
    slot = reg[reg["kernel"] == "slot"]
    assert slot["regime"].tolist() == [fit.BYTES] and slot["n_to"].iloc[0] == 72
    dedup = reg[reg["kernel"] == "dedup"].set_index("regime")
    # where the roofline switches, from the true coefficients: below it every pass is bound by bytes,
    # from it every pass by the time per token (a clean switch between two measured sizes)
    d = rows[rows["kernel"] == "dedup"]
    token = [8e-4 * n > bytes_time("dedup", n, u) - TRUE["dedup"]["t_op"] for n, u in zip(d["n"], d["U"])]
    switch = int(d.loc[token, "n"].min())
    assert not any(np.array(token)[d["n"].to_numpy() < switch]) and all(np.array(token)[d["n"].to_numpy() >= switch])
    assert 9 < switch < 72
    assert dedup.loc[fit.BEYOND, "n_from"] == switch and dedup.loc[fit.BEYOND, "n_to"] == 72
    assert dedup.loc[fit.BYTES, "n_to"] == max(n for n in d["n"] if n < switch)
    for name, true in {**TRUE["dedup"], "c_n": None}.items():   # both pieces exact
        if name != "c_n":
            assert dedup.loc[fit.BYTES, name] == pytest.approx(true, rel=1e-6)
    assert dedup.loc[fit.BEYOND, "c_n"] == pytest.approx(8e-4, rel=1e-6)
    assert dedup.loc[fit.BEYOND, "t_op"] == pytest.approx(TRUE["dedup"]["t_op"], rel=1e-6)
    assert dedup.loc[fit.BEYOND, "excess_at_boundary"] > 0
    assert dedup.loc[fit.BEYOND, "bic"] < dedup.loc[fit.BEYOND, "bic_single"]


def test_regimes_under_noise():
    """10 % noise on every pass, 20 simulated runs of each kind: bytes-bound rows rarely gain a second
    regime (at most 2 of the 40 kernel fits), the roofline's switch is found in at least 18 of 20."""
    false, found = 0, 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        noisy = lambda time_of: lambda k, n, U: time_of(k, n, U) * (1 + 0.1 * rng.standard_normal())  # noqa: E731
        false += int((fit.regimes(batch_rows(noisy(bytes_time), seed=seed))["regime"] == fit.BEYOND).sum())
        reg = fit.regimes(batch_rows(noisy(compute_bound_time), seed=seed))
        found += reg.loc[reg["kernel"] == "dedup", "regime"].tolist() == [fit.BYTES, fit.BEYOND]
    assert false <= 2 and found >= 18
