"""Routing statistics over the tokens of B sequences: a verify pass of B sequences x j tokens reads the
union of the experts that B windows of j consecutive tokens, one from each sequence, select
(moespec.theory.batch; paper 1, Sec. 2, with B sequences' tokens as the pass).

Model and estimator. The B sequences of a batch are independent requests; each one's window is a
window of j consecutive tokens of the routing process, drawn as paper 1's estimator draws windows
(App. D.2: every window of j tokens inside one document counts, pooled over documents). Then expert e
of layer l is outside the pass's union with probability (1 - p_{l,e}(j))^B, where
p_{l,e}(j) = (windows of j tokens that select e) / (windows of j tokens), and

    U_l(B, j) = sum_e [1 - (1 - p_{l,e}(j))^B]                (moespec.theory.union_from_inclusion)

exactly, with no sampling. At B = 1 it is sum_e p_{l,e}(j) = U_hat_l(j), the single-sequence mean union
of :func:`moespec.routing.mean_union`, to the last bit (both are the same integer over the same window
count). From U follow the union bytes E_dedup(B, j) = sum_l w_l U_l(B, j), the byte share
ubar(B, j) = E_dedup(B, j) / (B j m W), the union share U_l(B, j)/N (the share of a layer's experts the
pass reads) and the cross-sequence reuse rho^x_l(b; j) = 1 - (U_l(b, j) - U_l(b - 1, j)) / U_l(1, j)
(moespec.theory.cross_reuse).

Speed: per document, per layer, the distance from each token to the next token that selects e gives,
for every j at once, how many windows of j tokens select e (a window starting at s selects e iff that
distance is < j). The per-document counts are kept, so the document-level bootstrap resamples sums
(multinomial counts times per-document counts), as :func:`moespec.routing.bootstrap` does.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from moespec import theory as th
from moespec.routing.stats import Bootstrap, bootstrap_statistic, resample_counts
from moespec.routing.trace import RoutingTrace


@dataclass(frozen=True)
class InclusionSums:
    """Per-document inclusion counts for j = 1..n_max (column j-1).

    counts[d, l, e, j-1]: windows of j consecutive tokens of document d whose layer-l experts include e.
    windows[d, j-1]: windows of j tokens in document d, max(T_d - j + 1, 0).
    """

    counts: np.ndarray
    windows: np.ndarray
    top_k: int
    num_experts: int
    expert_bytes: np.ndarray

    @property
    def n_max(self) -> int:
        return self.windows.shape[1]


def _doc_counts(doc: np.ndarray, num_experts: int, n_max: int) -> np.ndarray:
    """``[L, N, n_max]`` counts of one document ``[T, L, m]``."""
    T, L, _ = doc.shape
    out = np.zeros((L, num_experts, n_max), dtype=np.int64)
    t = np.arange(T)
    big = np.iinfo(np.int64).max // 4
    for layer in range(L):
        hit = np.zeros((T, num_experts), dtype=bool)
        hit[t[:, None], doc[:, layer, :]] = True
        nxt = np.minimum.accumulate(np.where(hit, t[:, None], big)[::-1], axis=0)[::-1]
        gap = np.minimum(nxt - t[:, None], n_max)     # tokens from s to the next one that selects e
        # windows starting anywhere with gap < j, by a histogram of the gaps over s ...
        hist = np.bincount((np.arange(num_experts)[None, :] * (n_max + 1) + gap).ravel(),
                           minlength=num_experts * (n_max + 1)).reshape(num_experts, n_max + 1)
        below = np.cumsum(hist, axis=1)[:, :n_max]    # column j-1: #{s : gap_s < j}
        # ... less the last j - 1 starts, whose window would run past the document's end
        for j in range(1, min(n_max, T) + 1):
            out[layer, :, j - 1] = below[:, j - 1] - np.count_nonzero(gap[T - j + 1:] < j, axis=0)
    return out


def inclusion_sums(trace: RoutingTrace, n_max: int) -> InclusionSums:
    """Per-document inclusion counts of ``trace`` for j = 1..n_max; cached on the trace."""
    if not isinstance(n_max, (int, np.integer)) or isinstance(n_max, bool) or n_max < 1:
        raise ValueError(f"n_max: expected an integer >= 1 (tokens per sequence of a pass); found {n_max!r}")
    cached = trace._cache.get("inclusion_sums")
    if cached is not None and cached.n_max >= n_max:
        return InclusionSums(cached.counts[..., :n_max], cached.windows[:, :n_max], cached.top_k,
                             cached.num_experts, cached.expert_bytes)
    counts = np.stack([_doc_counts(np.asarray(doc, dtype=np.int64), trace.num_experts, int(n_max))
                       for doc in trace.docs])
    windows = np.maximum(trace.doc_lengths[:, None] - np.arange(n_max)[None, :], 0)
    sums = InclusionSums(counts, windows, trace.top_k, trace.num_experts, trace.expert_bytes.copy())
    trace._cache["inclusion_sums"] = sums
    return sums


def _check_B(B) -> int:
    if isinstance(B, bool) or not isinstance(B, (int, np.integer)) or B < 1:
        raise ValueError(f"B: expected a batch size, an integer >= 1 (sequences in a pass); found {B!r}")
    return int(B)


# --- statistics from (possibly resampled) pooled sums C [..., L, N, J] and Wn [..., J] ----------------
def _union(C, Wn, B):
    with np.errstate(invalid="ignore", divide="ignore"):
        if B == 1:   # sum_e p_e as one integer over the window count: U_hat(j) of the single-sequence estimator
            return np.where(Wn[..., None, :] > 0, C.sum(axis=-2) / np.where(Wn > 0, Wn, 1)[..., None, :], np.nan)
        p = C / np.where(Wn > 0, Wn, 1)[..., None, None, :]
        U = th.union_from_inclusion(np.moveaxis(p, -2, -1), B)
        return np.where(Wn[..., None, :] > 0, U, np.nan)


def _e_dedup(C, Wn, B, m, w, N):
    return np.einsum("l,...lj->...j", w, _union(C, Wn, B))


def _byte_share(C, Wn, B, m, w, N):
    j = np.arange(1, Wn.shape[-1] + 1)
    return _e_dedup(C, Wn, B, m, w, N) / (B * j * m * w.sum())


def _union_share(C, Wn, B, m, w, N):
    return _union(C, Wn, B).mean(axis=-2) / N


def _layer_union(C, Wn, B, m, w, N):
    return _union(C, Wn, B).mean(axis=-2)


def _cross_reuse(C, Wn, B, m, w, N):
    """Layer mean of rho^x_l(b; j), b = 1..B: ``[..., B, J]``."""
    U = np.stack([_union(C, Wn, b) for b in range(1, B + 1)], axis=0)     # [B, ..., L, J]
    prev = np.concatenate([np.zeros_like(U[:1]), U[:-1]], axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = 1 - (U - prev) / U[0]
    return np.moveaxis(rho.mean(axis=-2), 0, -2)


#: Statistics of a pass of B sequences x j tokens, each an array over j = 1..n_max ("cross_reuse":
#: [B, n_max], row b-1 is rho^x(b; j)); all layer means except the byte statistics, which sum layers.
BATCH_STATISTICS = {
    "union": _layer_union,             # layer mean of U_l(B, j)
    "union_share": _union_share,       # layer mean of U_l(B, j) / N
    "e_dedup": _e_dedup,               # sum_l w_l U_l(B, j)
    "byte_share": _byte_share,         # ubar(B, j) = E_dedup(B, j) / (B j m W)
    "cross_reuse": _cross_reuse,       # layer mean of rho^x_l(b; j), b = 1..B
}


def _pooled(sums: InclusionSums):
    return sums.counts.sum(axis=0), sums.windows.sum(axis=0)


def batch_union(trace: RoutingTrace, B: int, n_max: int) -> np.ndarray:
    """U_l(B, j), ``[L, n_max]``, column j-1: mean distinct experts of B windows of j tokens from B
    independent sequences (module docstring). B = 1 equals :func:`moespec.routing.mean_union`. NaN
    where no document has j tokens."""
    C, Wn = _pooled(inclusion_sums(trace, n_max))
    return _union(C, Wn, _check_B(B))


def _stat(trace, B, n_max, name):
    sums = inclusion_sums(trace, n_max)
    C, Wn = _pooled(sums)
    return BATCH_STATISTICS[name](C, Wn, _check_B(B), sums.top_k, sums.expert_bytes, sums.num_experts)


def batch_e_dedup(trace: RoutingTrace, B: int, n_max: int) -> np.ndarray:
    """E_dedup(B, j) = sum_l w_l U_l(B, j), ``[n_max]``: union bytes of a pass of B sequences x j tokens."""
    return _stat(trace, B, n_max, "e_dedup")


def batch_byte_share(trace: RoutingTrace, B: int, n_max: int) -> np.ndarray:
    """ubar(B, j) = E_dedup(B, j) / E_slot(B, j), E_slot(B, j) = B j m W, ``[n_max]``. B = 1 equals
    :func:`moespec.routing.byte_share`."""
    return _stat(trace, B, n_max, "byte_share")


def union_share(trace: RoutingTrace, B: int, n_max: int) -> np.ndarray:
    """Layer mean of U_l(B, j)/N, ``[n_max]``: the share of a layer's N experts that a pass of B
    sequences x j tokens reads; non-decreasing in B and in j."""
    return _stat(trace, B, n_max, "union_share")


def batch_reuse(trace: RoutingTrace, B: int, n_max: int) -> np.ndarray:
    """Layer mean of rho^x_l(b; j), ``[B, n_max]``, row b-1: the share of the b-th sequence's window
    experts that an earlier sequence of the pass also selected (rho^x(1; j) = 0)."""
    return _stat(trace, B, n_max, "cross_reuse")


def batch_bootstrap(trace: RoutingTrace, B: int, n_max: int, statistic: str = "union_share",
                    resamples: int = 2000, seed: int | np.random.Generator = 0, level: float = 0.95,
                    chunk: int = 100) -> Bootstrap:
    """Document-level bootstrap of a statistic of :data:`BATCH_STATISTICS` at batch size B (paper 1,
    App. D.2's resampling: documents drawn with replacement, ``resamples`` draws; each resample's
    inclusion probabilities are count-weighted per-document sums, so the statistic is computed from
    pooled sums exactly as on the whole trace). ``chunk`` resamples are held in memory at a time.

    At B >= 2 the statistic is not linear in the sums: a resample that repeats a document pools fewer
    distinct documents, whose windows share experts, so its union tends to sit below the whole
    trace's, and the percentile interval can lie below the estimate (the plug-in estimate itself is
    biased low by the same convexity, (1 - p)^B convex in p). ``samples.mean(0) - estimate`` is that
    shift; at B = 1 the statistic is linear and the resamples are those of
    :func:`moespec.routing.bootstrap`."""
    fn = bootstrap_statistic(BATCH_STATISTICS, statistic, resamples, level)
    B = _check_B(B)
    sums = inclusion_sums(trace, n_max)
    D = sums.counts.shape[0]
    counts = resample_counts(trace.num_docs, resamples, seed).astype(np.float64)          # [R, D]
    flat = sums.counts.reshape(D, -1).astype(np.float64)
    args = (B, sums.top_k, sums.expert_bytes, sums.num_experts)
    parts = []
    for lo in range(0, resamples, chunk):
        c = counts[lo: lo + chunk]
        C = (c @ flat).reshape((c.shape[0],) + sums.counts.shape[1:])
        parts.append(fn(C, c @ sums.windows, *args))
    samples = np.concatenate(parts, axis=0)
    alpha = (1 - level) / 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanquantile(samples, [alpha, 1 - alpha], axis=0)
    C, Wn = _pooled(sums)
    return Bootstrap(statistic, fn(C, Wn, *args), low, high, samples, level)


def union_share_curves(traces, batch_sizes=(1, 2, 4, 8), n_max: int = 72, resamples: int = 200,
                       seed: int = 0, level: float = 0.95):
    """The union share (layer mean of U/N) against the tokens of a pass, n, per trace: one sequence's
    window of n consecutive tokens (``B = 1``, n = 1..n_max) and B sequences x j tokens (n = B j,
    j = 1..n_max // B) for each B of ``batch_sizes``, each with its document-level bootstrap interval.
    ``traces``: a RoutingTrace or a list of them (e.g. one per model). Returns a DataFrame, one row per
    (label, B, j): label, model, N, m, B, j, n, share, share_low, share_high, and share_shift, the mean of
    the resamples less the estimate (:func:`batch_bootstrap`)."""
    import pandas as pd

    traces = [traces] if isinstance(traces, RoutingTrace) else list(traces)
    if not traces:
        raise ValueError("traces: expected at least one routing trace; found none")
    Bs = sorted({1, *(_check_B(b) for b in batch_sizes)})
    rows = []
    for i, tr in enumerate(traces):
        for B in Bs:
            J = n_max // B
            if J < 1:
                continue
            boot = batch_bootstrap(tr, B, J, "union_share", resamples, seed + i, level)
            for j in range(1, J + 1):
                rows.append({"label": tr.label, "model": tr.model or tr.label, "N": tr.num_experts, "m": tr.top_k,
                             "B": B, "j": j, "n": B * j, "share": boot.estimate[j - 1],
                             "share_low": boot.low[j - 1], "share_high": boot.high[j - 1],
                             "share_shift": boot.samples[:, j - 1].mean() - boot.estimate[j - 1]})
    return pd.DataFrame(rows)
