"""Bandwidth regimes: a same-round reference read beside every timed block, and the regime it
puts the block in.

On this VM the read bandwidth switches between regimes minutes apart (``torch.sum`` over 1 GiB
reads about 35 or about 60 GB/s), which alone moves a byte-bound pass by tens of percent. A
quantity timed in one regime and compared with one timed in the other would show the regime as an
effect of U, n or k. So every timed block of the whole-model runs also times one read of a fixed
buffer in the same round (:class:`ReferenceRead`), each row carries that read's bandwidth, and
:func:`classify` splits the rows into regimes (two when the readings form two groups whose
centres differ by at least ``min_ratio``, else one). Summaries are then made within a regime
(:func:`dominant` names the one holding most rows) and reported beside the whole-run numbers.
"""

from __future__ import annotations

import numpy as np

from moespec.measure.timing import flush_bytes, read_bandwidth_callable, timer_for
#: Two groups of readings count as two regimes when their centres differ at least this much.
MIN_RATIO = 1.4
LOW, HIGH, ONE = "low", "high", "one"


class ReferenceRead:
    """One timed read of a fixed ``nbytes`` buffer (``torch.sum``); calling it returns GB/s. By
    default the buffer is the machine's cold size (:func:`moespec.measure.timing.flush_bytes`: 4x the
    last-level cache, at least 256 MiB), so that the read is served by memory and not by the caches,
    while staying short against a timed round."""

    def __init__(self, nbytes: int | None = None, device: str = "cpu", timer=None):
        nbytes = flush_bytes(str(device)) if nbytes is None else nbytes
        self.fn, self.nbytes = read_bandwidth_callable(nbytes, str(device))
        self.timer = timer or timer_for(str(device))

    def __call__(self) -> float:
        return self.nbytes / self.timer(self.fn)  # bytes per ns = GB/s (the timers return ns)


def split_point(bandwidth, min_ratio: float = MIN_RATIO) -> float | None:
    """The threshold (GB/s) between two regimes of the readings ``bandwidth``, or None when they
    form one: the split of the sorted log-readings into two groups with the least within-group sum
    of squares (1-D two-means, exact), kept only if the groups' geometric means differ by at least
    ``min_ratio`` and each holds at least two readings."""
    x = np.log(np.asarray(bandwidth, float))
    x = np.sort(x[np.isfinite(x)])
    if x.size < 4:
        return None
    best, cut = np.inf, None
    for i in range(2, x.size - 1):
        lo, hi = x[:i], x[i:]
        ss = ((lo - lo.mean()) ** 2).sum() + ((hi - hi.mean()) ** 2).sum()
        if ss < best:
            best, cut = ss, i
    lo, hi = x[:cut], x[cut:]
    if np.exp(hi.mean() - lo.mean()) < min_ratio:
        return None
    return float(np.exp((lo[-1] + hi[0]) / 2))


def classify(bandwidth, threshold: float | None = None, min_ratio: float = MIN_RATIO) -> np.ndarray:
    """The regime of each reading: ``"low"``/``"high"`` on either side of ``threshold`` (default
    :func:`split_point` of the readings themselves), all ``"one"`` when there is a single regime.
    A missing reading (NaN) gets ``"one"`` only in a single-regime run, else ``""``."""
    bw = np.asarray(bandwidth, float)
    if threshold is None:
        threshold = split_point(bw, min_ratio)
    if threshold is None:
        return np.full(bw.shape, ONE, dtype=object)
    out = np.where(bw >= threshold, HIGH, LOW).astype(object)
    out[~np.isfinite(bw)] = ""
    return out


def dominant(labels) -> str:
    """The regime holding most rows (ties: the high-bandwidth one)."""
    labels = [str(x) for x in labels if str(x)]
    if not labels:
        raise ValueError("no rows with a regime")
    counts = {r: labels.count(r) for r in (HIGH, LOW, ONE) if r in labels}
    return max(counts, key=lambda r: (counts[r], r == HIGH))


def regime_summary(bandwidth, labels) -> list[dict]:
    """Per regime: rows, median and range of the reference bandwidth (GB/s)."""
    bw = np.asarray(bandwidth, float)
    labels = np.asarray(labels, dtype=object)
    out = []
    for r in (LOW, HIGH, ONE):
        sel = labels == r
        if sel.any():
            out.append({"regime": r, "rows": int(sel.sum()), "ref_GBps_median": float(np.median(bw[sel])),
                        "ref_GBps_min": float(bw[sel].min()), "ref_GBps_max": float(bw[sel].max())})
    return out
