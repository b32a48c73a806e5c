"""One rule for non-finite numbers on every backend, kernel and format (docs/kernels.md, "Non-finite
input"): a token whose x row or gates hold NaN or +-inf, or whose float32 computation overflows,
gets an output row of NaN only, and every other row is exactly what it is without that token's
bad value. Before, int8 on the C++ backend turned a NaN activation into a finite row, an infinite
gate gave +-inf rows, and an activation of 1e20 a row of zeros on the AVX-512 path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_cases import BACKENDS, FORMATS, KERNELS, skip_if_absent

from moespec.kernels import ExpertWeights, expert_forward
from moespec.measure.ids import random_ids

NAN, INF = float("nan"), float("inf")
N, H, I, M, TOKENS = 9, 64, 96, 4, 6   # H, I multiples of 32 (int8); 6 tokens, several per expert

#: name -> (rows that become NaN, how to spoil the clean (x, gates) in place)
CASES = {
    "NaN activation": ((1,), lambda x, g: x[1].__setitem__(5, NAN)),
    "+inf activation": ((2,), lambda x, g: x[2].__setitem__(63, INF)),
    "-inf activation": ((0,), lambda x, g: x[0].__setitem__(0, -INF)),
    "1e30 activation (overflows float32)": ((4,), lambda x, g: x[4].__setitem__(7, 1e30)),
    "NaN gate": ((3,), lambda x, g: g[3].__setitem__(1, NAN)),
    "+inf gate": ((5,), lambda x, g: g[5].__setitem__(0, INF)),
    "-inf gate": ((1,), lambda x, g: g[1].__setitem__(3, -INF)),
    "two tokens": ((0, 5), lambda x, g: (x[0].__setitem__(10, NAN), g[5].__setitem__(2, INF))),
}


def _inputs(fmt):
    w = ExpertWeights.random((N, H, I), fmt, seed=2)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(TOKENS, H, generator=gen)
    ids = random_ids(TOKENS, M, N, np.random.default_rng(4))
    ids[1] = ids[0]                     # tokens 0 and 1 share all their experts (one dedup group)
    return w, x, ids, torch.rand(TOKENS, M, generator=gen)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_non_finite_input_gives_nan_in_exactly_its_rows(backend, device, fmt, kernel):
    skip_if_absent(backend)
    w, x, ids, gates = _inputs(fmt)
    dev = torch.device(device)
    wd, idd = w.to(dev), ids.to(dev)
    clean = expert_forward(x.to(dev), idd, wd, gates.to(dev), kernel=kernel, backend=backend).cpu()
    assert torch.isfinite(clean).all()
    for name, (rows, spoil) in CASES.items():
        xb, gb = x.clone(), gates.clone()
        spoil(xb, gb)
        y = expert_forward(xb.to(dev), idd, wd, gb.to(dev), kernel=kernel, backend=backend).cpu()
        others = [t for t in range(TOKENS) if t not in rows]
        assert y[list(rows)].isnan().all(), f"{name}: row(s) {rows} must be all NaN; found {y[list(rows)]}"
        assert torch.equal(y[others], clean[others]), f"{name}: the other rows changed"


@pytest.mark.parametrize("backend,device", BACKENDS)
def test_gates_none_with_nan_activation(backend, device):
    """Without gates (all ones) the rule holds too, and a single token pass is all NaN."""
    skip_if_absent(backend)
    w, x, ids, _ = _inputs("int8_b32")
    dev = torch.device(device)
    xb = x[:1].clone()
    xb[0, 3] = NAN
    y = expert_forward(xb.to(dev), ids[:1].to(dev), w.to(dev), None, kernel="dedup", backend=backend)
    assert y.isnan().all()


def test_cpp_op_called_directly_follows_the_rule():
    """torch.ops.moespec.* (the dispatcher's entry, not expert_forward) applies the rule itself."""
    skip_if_absent("cpp")
    w, x, ids, gates = _inputs("int8_b32")
    x[2, 9] = NAN
    y = torch.ops.moespec.expert_slot(x, ids, gates, *w.tensors())
    assert y[2].isnan().all() and torch.isfinite(y[[0, 1, 3, 4, 5]]).all()
