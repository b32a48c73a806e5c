"""Chain (22) of paper 1, Section 4: per-layer expert-operation times -> whole-model verify time.

Versions of the chain (all through eq. (22)):

* **prediction**: t_{p,l}(n) from the fits (4)/(E.1) evaluated at each window's union bytes;
* **text**: the same fits at the union bytes of the text the whole-model runs verified;
* **measured-time**: t_{p,l}(n) the measured median operation time on each window;
* **calibrated**: the measured-time version plus the measured growth with n of the time outside
  the expert operation, taken from the verify time with deduplication off.

Arrays over pass sizes are indexed by n - 1 (column 0 is n = 1).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from moespec.fit import COEFS, KERNELS, fitted_time
from moespec.theory import saving_bound



# --- per-layer operation times -------------------------------------------------------------
def layer_times(windows: pd.DataFrame, num_layers: int, n_max: int = 9, time_col: str = "t_s") -> dict:
    """t_{p,l}(n): per kernel, the mean over windows of layer l's operation time, ``[L, n_max]``.

    ``windows`` has one row per (window, layer, kernel, n) with ``time_col``. Layers missing from
    the rows are not invented: when the rows cover only some layers, the returned arrays hold those
    layers and ``scale = num_layers / covered`` tells :func:`chain` to scale their sum (a stated
    assumption: the timed layers stand for all). Every kernel must have every n in 1..n_max
    (n = 1 only for the per-slot kernel, which runs n = 1 with deduplication off and on).
    """
    need = {"layer", "kernel", "n", time_col}
    if missing := need - set(windows.columns):
        raise ValueError(f"window times lack column(s) {sorted(missing)}; expected {sorted(need)}")
    layers = sorted(int(x) for x in windows["layer"].unique())
    if any(not 0 <= layer < num_layers for layer in layers):
        raise ValueError(f"window times name layers {layers}, outside 0..{num_layers - 1}")
    mean = windows.groupby(["kernel", "layer", "n"])[time_col].mean()
    out = {}
    for p in KERNELS:
        arr = np.full((len(layers), n_max), np.nan)
        for i, layer in enumerate(layers):
            for n in range(1 if p == "slot" else 2, n_max + 1):
                key = (p, layer, n)
                if key not in mean.index:
                    raise ValueError(f"no {p} operation time for layer {layer} at n={n}")
                arr[i, n - 1] = mean[key]
        out[p] = arr
    out["dedup"][:, 0] = out["slot"][:, 0]  # n = 1 runs the per-slot kernel either way
    out["scale"] = num_layers / len(layers)
    out["layers"] = layers
    return out


def fitted_layer_times(fits: pd.DataFrame, union: np.ndarray, m: int, expert_bytes) -> dict:
    """t_{p,l}(n) from the fits (4) (per-slot) and (E.1) (deduplicating) of :mod:`moespec.fit`,
    averaged over the windows of recorded routing, ``[L, n_max]`` per kernel.

    Both fits are affine in U at fixed n, so their mean over a layer's windows equals the fit at
    the windows' mean union ``union[l, n-1]`` (:func:`moespec.routing.mean_union`). ``fits`` has
    one row per (layer, kernel); n = 1 takes the per-slot fit (the kernel the engine runs there).
    ``expert_bytes``: b, a scalar or one value per layer. A layer without a fit of its own takes
    the mean coefficients of the fitted layers (the paper fits two layers of DeepSeek-V2-Lite and
    applies them to all; every layer of one model shares the expert shape).
    """
    union = np.asarray(union, float)
    L, n_max = union.shape
    if np.isnan(union).any():
        n_bad = sorted({int(j) + 1 for j in np.argwhere(np.isnan(union))[:, 1]})
        raise ValueError(f"the routing has no window of n = {n_bad} tokens (documents too short); "
                         f"record longer documents or lower n_max")
    b = np.broadcast_to(np.asarray(expert_bytes, float), (L,))
    n = np.arange(1, n_max + 1)
    out = {}
    for p in KERNELS:
        f = fits[fits["kernel"] == p].set_index("layer")
        if f.empty:
            raise ValueError(f"no {p} fit among the fits (kernels found: {sorted(set(fits['kernel']))})")
        shared = f[list(COEFS[p])].mean()
        out[p] = np.stack([fitted_time(p, f.loc[layer] if layer in f.index else shared, n, m, union[layer], b[layer])
                           for layer in range(L)])
    out["dedup"][:, 0] = out["slot"][:, 0]
    return out


# --- the chain ------------------------------------------------------------------------------
@dataclass
class Chain:
    """One version's whole-model predictions: tau[p][n-1] (22) and the expert times M[p][n-1]."""

    name: str
    tau: dict
    M: dict
    meta: dict = field(default_factory=dict)

    @property
    def saving(self) -> np.ndarray:
        return self.tau["slot"] - self.tau["dedup"]

    def round_model(self, measured, eps: float = 0.0):
        """``measured`` (a :class:`moespec.predict.round_model.RoundModel`) with its verify terms
        replaced by this version's, their intervals those of bound (17) at ``eps`` around the
        predicted expert times M_p(n) and the saving's that of bound (18)."""
        r = eps / (1 - eps) if eps < 1 else np.inf
        return measured.with_verify(self.tau, f"chain (22), version {self.name!r}", "prediction",
                                    half_width={p: r * self.M[p] for p in KERNELS},
                                    saving_half_width=saving_band(self, eps))

    def step_times(self, measured) -> np.ndarray:
        """V_hat(k): ``measured``'s round (draft and host time) with this version's deduplicating
        verify times (:meth:`RoundModel.step_times_for`; non-positive where the version predicts nothing)."""
        return measured.step_times_for(self.tau["dedup"])


def chain(name: str, tau1: float, times: dict) -> Chain:
    """Eq. (22): tau_p(n) = tau_meas(1) + Σ_l (t_{p,l}(n) − t_l(1)), with t_l(1) the per-slot
    one-token time; the predicted expert time is M_p(n) = Σ_l t_{p,l}(n) (paper 1, Section 4)."""
    scale = float(times.get("scale", 1.0))
    one = times["slot"][:, 0]
    tau = {p: tau1 + scale * (times[p] - one[:, None]).sum(axis=0) for p in KERNELS}
    M = {p: scale * times[p].sum(axis=0) for p in KERNELS}
    return Chain(name, tau, M, {"tau1": tau1, "scale": scale})


def calibrate(base: Chain, tau_meas_slot: np.ndarray, name: str = "calibrated") -> Chain:
    """The calibrated version (Section 4): ``base`` plus the growth with n of the time outside the
    expert operation, read off the measured verify time with deduplication off:
    tau_cal_p(n) = tau_p(n) + (tau_meas_slot(n) − tau_slot(n))."""
    resid = np.asarray(tau_meas_slot, float) - base.tau["slot"]
    return Chain(name, {p: base.tau[p] + resid for p in KERNELS}, dict(base.M), {**base.meta, "calibrated_from": base.name})



def saving_band(c: Chain, eps: float) -> np.ndarray:
    """Half-width of the saving bound (18) around the predicted saving: eps/(1−eps)·(M_slot(n) +
    M_dedup(n)), with the predicted expert times (paper 1, Section 4, Figure 4). From eps = 1 on
    the bound says nothing: the band is infinite."""
    if eps >= 1:
        return np.full_like(c.M["slot"], np.inf, dtype=float)
    return np.asarray(saving_bound(eps, c.M["slot"], c.M["dedup"]), float)
