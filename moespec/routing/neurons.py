"""Neuron-cluster routing of a dense model: a routing source from a real LM's hidden states.

A dense SwiGLU FFN computes ``down(act(gate(x)) * up(x))``; its I intermediate neurons are split
here into N balanced groups (I/N neurons each) by co-activation on calibration text, and each
token "selects" the m groups that carry the most activation mass, ``sum_{i in g} |a_i|``.
The FFNs stay dense and the model's outputs are untouched: this observes routing-like structure
in a real language model's hidden states; it is not a trained router. (Turning the groups into
experts, MoEfication, destroys SmolLM2: perplexity 30 -> 14,500 at top-8 of 64, as measured when this module was designed.)

Clustering: each neuron is described by its |activation| over the calibration tokens,
normalised to unit length (so nearness is co-activation, cosine similarity); balanced k-means
(greedy capacity-constrained assignment of the nearest (neuron, centroid) pairs, then centroid
update) splits the neurons into N groups of exactly I/N.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
from moespec.progress import tqdm

from moespec.io import atomic_path
from moespec.routing.record import decoder_layers


def _ffn_down(layer: torch.nn.Module, index: int) -> torch.nn.Module:
    mlp = getattr(layer, "mlp", None)
    down = getattr(mlp, "down_proj", None)
    if not isinstance(down, torch.nn.Linear):
        raise ValueError(f"decoder layer {index}: expected a dense Llama-style FFN with mlp.down_proj "
                         f"(nn.Linear), found {type(mlp).__name__}")
    return down


def balanced_kmeans(features: np.ndarray, k: int, iters: int = 15, seed: int = 0) -> np.ndarray:
    """Labels in [0, k) for the rows of ``features`` [n, d], exactly n/k rows per label.

    Each iteration assigns (row, centroid) pairs in order of increasing squared distance,
    skipping full centroids and rows already placed, then moves each centroid to its rows' mean.
    """
    n = features.shape[0]
    if k < 1 or n % k:
        raise ValueError(f"cannot split {n} neurons into {k} equal groups (need {k} to divide {n})")
    cap = n // k
    x = np.asarray(features, dtype=np.float64)
    rng = np.random.default_rng(seed)
    centroids = x[rng.choice(n, size=k, replace=False)]
    labels = np.full(n, -1)
    for _ in range(iters):
        d2 = (x * x).sum(1)[:, None] - 2 * x @ centroids.T + (centroids * centroids).sum(1)[None]
        order = np.argsort(d2, axis=None, kind="stable")
        new = np.full(n, -1)
        fill = np.zeros(k, dtype=np.int64)
        placed = 0
        for flat in order:
            i, c = divmod(int(flat), k)
            if new[i] >= 0 or fill[c] >= cap:
                continue
            new[i] = c
            fill[c] += 1
            placed += 1
            if placed == n:
                break
        if np.array_equal(new, labels):
            break
        labels = new
        centroids = np.stack([x[labels == c].mean(0) for c in range(k)])
    return labels


@dataclass
class NeuronClusters:
    """Per-layer assignment of FFN neurons to ``num_groups`` groups; selects ``top_k`` per token.

    ``assignment[l][i]`` is the group of intermediate neuron i of decoder layer l.
    """

    assignment: np.ndarray  # [L, I] int
    num_groups: int
    top_k: int
    calibration_tokens: int = 0

    def __post_init__(self):
        a = np.asarray(self.assignment)
        if a.ndim != 2 or a.min() < 0 or a.max() >= self.num_groups:
            raise ValueError(f"assignment must be [L, I] with groups in [0, {self.num_groups})")
        if not 1 <= self.top_k < self.num_groups:
            raise ValueError(f"need 1 <= top_k < num_groups, found {self.top_k}, {self.num_groups}")
        self.assignment = a

    def meta(self) -> dict:
        L = self.assignment.shape[0]
        return {"family": "neuron-clusters", "layer_indices": list(range(L)), "dense_layers": [],
                "num_shared_experts": 0, "neurons_per_group": self.assignment.shape[1] // self.num_groups,
                "calibration_tokens": self.calibration_tokens}

    def group_matrix(self, layer: int, dtype=torch.float32) -> torch.Tensor:
        """One-hot ``[I, N]``: activation mass per group = |a| @ this."""
        a = torch.as_tensor(self.assignment[layer])
        return torch.nn.functional.one_hot(a, self.num_groups).to(dtype)

    def select(self, act: torch.Tensor, layer: int) -> torch.Tensor:
        """[tokens, top_k] ids of the groups with the largest ``sum |a_i|`` (``act`` [..., I])."""
        act = act.reshape(-1, act.shape[-1]).float()
        mass = act.abs() @ self.group_matrix(layer).to(act.device)
        return torch.topk(mass, self.top_k, dim=-1).indices

    def attach(self, model) -> "_ObserverHooks":
        layers = decoder_layers(model)
        if len(layers) != self.assignment.shape[0]:
            raise ValueError(f"clusters were fitted for {self.assignment.shape[0]} layers, "
                             f"the model has {len(layers)}")
        return _ObserverHooks(self, [_ffn_down(l, i) for i, l in enumerate(layers)])

    def save(self, path) -> None:
        """Write the clusters as ``.npz``, atomically (a cache notebook 00 reads on later runs)."""
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:   # a file object: numpy adds no ".npz"
            np.savez_compressed(fh, assignment=self.assignment, num_groups=self.num_groups,
                                top_k=self.top_k, calibration_tokens=self.calibration_tokens)

    @classmethod
    def load(cls, path) -> "NeuronClusters":
        with np.load(path, allow_pickle=False) as z:
            return cls(z["assignment"], int(z["num_groups"]), int(z["top_k"]), int(z["calibration_tokens"]))


class _ObserverHooks:
    """Pre-hooks on each layer's ``down_proj``: its input is the intermediate activation a."""

    def __init__(self, clusters: NeuronClusters, downs: Sequence[torch.nn.Module]):
        self.calls: list[list[torch.Tensor]] = [[] for _ in downs]
        self.handles = [d.register_forward_pre_hook(self._hook(clusters, i)) for i, d in enumerate(downs)]

    def _hook(self, clusters, i):
        def fn(module, args):
            self.calls[i].append(clusters.select(args[0].detach(), i).cpu())
        return fn

    def remove(self):
        for h in self.handles:
            h.remove()


@torch.no_grad()
def fit_neuron_clusters(model, documents: Sequence, num_groups: int = 64, top_k: int = 8,
                        max_tokens: int = 4096, iters: int = 15, seed: int = 0,
                        context: int | None = None, progress: bool = True) -> NeuronClusters:
    """Cluster every layer's FFN neurons by co-activation on ``documents`` (token-id arrays).

    Uses at most ``max_tokens`` calibration tokens (documents in order, each cut to the model's
    context or ``context``). ``progress``: a tqdm bar over the layers being clustered.
    """
    layers = decoder_layers(model)
    downs = [_ffn_down(l, i) for i, l in enumerate(layers)]
    ctx = context or getattr(model.config, "max_position_embeddings", None) or max_tokens
    acts: list[list[torch.Tensor]] = [[] for _ in downs]
    handles = [d.register_forward_pre_hook(
        lambda m, a, i=i: acts[i].append(a[0].detach().reshape(-1, a[0].shape[-1]).abs().float().cpu()))
        for i, d in enumerate(downs)]
    used = 0
    try:
        for doc in documents:
            if used >= max_tokens:
                break
            ids = torch.as_tensor(np.asarray(doc)[:min(ctx, max_tokens - used)], dtype=torch.long)
            model(input_ids=ids[None].to(next(model.parameters()).device))
            used += len(ids)
    finally:
        for h in handles:
            h.remove()
    if used == 0:
        raise ValueError("fit_neuron_clusters: no calibration tokens")
    assignment = []
    for layer_acts in tqdm(acts, desc="cluster neurons", unit="layer", disable=not progress, mininterval=2):
        a = torch.cat(layer_acts).T.numpy()  # [I, tokens]: each neuron's |activation| profile
        a = a / np.maximum(np.linalg.norm(a, axis=1, keepdims=True), 1e-12)
        assignment.append(balanced_kmeans(a, num_groups, iters=iters, seed=seed))
    return NeuronClusters(np.stack(assignment), num_groups, top_k, calibration_tokens=used)
