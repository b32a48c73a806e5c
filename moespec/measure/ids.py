"""Expert ids for the passes of the expert-operation benchmark (paper 1, Section 2).

Three kinds: *random ids* (:func:`random_ids`, random routing, as the kernel benchmarks use); *chosen ids*, where a pass of n tokens names exactly U distinct experts across its
n·m slots (from heavy repetition, U = m, to none, U = min(N, n·m)), so that a fit can separate the
time of a first read of an expert from that of a repeated read (eq. (4), (E.1)); and *windows*
of n consecutive tokens copied from recorded routing; *batch windows* (:func:`batch_windows`), one
window of k + 1 consecutive tokens from each of B different documents, the pass of a batched verify step.
"""

from __future__ import annotations

import numpy as np
import torch


def random_ids(n: int, m: int, num_experts: int, rng: np.random.Generator) -> torch.Tensor:
    """``[n, m]`` int64: each token m distinct experts drawn uniformly (random routing)."""
    return torch.from_numpy(np.stack([rng.choice(num_experts, m, replace=False) for _ in range(n)]).astype(np.int64))


def feasible_u(n: int, m: int, num_experts: int) -> range:
    """Every reachable number of distinct experts U for a pass of n tokens with m of N experts
    each: m <= U <= min(N, n·m). U >= m because one token alone names m distinct experts."""
    if not (n >= 1 and 1 <= m <= num_experts):
        raise ValueError(f"need n >= 1 and 1 <= m <= N; got n={n}, m={m}, N={num_experts}")
    return range(m, min(num_experts, n * m) + 1)


def u_grid(n: int, m: int, num_experts: int, count: int | None = None) -> list[int]:
    """``count`` values of U spread evenly over :func:`feasible_u` (both ends included);
    every reachable U when ``count`` is None or at least the number of reachable values."""
    values = list(feasible_u(n, m, num_experts))
    if count is None or count >= len(values):
        return values
    if count < 2:
        raise ValueError(f"a U grid needs at least 2 values (both ends), got count={count}")
    picks = np.unique(np.round(np.linspace(0, len(values) - 1, count)).astype(int))
    return [values[i] for i in picks]


def chosen_ids(n: int, m: int, num_experts: int, U: int, rng: np.random.Generator) -> np.ndarray:
    """Ids ``[n, m]`` of a pass that names exactly ``U`` distinct experts, no expert twice within
    one token.

    Construction: the first token takes m new experts; the remaining ``U - m`` first reads go to
    slots of tokens 2..n drawn uniformly at random (at most m per token); every other slot
    repeats an expert already named earlier in the pass (drawn at random, distinct within the
    token). Slot order within a token is shuffled. Raises ``ValueError`` for an impossible U.
    """
    reachable = feasible_u(n, m, num_experts)
    if U not in reachable:
        raise ValueError(f"no pass of n={n} tokens with m={m} of N={num_experts} experts names "
                         f"U={U} distinct experts; reachable: {reachable.start} <= U <= {reachable.stop - 1}")
    experts = rng.permutation(num_experts)[:U]
    # which of the (n-1)·m later slots are first reads: U - m of them, uniformly
    later_new = np.zeros((n - 1) * m, dtype=bool)
    later_new[rng.choice((n - 1) * m, size=U - m, replace=False)] = True
    new_per_token = [m] + later_new.reshape(n - 1, m).sum(axis=1).tolist()
    ids = np.empty((n, m), dtype=np.int64)
    seen = 0  # experts[:seen] have been named so far
    for t, k in enumerate(new_per_token):
        fresh = experts[seen:seen + k]
        # the m - k repeated slots take distinct experts already named (there are >= m of them)
        old = experts[:seen][rng.choice(seen, size=m - k, replace=False)] if m - k else experts[:0]
        ids[t] = rng.permutation(np.concatenate([fresh, old]))
        seen += k
    return ids


def trace_windows(docs, layer: int | None, n: int, count: int,
                  rng: np.random.Generator) -> list[tuple[int, int, np.ndarray]]:
    """``count`` windows of ``n`` consecutive tokens of MoE layer ``layer``, drawn uniformly from
    every window position in ``docs`` (a list of ``[T, L, m]`` arrays: a RoutingTrace's docs).

    Returns ``(doc, start, ids [n, m])`` triples; with ``layer=None`` the window of every layer,
    ``ids [n, L, m]`` (a whole pass). Raises if no document has n tokens.
    """
    positions = [(d, s) for d, arr in enumerate(docs) for s in range(max(0, len(arr) - n + 1))]
    if not positions:
        raise ValueError(f"no document has {n} consecutive tokens; lengths: {[len(a) for a in docs]}")
    picks = rng.choice(len(positions), size=min(count, len(positions)), replace=False)
    out = []
    for i in sorted(picks):
        d, s = positions[i]
        arr = np.asarray(docs[d])
        if layer is None:
            out.append((d, s, arr[s:s + n].astype(np.int64)))
            continue
        if not 0 <= layer < arr.shape[1]:
            raise ValueError(f"layer {layer} is outside the trace's {arr.shape[1]} MoE layers")
        out.append((d, s, arr[s:s + n, layer, :].astype(np.int64)))
    return out


def batch_windows(docs, layer: int, batch: int, window: int, count: int,
                  rng: np.random.Generator) -> list[tuple[tuple[tuple[int, int], ...], np.ndarray]]:
    """``count`` passes of a batched verify step: each pass is one window of ``window`` (k + 1)
    consecutive tokens of MoE layer ``layer`` from each of ``batch`` (B) different documents of
    ``docs`` (a RoutingTrace's ``[T, L, m]`` arrays), drawn at random (the B documents without
    repetition, each window's start uniform over its document), stacked sequence by sequence:
    ``n = B·window`` tokens.

    Returns ``(((doc, start), ...), ids [B·window, m])`` pairs. Raises naming the lengths when
    fewer than ``batch`` documents have ``window`` tokens."""
    if batch < 1 or window < 1:
        raise ValueError(f"need batch >= 1 and window >= 1; got batch={batch}, window={window}")
    long_enough = [d for d, arr in enumerate(docs) if len(arr) >= window]
    if len(long_enough) < batch:
        raise ValueError(f"routing trace: expected at least {batch} documents of >= {window} tokens (B = {batch} "
                         f"sequences); found {len(long_enough)} (lengths {[len(a) for a in docs]})")
    out = []
    for _ in range(count):
        picked = rng.choice(long_enough, size=batch, replace=False)
        where, parts = [], []
        for d in picked:
            arr = np.asarray(docs[d])
            if not 0 <= layer < arr.shape[1]:
                raise ValueError(f"layer {layer} is outside the trace's {arr.shape[1]} MoE layers")
            s = int(rng.integers(0, len(arr) - window + 1))
            where.append((int(d), s))
            parts.append(arr[s:s + window, layer, :].astype(np.int64))
        out.append((tuple(where), np.concatenate(parts)))
    return out
