"""The in-run torch peers of the CUDA kernels (moespec.measure.cuda_peers), on the CPU: the routing
grouping on hand-checked ids, and both peers against the fp64 reference at the format's
precision (fixed per-format ceilings)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moespec.kernels import ExpertWeights, reference_forward
from moespec.measure import cuda_peers
from moespec.measure.ids import random_ids

CEILING = {"f32": 1e-5, "bf16": 2e-2, "int8_b32": 3e-2}


def test_group_routing_hand_case():
    ids = torch.tensor([[2, 0], [0, 3], [2, 1]])
    gates = torch.tensor([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]])
    r = cuda_peers.group_routing(ids, gates, 5, "cpu")
    assert r.groups == ((0, 0, 2), (1, 2, 3), (2, 3, 5), (3, 5, 6))
    assert r.tokens.tolist() == [0, 1, 2, 0, 2, 1]          # expert 0: tokens 0, 1; 1: 2; 2: 0, 2; 3: 1
    assert r.gates.tolist() == pytest.approx([0.2, 0.3, 0.6, 0.1, 0.5, 0.4])
    assert r.offs.tolist() == [2, 3, 5, 6, 6] and r.offs.dtype == torch.int32  # expert 4 unused: empty group
    assert cuda_peers.group_routing(ids, None, 5, "cpu").gates.tolist() == [1.0] * 6
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 3\)"):
        cuda_peers.group_routing(ids, None, 3, "cpu")


@pytest.mark.parametrize("fmt", ("f32", "bf16", "int8_b32"))
def test_peers_match_reference(fmt):
    N, H, I, m, n = 8, 64, 96, 3, 5
    w = ExpertWeights.random((N, H, I), fmt, seed=3)
    g = torch.Generator().manual_seed(3)
    x, gates = torch.randn(n, H, generator=g), torch.rand(n, m, generator=g)
    ids = random_ids(n, m, N, np.random.default_rng(3))
    ref = reference_forward(x, ids, w, gates)
    routing = cuda_peers.group_routing(ids, gates, N, "cpu")
    scale = float(ref.abs().max())
    y = cuda_peers.peer_call("torch_loop", x, routing, w)()
    assert float((y.double() - ref).abs().max()) / scale <= CEILING[fmt]
    why = cuda_peers.grouped_mm_unsupported(w)
    if fmt == "bf16":
        assert why is None
        y = cuda_peers.peer_call("grouped_mm", x, routing, w)()
        assert float((y.double() - ref).abs().max()) / scale <= CEILING[fmt]
    else:
        assert "bfloat16 only" in why
        with pytest.raises(ValueError, match="bfloat16 only"):
            cuda_peers.grouped_mm(x, routing, w)
    with pytest.raises(ValueError, match="unknown peer"):
        cuda_peers.peer_call("cublas", x, routing, w)
