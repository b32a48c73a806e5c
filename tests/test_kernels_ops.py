"""The registered ops (torch.ops.moespec.*) pass torch.library.opcheck (schema, autograd
registration, fake tensor, AOT dispatch with dynamic shapes) and run under FakeTensor and
torch.compile through their fake (meta) implementations (moespec.kernels.fake), as the ops of
pytorch/extension-cpp do. Before, opcheck's fake-tensor test failed: no fake implementation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_cases import FORMATS, skip_if_absent
from torch._subclasses.fake_tensor import FakeTensorMode

from moespec.kernels import ExpertWeights, expert_forward, load_cpu
from moespec.measure.ids import random_ids

N, H, I, M, TOKENS = 6, 64, 96, 2, 3


def _args(fmt, gates=True, packed=False):
    w = ExpertWeights.random((N, H, I), fmt, seed=1)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(TOKENS, H, generator=gen)
    ids = random_ids(TOKENS, M, N, np.random.default_rng(0))
    g = torch.rand(TOKENS, M, generator=gen) if gates else None
    tensors = list(w.tensors())
    if packed:  # the CPU layout expert_forward passes for int8 (uint8, +128, interleaved)
        tensors[:3] = [torch.ops.moespec.pack_int8_cpu(t) for t in tensors[:3]]
    return (x, ids, g, *tensors), w


@pytest.fixture(scope="module", autouse=True)
def _built():
    skip_if_absent("cpp")
    load_cpu()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("op", ["expert_slot", "expert_dedup"])
def test_expert_ops_pass_opcheck(op, fmt):
    fn = getattr(torch.ops.moespec, op)
    cases = [_args(fmt)[0], _args(fmt, gates=False)[0]]
    if fmt == "int8_b32":
        cases.append(_args(fmt, packed=True)[0])
    for args in cases:
        result = torch.library.opcheck(fn, args)
        assert set(result.values()) == {"SUCCESS"}, result


def test_helper_ops_pass_opcheck():
    q = torch.randint(-127, 128, (3, 64), dtype=torch.int8, generator=torch.Generator().manual_seed(1))
    assert set(torch.library.opcheck(torch.ops.moespec.pack_int8_cpu, (q,)).values()) == {"SUCCESS"}
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(2))
    assert set(torch.library.opcheck(torch.ops.moespec.quantize_acts_int8_cpu, (x,)).values()) == {"SUCCESS"}


def test_ops_under_fake_tensors():
    """Shapes, dtypes and devices come out of the fake implementation without computing; a shape
    mismatch is refused there too."""
    args, _ = _args("bf16")
    with FakeTensorMode() as mode:
        fake = [None if a is None else mode.from_tensor(a) for a in args]
        out = torch.ops.moespec.expert_dedup(*fake)
        assert (tuple(out.shape), out.dtype, out.device.type) == ((TOKENS, H), torch.float32, "cpu")
        q, s, c = torch.ops.moespec.quantize_acts_int8_cpu(mode.from_tensor(torch.zeros(2, 64)))
        assert (q.shape, q.dtype, s.shape, s.dtype, c.shape, c.dtype) == \
            ((2, 64), torch.int8, (2, 2), torch.float32, (2, 2), torch.int32)
        with pytest.raises(RuntimeError, match="hidden size"):
            torch.ops.moespec.expert_dedup(mode.from_tensor(torch.zeros(TOKENS, H + 1)), *fake[1:])


@pytest.mark.parametrize("fmt", FORMATS)
def test_ops_under_torch_compile(fmt):
    """A function calling the op compiles into one graph (fullgraph: no break at the op) and gives
    the eager result; aot_eager traces through the fake implementation with dynamic shapes."""
    torch._dynamo.reset()
    args, w = _args(fmt)
    x, ids, g, *wt = args

    def layer(x, ids, g):
        return torch.ops.moespec.expert_slot(x, ids, g, *wt) + torch.ops.moespec.expert_dedup(x, ids, g, *wt)

    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, ids, g), layer(x, ids, g), rtol=0, atol=0)
    eager = expert_forward(x, ids, w, g, kernel="dedup", backend="cpp")
    torch.testing.assert_close(torch.ops.moespec.expert_dedup(x, ids, g, *wt), eager, rtol=0, atol=0)


@pytest.mark.parametrize("fmt", FORMATS)
def test_dense_op_passes_opcheck_and_compiles(fmt):
    """torch.ops.moespec.dense (the padded attention and LM head of the byte-faithful-all subject)
    has a fake implementation: opcheck's schema, fake and autograd-registration checks pass, and a
    function calling it compiles into one graph with the eager result."""
    from moespec.kernels.dense import DenseWeights, _op_args

    g = torch.Generator().manual_seed(4)
    w = DenseWeights.from_float(torch.randn(48, 64, generator=g), fmt)
    x = torch.randn(5, 64, generator=g)
    wt, s = _op_args(w)
    assert set(torch.library.opcheck(torch.ops.moespec.dense, (x, wt, s)).values()) == {"SUCCESS"}
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: torch.ops.moespec.dense(x, wt, s) * 2, fullgraph=True, dynamic=True,
                             backend="aot_eager")
    torch.testing.assert_close(compiled(x), torch.ops.moespec.dense(x, wt, s) * 2, rtol=0, atol=0)
    with FakeTensorMode() as mode:
        out = torch.ops.moespec.dense(mode.from_tensor(x), mode.from_tensor(wt), None if s is None else mode.from_tensor(s))
        assert (tuple(out.shape), out.dtype) == ((5, 48), torch.float32)

