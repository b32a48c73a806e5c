"""In-run peers of moespec's CUDA expert kernels: what a torch user would run on the same weights
and routing, timed in the same interleaved rounds (``benchmarks/bench_kernels_cuda.py``).

* ``torch_loop``: one ``F.linear`` per expert matrix for each distinct expert of the pass, at the
  format's precision (:func:`moespec.kernels.reference.expert_mlp`: float32; bfloat16 matmuls;
  int8 activations with the weights dequantized per call, as torch has no int8-block matmul);
* ``grouped_mm``: ``torch._grouped_mm`` (bfloat16 only, where this torch build has it): the
  pass's pairs sorted by expert, one grouped GEMM per matrix over all N experts (empty groups for
  the unused ones), then the gate-weighted sum.

Both read each distinct expert once (a dedup kernel's bytes, U*b). The routing is grouped once on
the host before timing (:func:`group_routing`), so a call is pure GPU work with no host sync, and
:func:`graph_replay` captures it in a CUDA graph: the tens to hundreds of small launches of a
torch loop then cost GPU time only, as the CUDA-event timing of our ops (which excludes host
launch overhead) does. Peers are checked against the fp64 reference on the CPU in
``tests/test_bench_cuda_peers.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from moespec.kernels.reference import expert_mlp, groups_by_expert
from moespec.kernels.weights import ExpertWeights

PEERS = ("torch_loop", "grouped_mm")


@dataclass(frozen=True)
class Routing:
    """A pass's (token, slot) pairs grouped by expert, on the weights' device.

    ``groups``: (expert, start, end) into the sorted order, experts increasing; ``tokens`` and
    ``gates``: token and gate weight of each pair in that order; ``offs``: int32 end offsets of
    every expert's group over all ``num_experts`` (``torch._grouped_mm``'s layout)."""

    groups: tuple[tuple[int, int, int], ...]
    tokens: torch.Tensor
    gates: torch.Tensor
    offs: torch.Tensor
    n: int


def group_routing(ids: torch.Tensor, gates: torch.Tensor | None, num_experts: int, device) -> Routing:
    """Group a pass's pairs by expert (on the host: ``ids`` is read once, before any timing)."""
    ids = ids.detach().to("cpu", torch.int64)
    n, m = ids.shape
    if int(ids.min()) < 0 or int(ids.max()) >= num_experts:
        raise ValueError(f"ids must lie in [0, {num_experts}), found [{int(ids.min())}, {int(ids.max())}]")
    g = torch.ones(n, m) if gates is None else gates.detach().to("cpu", torch.float32)
    groups, tokens, gts, counts, start = [], [], [], torch.zeros(num_experts, dtype=torch.int64), 0
    for e, toks, slots in groups_by_expert(ids):
        groups.append((e, start, start + len(toks)))
        tokens.append(toks)
        gts.append(g[toks, slots])
        counts[e] = len(toks)
        start += len(toks)
    return Routing(tuple(groups), torch.cat(tokens).to(device), torch.cat(gts).to(device),
                   torch.cumsum(counts, 0).to(torch.int32).to(device), n)


def torch_loop(x: torch.Tensor, routing: Routing, weights: ExpertWeights) -> torch.Tensor:
    """Per-expert matmuls at the format's precision; float32 ``[n, H]``."""
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e, a, b in routing.groups:
        toks = routing.tokens[a:b]
        y.index_add_(0, toks, expert_mlp(x[toks], weights, e) * routing.gates[a:b].unsqueeze(1))
    return y


def grouped_mm_unsupported(weights: ExpertWeights) -> str | None:
    """Why ``torch._grouped_mm`` cannot run these weights here (None when it can)."""
    if not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if weights.fmt != "bf16":
        return f"torch._grouped_mm takes bfloat16 only, not {weights.fmt}"
    return None


def grouped_mm(x: torch.Tensor, routing: Routing, weights: ExpertWeights) -> torch.Tensor:
    """Three grouped GEMMs over all experts (bfloat16); float32 ``[n, H]``."""
    why = grouped_mm_unsupported(weights)
    if why:
        raise ValueError(why)
    xs = x[routing.tokens].to(torch.bfloat16)
    g = torch._grouped_mm(xs, weights.gate.transpose(1, 2), offs=routing.offs)
    u = torch._grouped_mm(xs, weights.up.transpose(1, 2), offs=routing.offs)
    h = (F.silu(g.float()) * u.float()).to(torch.bfloat16)
    o = torch._grouped_mm(h, weights.down.transpose(1, 2), offs=routing.offs)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    return y.index_add_(0, routing.tokens, o.float() * routing.gates.unsqueeze(1))


def peer_call(name: str, x: torch.Tensor, routing: Routing, weights: ExpertWeights) -> Callable[[], torch.Tensor]:
    """The peer ``name`` as a no-argument call on fixed inputs."""
    if name == "torch_loop":
        return lambda: torch_loop(x, routing, weights)
    if name == "grouped_mm":
        return lambda: grouped_mm(x, routing, weights)
    raise ValueError(f"unknown peer {name!r}; expected one of {PEERS}")


def graph_replay(fn: Callable[[], object], warmup: int = 2) -> Callable[[], None]:
    """``fn`` captured once in a CUDA graph (after ``warmup`` eager calls on a side stream, as
    torch's capture needs); returns a call that replays it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
