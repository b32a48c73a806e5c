"""Plain-loop reference of paper 1's estimators (App. D.2), used only by tests to cross-check
moespec.routing.stats: Python sets, one window at a time, no bitmasks, no caching."""

from __future__ import annotations

import numpy as np


def reference_stats(docs, m, n_max):
    """(rho [L, n_max], union [L, n_max]) pooled over every window inside every document."""
    L = docs[0].shape[1]
    hits = np.zeros((L, n_max))
    unions = np.zeros((L, n_max))
    windows = np.zeros(n_max)
    for doc in docs:
        T = doc.shape[0]
        for n in range(1, n_max + 1):
            for t in range(T - n + 1):
                windows[n - 1] += 1
                for l in range(L):
                    sets = [set(doc[t + i, l].tolist()) for i in range(n)]
                    earlier = set().union(*sets[:-1])
                    hits[l, n - 1] += len(sets[-1] & earlier)
                    unions[l, n - 1] += len(earlier | sets[-1])
    with np.errstate(invalid="ignore"):
        return hits / (m * windows), unions / windows


def reference_rho_bar(rho, w, k_max):
    """eq. (11), term by term."""
    W = sum(w)
    return np.array([sum(w[l] * rho[l, j - 1] for j in range(2, k + 2) for l in range(len(w))) / (k * W)
                     for k in range(1, k_max + 1)])
