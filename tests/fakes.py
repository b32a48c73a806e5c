"""Stand-ins the tests use in place of real models and measurements: a deterministic target for the
speculative loop (:class:`FakeTarget`) and rounds drawn from paper 2's cost model with known
coefficients (:func:`synthetic_rounds`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moespec.oracle.rounds import RoundRecord, rounds_frame


class FakeTarget:
    """A cheap deterministic stand-in for a target model (tests of the speculative loop): the
    greedy token after ``t`` is ``(a * t + b) % vocab``; a pass costs nothing."""

    def __init__(self, vocab: int = 1000, a: int = 7, b: int = 3):
        self.vocab, self.a, self.b = int(vocab), int(a), int(b)
        self.tokens: list[int] = []

    def next_of(self, t: int) -> int:
        return (self.a * int(t) + self.b) % self.vocab

    @property
    def length(self) -> int:
        return len(self.tokens)

    def prefill(self, ids) -> int:
        self.tokens = [int(t) for t in ids]
        return self.next_of(self.tokens[-1])

    def forward(self, ids) -> list[int]:
        ids = [int(t) for t in np.asarray(ids).reshape(-1)]
        self.tokens.extend(ids)
        return [self.next_of(t) for t in ids]

    def crop(self, length: int) -> None:
        if not 0 <= length <= len(self.tokens):
            raise ValueError(f"cannot crop a cache of {len(self.tokens)} positions to {length}")
        del self.tokens[length:]

    def hold(self, first: int) -> tuple:
        held, self.tokens = (list(self.tokens), int(first)), []
        return held

    def resume(self, held: tuple) -> int:
        self.tokens = list(held[0])
        return held[1]

    def greedy(self, first: int, count: int) -> list[int]:
        out, tok = [], int(first)
        for _ in range(count):
            tok = self.forward([tok])[0]
            out.append(tok)
        return out


def synthetic_rounds(coef: dict, ks=range(1, 11), generations_per_k: int = 20, rounds_per_gen: int = 40,
                     noise_ms: float = 0.05, draft_noise_ms: float = 0.02, num_experts: int = 64,
                     topk: int = 8, seed: int = 0) -> pd.DataFrame:
    """Rounds drawn from paper 2's model (4) and (A4) with known coefficients.

    coef: ``{"beta0": {m: ms}, "alpha": {m: ms per expert}, "c": ms per token, "draft_a": ms per
    draft token, "draft_b": ms}``. Ubar is drawn per round between topk and min(N, m * topk); each
    generation adds its own offset to T_T so that rounds within a generation are correlated (the
    reason for clustered standard errors).
    """
    rng = np.random.default_rng(seed)
    rows = []
    for K in ks:
        m = K + 1
        for g in range(generations_per_k):
            gen_offset = rng.normal(0.0, noise_ms)
            L0 = int(rng.integers(20, 200))
            for r in range(rounds_per_gen):
                lo, hi = topk, min(num_experts, m * topk)
                u = lo + (hi - lo) * rng.beta(2.0, 2.0)
                L = L0 + 2 * r + int(rng.integers(0, 3 * K + 1))
                tt = coef["beta0"][m] + coef["alpha"][m] * u + coef["c"] * L + gen_offset \
                    + rng.normal(0.0, noise_ms)
                td = coef["draft_a"] * K + coef["draft_b"] + rng.normal(0.0, draft_noise_ms)
                rows.append(RoundRecord(f"syn-K{K}-g{g}", g, "synthetic", K, m, r, L, max(tt, 1e-6),
                                        max(td, 1e-6), u, min(num_experts, u * 1.2), int(rng.integers(0, K + 1)),
                                        (L + m) / 4096, "synthetic"))
    return rounds_frame(rows)
