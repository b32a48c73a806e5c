"""Reuse, union and byte statistics of routing traces (paper 1, eqs. (1)-(3), (11), App. D.2).

Estimator (Appendix D.2): every window of n consecutive tokens inside one document counts. For
each window, rho counts the last token's experts that an earlier token of the window also
selected; the sum over windows is divided by m times the number of windows. The union U counts
the distinct experts of the window (X_{l,t}(n)) and is averaged over the same windows.

Speed: each token-layer set becomes a bitmask (``ceil(N/64)`` uint64 words); the window union
grows by one OR per n and popcounts give the counts. Per-document sums are kept, so the
document-level bootstrap resamples sums (a multinomial count matrix times the per-document
sums) instead of recomputing anything.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from moespec.routing.trace import RoutingTrace

_POP8 = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _bitcount_table(x: np.ndarray) -> np.ndarray:
    """Set bits per uint64 element by a byte lookup table (numpy < 2.0 has no bitwise_count)."""
    return _POP8[x.view(np.uint8).reshape(*x.shape, 8)].sum(axis=-1, dtype=np.uint8)


_bitcount = getattr(np, "bitwise_count", _bitcount_table)


def _popcount(x: np.ndarray) -> np.ndarray:
    """Set bits of word-major masks ``[W, ...]``, summed over the words (plane by plane: a
    reduction over a short last axis is slow in numpy)."""
    if x.shape[0] == 1:
        return _bitcount(x[0])            # <= 64, fits the uint8 that bitwise_count returns
    acc = _bitcount(x[0]).astype(np.uint16)
    for w in range(1, x.shape[0]):
        acc += _bitcount(x[w])
    return acc


def bitmasks(ids: np.ndarray, num_experts: int) -> np.ndarray:
    """Token-layer expert sets as word-major bitmasks: ``[..., m]`` ids (e.g. ``[T, L, m]``) →
    ``[W, ...]`` uint64 (``[W, T, L]``), W = ceil(N/64); bit (e mod 64) of word (e div 64) is set when
    expert e is in the set."""
    words = (num_experts + 63) // 64
    out = np.zeros((words,) + ids.shape[:-1], dtype=np.uint64)
    one, zero = np.uint64(1), np.uint64(0)
    for s in range(ids.shape[-1]):  # one slot at a time: m passes over [T, L], no [T, L, m] temporaries
        slot = ids[..., s].astype(np.uint64)
        if words == 1:
            out[0] |= one << slot
        else:
            word, bit = slot >> np.uint64(6), one << (slot & np.uint64(63))
            for w in range(words):
                out[w] |= np.where(word == w, bit, zero)
    return out


def union_sizes(ids, num_experts: int) -> np.ndarray:
    """The union of experts over the positions of a pass, per layer, cumulative: ids
    ``[..., T, L, m]`` (integer, in ``[0, N)``) → ``[..., T, L]``, entry t = |union over positions
    0..t of the layer's experts| (paper 2, eqs. A1-A2; at t = T - 1 paper 1's X_{l,t}(T) of the
    window, Sec. 2). moespec's one computation of a union of experts: :func:`pass_union`, the
    oracle's Ubar (eq. 5) and the benchmarks' U call it, and :func:`window_sums` builds every window
    of a trace on the same bitmasks."""
    ids = np.asarray(ids)
    if ids.ndim < 3 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids: expected an integer array [..., T, layers, topk]; got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(f"ids: expert ids must lie in 0..{num_experts - 1}; found {ids.min()}..{ids.max()}")
    masks = np.bitwise_or.accumulate(bitmasks(ids, num_experts), axis=-2)  # [W, ..., T, L]
    return _popcount(masks).astype(np.int64)


def pass_union(ids, num_experts: int) -> int:
    """U: the distinct experts a pass of one layer names, ids ``[n, m]`` (paper 1, Sec. 2)."""
    ids = np.asarray(ids)
    if ids.ndim != 2:
        raise ValueError(f"ids: expected [n, m] for one pass of one layer; got shape {ids.shape}")
    return int(union_sizes(ids[:, None, :], num_experts)[-1, 0])


@dataclass(frozen=True)
class WindowSums:
    """Per-document window sums for n = 1..n_max (column n-1), the input of every statistic.

    reuse[d, l, n-1]: sum over windows of n tokens of document d of |S_last ∩ (earlier sets)|.
    union[d, l, n-1]: sum over the same windows of X_{l,t}(n), the window's distinct experts.
    windows[d, n-1]: number of such windows, max(T_d - n + 1, 0).
    """

    reuse: np.ndarray
    union: np.ndarray
    windows: np.ndarray
    top_k: int
    expert_bytes: np.ndarray

    @property
    def n_max(self) -> int:
        return self.windows.shape[1]

    def head(self, n_max: int) -> "WindowSums":
        """The sums for n = 1..n_max only (column n depends on nothing beyond n)."""
        return WindowSums(self.reuse[..., :n_max], self.union[..., :n_max], self.windows[:, :n_max],
                          self.top_k, self.expert_bytes)


def window_sums(trace: RoutingTrace, n_max: int) -> WindowSums:
    """Per-document window sums of ``trace`` for n = 1..n_max; cached on the trace."""
    if not isinstance(n_max, (int, np.integer)) or n_max < 1:
        raise ValueError(f"n_max must be an integer >= 1, found {n_max!r}")
    cached = trace._cache.get("window_sums")
    if cached is not None and cached.n_max >= n_max:
        return cached.head(n_max)

    D, L = trace.num_docs, trace.num_layers
    lengths = trace.doc_lengths
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    masks = bitmasks(np.concatenate(trace.docs, axis=0), trace.num_experts)  # [W, Ttot, L]
    Ttot = masks.shape[1]
    # tokens left in the document from each global position: a window of n tokens starting at t
    # stays inside its document exactly when left[t] >= n
    left = np.repeat(starts + lengths, lengths) - np.arange(Ttot)
    reuse = np.zeros((D, L, n_max), dtype=np.int64)
    union = np.zeros((D, L, n_max), dtype=np.int64)
    windows = np.maximum(lengths[:, None] - np.arange(n_max)[None, :], 0)

    def per_doc(counts: np.ndarray, n: int) -> np.ndarray:
        """Sum counts[t, l] (window starting at global token t) over each document's windows."""
        counts = np.where((left[: counts.shape[0]] >= n)[:, None], counts, 0)
        inside = starts < counts.shape[0]   # documents at the end may hold no window start
        out = np.zeros((D, L), dtype=np.int64)
        out[inside] = np.add.reduceat(counts, starts[inside], axis=0, dtype=np.int64)
        return out

    win = masks  # win[:, t] = union of tokens t..t+n-1 (all documents concatenated)
    union[:, :, 0] = per_doc(_popcount(win), 1)
    for n in range(2, min(n_max, int(lengths.max())) + 1):
        last = masks[:, n - 1:]
        win = win[:, : Ttot - n + 1]
        reuse[:, :, n - 1] = per_doc(_popcount(last & win), n)
        win = win | last
        union[:, :, n - 1] = per_doc(_popcount(win), n)
    sums = WindowSums(reuse, union, windows, trace.top_k, trace.expert_bytes.copy())
    trace._cache["window_sums"] = sums
    return sums


# --- statistics from (possibly resampled) sums; leading axes broadcast -----------------------
def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def _reuse(R, U, Wn, m, w):
    return _ratio(R, m * Wn[..., None, :])


def _union(R, U, Wn, m, w):
    return _ratio(U, Wn[..., None, :])


def _e_dedup(R, U, Wn, m, w):
    return np.einsum("l,...ln->...n", w, _union(R, U, Wn, m, w))


def _e_slot(R, U, Wn, m, w):
    n = np.arange(1, Wn.shape[-1] + 1)
    return np.broadcast_to(m * n * w.sum(), Wn.shape).astype(np.float64)


def _byte_share(R, U, Wn, m, w):
    return _e_dedup(R, U, Wn, m, w) / _e_slot(R, U, Wn, m, w)


def _rho_bar(R, U, Wn, m, w):
    rho = _reuse(R, U, Wn, m, w)                      # [..., L, n_max], column j-1 = rho(j)
    weighted = np.einsum("l,...ln->...n", w, rho)[..., 1:]   # j = 2..n_max
    k = np.arange(1, weighted.shape[-1] + 1)
    return np.cumsum(weighted, axis=-1) / (k * w.sum())


def _layer_mean_reuse(R, U, Wn, m, w):
    return _reuse(R, U, Wn, m, w).mean(axis=-2)


def _layer_mean_union(R, U, Wn, m, w):
    return _union(R, U, Wn, m, w).mean(axis=-2)


def _distinct_share(R, U, Wn, m, w):
    n = np.arange(1, Wn.shape[-1] + 1)
    return _layer_mean_union(R, U, Wn, m, w) / (n * m)


#: Statistics the bootstrap can resample; each maps window sums to an array over n (or k).
STATISTICS = {
    "reuse": _layer_mean_reuse,        # layer mean of rho_hat_l(n), n = 1..n_max
    "union": _layer_mean_union,        # layer mean of U_hat_l(n)
    "distinct_share": _distinct_share, # layer mean of U_hat_l(n) / (n m), Figure 3 (right)
    "byte_share": _byte_share,         # ubar(n) = E_dedup(n) / E_slot(n)
    "e_dedup": _e_dedup,
    "rho_bar": _rho_bar,               # rho_bar_k, k = 1..n_max-1
}


def _apply(fn, sums: WindowSums):
    """``fn`` on the whole trace: the per-document sums pooled over documents."""
    return fn(sums.reuse.sum(axis=0), sums.union.sum(axis=0), sums.windows.sum(axis=0),
              sums.top_k, sums.expert_bytes)


def reuse(trace: RoutingTrace, n_max: int) -> np.ndarray:
    """rho_hat_l(n), ``[L, n_max]``, column n-1 (paper 1, eq. (1); estimator of App. D.2).

    Column 0 is rho(1) = 0. A column is NaN when no document has n tokens.
    """
    return _apply(_reuse, window_sums(trace, n_max))


def mean_union(trace: RoutingTrace, n_max: int) -> np.ndarray:
    """U_hat_l(n), ``[L, n_max]``: mean distinct experts of n consecutive tokens (paper 1, Sec. 2)."""
    return _apply(_union, window_sums(trace, n_max))


def distinct_share(trace: RoutingTrace, n_max: int) -> np.ndarray:
    """U/(nm), ``[n_max]``: the share of a pass's n m slots that name distinct experts, layer mean
    of U_hat_l(n) / (n m) (paper 1, Figure 3 right); between 1/n and 1."""
    return _apply(_distinct_share, window_sums(trace, n_max))


def distinct_share_against(texts: dict, reference: RoutingTrace, ns=(2, 4, 6, 8), resamples: int = 2000,
                           seed: int = 0, level: float = 0.95):
    """Figure 3 (right) of paper 1: the distinct share U/(nm) of the windows the whole-model runs
    verified (``texts``: label -> trace, e.g. one per depth) against that of the ``reference``
    windows (WikiText-103 in the paper) of the same model, at each n of ``ns``.

    Each share carries its document-level percentile bootstrap interval (:func:`bootstrap`,
    ``resamples`` draws, App. D.2); the difference text - reference carries the interval of the
    differences of independent draws of the two. Returns a DataFrame, one row per (label, n):
    label, n, m, share_reference (+ _low/_high), share_text (+ _low/_high), difference (+ _low/
    _high) and lower_bound = 1/n. Raises ``ValueError`` when a trace's model shape (N, m) differs
    from the reference's or a trace has no window of the largest n.
    """
    import pandas as pd

    ns = [int(n) for n in ns]
    if not ns or min(ns) < 1:
        raise ValueError(f"ns: expected pass sizes >= 1; found {ns}")
    if not texts:
        raise ValueError("texts: expected at least one trace of verified text; found none")
    n_max = max(ns)
    ref = bootstrap(reference, n_max, "distinct_share", resamples, seed, level)
    rows = []
    for i, (label, tr) in enumerate(texts.items()):
        if (tr.num_experts, tr.top_k) != (reference.num_experts, reference.top_k):
            raise ValueError(f"trace {label!r}: N = {tr.num_experts}, m = {tr.top_k}; the reference "
                             f"({reference.label}) has N = {reference.num_experts}, m = {reference.top_k}")
        if int(tr.doc_lengths.max()) < n_max:
            raise ValueError(f"trace {label!r}: its longest document has {int(tr.doc_lengths.max())} tokens; "
                             f"n = {n_max} needs a window of {n_max}")
        txt = bootstrap(tr, n_max, "distinct_share", resamples, seed + 1 + i, level)
        diff = txt.samples - ref.samples
        alpha = (1 - level) / 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            d_low, d_high = np.nanquantile(diff, [alpha, 1 - alpha], axis=0)
        for n in ns:
            j = n - 1
            rows.append({"label": label, "n": n, "m": reference.top_k,
                         "share_reference": ref.estimate[j], "share_reference_low": ref.low[j],
                         "share_reference_high": ref.high[j],
                         "share_text": txt.estimate[j], "share_text_low": txt.low[j], "share_text_high": txt.high[j],
                         "difference": txt.estimate[j] - ref.estimate[j], "difference_low": d_low[j],
                         "difference_high": d_high[j], "lower_bound": 1 / n,
                         "reference": reference.label, "text_docs": tr.num_docs,
                         "reference_docs": reference.num_docs})
    return pd.DataFrame(rows)


def e_dedup(trace: RoutingTrace, n_max: int) -> np.ndarray:
    """E_dedup(n) = sum_l w_l U_hat_l(n), ``[n_max]``: union bytes of a pass (paper 1, Sec. 2)."""
    return _apply(_e_dedup, window_sums(trace, n_max))


def e_slot(trace: RoutingTrace, n_max: int) -> np.ndarray:
    """E_slot(n) = m n W, ``[n_max]``: per-slot bytes of a pass of n tokens (paper 1, Sec. 2)."""
    n = np.arange(1, n_max + 1)
    return trace.top_k * n * trace.expert_bytes.sum()


def byte_share(trace: RoutingTrace, n_max: int) -> np.ndarray:
    """ubar(n) = E_dedup(n) / E_slot(n), ``[n_max]`` (paper 1, Sec. 2 and eq. (3))."""
    return _apply(_byte_share, window_sums(trace, n_max))


def rho_bar(trace: RoutingTrace, k_max: int) -> np.ndarray:
    """rho_bar_k = (1/(kW)) sum_{j=2}^{k+1} sum_l w_l rho_l(j), ``[k_max]``, entry k-1 (eq. (11))."""
    return _apply(_rho_bar, window_sums(trace, k_max + 1))


@dataclass(frozen=True)
class Bootstrap:
    """A statistic over n (or k), its document-level bootstrap samples and percentile interval."""

    statistic: str
    estimate: np.ndarray   # [n] on the whole trace
    low: np.ndarray        # [n] lower percentile bound
    high: np.ndarray       # [n] upper percentile bound
    samples: np.ndarray    # [resamples, n]
    level: float


def resample_counts(num_docs: int, resamples: int, seed: int | np.random.Generator) -> np.ndarray:
    """``[resamples, D]`` multinomial counts: how often each document is drawn in each resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(num_docs, np.full(num_docs, 1.0 / num_docs), size=resamples)


def bootstrap_statistic(statistics: dict, statistic: str, resamples: int, level: float):
    """The function of ``statistic`` in ``statistics``, once the bootstrap's arguments are checked."""
    if statistic not in statistics:
        raise ValueError(f"unknown statistic {statistic!r}; choose one of {sorted(statistics)}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, found {resamples}")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), found {level}")
    return statistics[statistic]


def bootstrap(trace: RoutingTrace, n_max: int, statistic: str = "reuse", resamples: int = 2000,
              seed: int | np.random.Generator = 0, level: float = 0.95) -> Bootstrap:
    """Document-level bootstrap of a layer-mean statistic (paper 1, App. D.2: 2000 resamples).

    ``statistic`` is one of :data:`STATISTICS` ("reuse", "union", "distinct_share", "byte_share",
    "e_dedup", "rho_bar"); for "rho_bar" entries are k = 1..n_max-1. Documents are drawn with
    replacement; each resample's window sums are the count-weighted per-document sums, so the
    statistic is a ratio of pooled sums exactly as on the full trace.
    """
    fn = bootstrap_statistic(STATISTICS, statistic, resamples, level)
    sums = window_sums(trace, n_max)
    counts = resample_counts(trace.num_docs, resamples, seed).astype(np.float64)  # [B, D]
    D, L, n = sums.reuse.shape
    R = (counts @ sums.reuse.reshape(D, -1)).reshape(resamples, L, n)
    U = (counts @ sums.union.reshape(D, -1)).reshape(resamples, L, n)
    Wn = counts @ sums.windows
    samples = fn(R, U, Wn, sums.top_k, sums.expert_bytes)
    alpha = (1 - level) / 2
    with warnings.catch_warnings():  # a column with no window in any resample stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        low, high = np.nanquantile(samples, [alpha, 1 - alpha], axis=0)
    return Bootstrap(statistic, _apply(fn, sums), low, high, samples, level)
