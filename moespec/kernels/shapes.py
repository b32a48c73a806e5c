"""Shape tables shared by the kernel tests and benchmarks (module-level constants, megablocks-style).

``(N, H, I, m)``: experts, hidden size, expert intermediate size, experts per token.
"""

from __future__ import annotations

import numpy as np
import torch

from moespec.models import PRESETS

#: Small random shapes for correctness tests: odd sizes (float formats), multiples of 32 (int8),
#: group tails of the int8 layout (K/32 not a multiple of 16), m = 1 and N = m + 1.
SMALL_SHAPES: tuple[tuple[int, int, int, int], ...] = (
    (8, 256, 128, 3),
    (6, 96, 160, 5),     # K/32 = 3 and 5 blocks: partial int8 groups
    (4, 64, 32, 1),      # m = 1
    (5, 544, 96, 4),     # N = m + 1; H/32 = 17 blocks: one full group and a tail of 1
)
#: Non-multiple-of-32 shapes, float formats only (vector tails).
ODD_SHAPES: tuple[tuple[int, int, int, int], ...] = ((5, 75, 37, 2), (3, 17, 9, 2))


def published_shapes() -> dict[str, tuple[int, int, int, int]]:
    """``{model: (N, H, I, m)}`` for every preset of :data:`moespec.models.PRESETS`."""
    return {name: (s.num_experts, s.hidden_size, s.expert_intermediate, s.top_k) for name, s in PRESETS.items()}


def random_ids(n: int, m: int, num_experts: int, rng: np.random.Generator) -> torch.Tensor:
    """``[n, m]`` int64: each token m distinct experts drawn uniformly (random routing)."""
    return torch.from_numpy(np.stack([rng.choice(num_experts, m, replace=False) for _ in range(n)]).astype(np.int64))
