"""Counterfactual junk tails and the union matrix U(i, k, a) (paper 2, Section 4.2).

For a reference sequence X = x_1..x_N after a prompt, and every state i (x_1..x_i produced):

1. the draft's confidence in the reference, p[i] = P_draft(x_{i+1} | prompt, X_<=i) (eq. 7's p_j is
   p[i + j]);
2. for every a in 0..Lmax-1 a candidate chain of Lmax tokens: tokens 0..a-1 are the reference
   x_{i+1}..x_{i+a}; token a is drawn from the draft's distribution with the reference token's
   probability zeroed; the rest are drawn freely from the draft (temperature 1, seeded), one
   batched draft step per position; plus the all-reference chain (a = Lmax);
3. one batched target pass over the Lmax + 1 chains, each ``[x_i] + chain`` (the verification input
   of a round at state i), on the target's KV cache of the prefix, with the routers tapped;
4. U(i, k, a) = Ubar (eq. 5) over the first k + 1 positions of chain a (a <= k): the chain of a
   shorter draft is a prefix of the longer one, so one chain per a serves every k.

Past the end of the reference there is nothing to match: such positions are drawn freely.
The same batched draft steps give the draft's online confidences q[i, j] (probability of its own
greedy token along its own greedy chain), which the online early-exit policy may use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm.auto import tqdm

from moespec.io import atomic_path
from moespec.routing.stats import union_sizes

from .hf import RouterTap, cache_prefix, full_cache, torch_threads


@dataclass
class OracleInputs:
    """Everything the oracle needs for one reference sequence (single-sample Monte Carlo tails)."""
    seq_id: str
    category: str
    p: np.ndarray            # [N] draft confidence in the reference token
    q: np.ndarray            # [N, Lmax] draft confidence in its own greedy chain (online signal)
    U: np.ndarray            # [N, Lmax, Lmax + 1] layer-averaged unions; entries a > k are NaN
    L_prefix: np.ndarray     # [N] prompt length + i
    top_k: int
    num_experts: int
    meta: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.p.shape[0])

    @property
    def lmax(self) -> int:
        return int(self.U.shape[1])

    def truncated(self, lmax: int) -> "OracleInputs":
        """The same inputs for a smaller budget (U(i, k, a) does not depend on Lmax)."""
        if not 1 <= lmax <= self.lmax:
            raise ValueError(f"lmax must lie in 1..{self.lmax}; got {lmax}")
        return OracleInputs(self.seq_id, self.category, self.p, self.q[:, :lmax], self.U[:, :lmax, :lmax + 1],
                            self.L_prefix, self.top_k, self.num_experts, dict(self.meta))


def junk_tails(target, draft, prompt, reference, lmax: int = 12, seed: int = 0, seq_id: str = "",
               category: str = "", progress: bool = False, threads: int | None = 1) -> OracleInputs:
    """Run Section 4.2's counterfactual simulation for one reference sequence (module docstring)."""
    with torch_threads(threads):
        return _junk_tails(target, draft, prompt, reference, lmax, seed, seq_id, category, progress)


@torch.inference_mode()
def _junk_tails(target, draft, prompt, reference, lmax, seed, seq_id, category, progress) -> OracleInputs:
    prompt = [int(t) for t in prompt]
    ref = [int(t) for t in reference]
    if len(prompt) < 2 or not ref:
        raise ValueError(f"need a prompt of >= 2 tokens and a non-empty reference; got {len(prompt)}, {len(ref)}")
    S = prompt + ref
    Lp, N, B = len(prompt), len(ref), lmax + 1
    dev = target.get_input_embeddings().weight.device
    gen = torch.Generator(device=dev).manual_seed(seed)   # draws are made where the draft's probabilities are
    _, t_cache = full_cache(target, S)
    _, d_cache = full_cache(draft, S)
    p = np.empty(N)
    q = np.empty((N, lmax))
    U = np.full((N, lmax, lmax + 1), np.nan)
    a_idx = torch.arange(B, device=dev)                  # chain a (a = lmax: the greedy chain for the draft)
    with RouterTap(target) as tap:
        for i in tqdm(range(N), desc=f"junk tails {seq_id}", disable=not progress, leave=False):
            ctx = Lp + i - 1                             # cached positions before the verification input
            cur = S[ctx]
            dc = cache_prefix(d_cache, ctx, B, draft.config)
            tokens = torch.full((B, 1), cur, dtype=torch.long, device=dev)
            chains = torch.empty((B, lmax), dtype=torch.long, device=dev)
            for j in range(lmax):
                probs = torch.softmax(draft(input_ids=tokens, cache=dc, use_cache=True).logits[:, -1].float(), -1)
                free = torch.multinomial(probs, 1, generator=gen)[:, 0]
                top_p, top = probs.max(-1)
                q[i, j] = float(top_p[lmax])
                tok = free.clone()
                if i + j < N:                            # a reference token x_{i+1+j} exists
                    r = ref[i + j]
                    if j == 0:
                        p[i] = float(probs[0, r])
                    zeroed = probs.clone()
                    zeroed[:, r] = 0.0
                    ok = zeroed.sum(-1) > 0              # a draft sure of the reference has nothing else
                    wrong = torch.where(ok, torch.multinomial(torch.where(ok[:, None], zeroed, probs), 1,
                                                              generator=gen)[:, 0], free)
                    tok = torch.where(a_idx > j, torch.full_like(free, r), torch.where(a_idx == j, wrong, free))
                tok[lmax] = top[lmax]                    # the greedy chain
                chains[:, j] = tok
                tokens = tok[:, None]
            # target rows: chain a for a < lmax; the all-reference chain as row lmax
            rows = chains.clone()
            ref_part = [ref[i + j] if i + j < N else int(chains[lmax - 1, j]) for j in range(lmax)]
            rows[lmax] = torch.tensor(ref_part, device=dev)
            rows = torch.cat([torch.full((B, 1), cur, dtype=torch.long, device=dev), rows], dim=1)
            tc = cache_prefix(t_cache, ctx, B, target.config)
            tap.clear()
            target(input_ids=rows, cache=tc, use_cache=True)
            cum = union_sizes(tap.take(B), tap.num_experts).mean(axis=-1)     # [B, lmax+1]
            for k in range(1, lmax + 1):
                U[i, k - 1, :k + 1] = cum[:k + 1, k]
        top_k, n_exp = tap.top_k, tap.num_experts
    return OracleInputs(seq_id, category, p, q, U, np.arange(N) + Lp, top_k, n_exp,
                        {"seed": seed, "prompt_len": Lp})


def save_inputs(items: list[OracleInputs], path) -> None:
    """All sequences into one ``.npz`` (concatenated along positions, with offsets), atomically."""

    if not items:
        raise ValueError("no oracle inputs to save")
    lmax = {it.lmax for it in items}
    if len(lmax) != 1:
        raise ValueError(f"all sequences must share Lmax; found {sorted(lmax)}")
    offsets = np.cumsum([0] + [it.n for it in items])
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, p=np.concatenate([it.p for it in items]),
                                q=np.concatenate([it.q for it in items]), U=np.concatenate([it.U for it in items]),
                                L_prefix=np.concatenate([it.L_prefix for it in items]), offsets=offsets,
                                seq_id=np.array([it.seq_id for it in items]),
                                category=np.array([it.category for it in items]),
                                top_k=np.array([it.top_k for it in items]),
                                num_experts=np.array([it.num_experts for it in items]))


def load_inputs(path) -> list[OracleInputs]:
    with np.load(path, allow_pickle=False) as z:
        missing = {"p", "q", "U", "L_prefix", "offsets", "seq_id", "category", "top_k", "num_experts"} - set(z.files)
        if missing:
            raise ValueError(f"{path}: not an oracle-inputs file; missing arrays {sorted(missing)}")
        off = z["offsets"]
        return [OracleInputs(str(z["seq_id"][s]), str(z["category"][s]), z["p"][a:b], z["q"][a:b], z["U"][a:b],
                             z["L_prefix"][a:b], int(z["top_k"][s]), int(z["num_experts"][s]))
                for s, (a, b) in enumerate(zip(off[:-1], off[1:]))]


def synthetic_inputs(n: int = 200, lmax: int = 12, num_experts: int = 64, top_k: int = 8, prompt_len: int = 64,
                     seed: int = 0, seq_id: str = "syn", category: str = "synthetic") -> OracleInputs:
    """Synthetic oracle inputs for tests and the quick profile: confidences with runs of easy and hard
    tokens, unions that grow with the number of positions and faster past a mismatch."""
    rng = np.random.default_rng(seed)
    easy = rng.random(n) < 0.6
    p = np.where(easy, rng.beta(8, 1.5, n), rng.beta(1.5, 3, n))
    q = np.clip(np.stack([np.roll(p, -j) for j in range(lmax)], 1) + rng.normal(0, 0.05, (n, lmax)), 0, 1)
    U = np.full((n, lmax, lmax + 1), np.nan)
    pos = np.arange(lmax + 1)
    for i in range(n):
        base = rng.uniform(3.0, 6.0)
        for a in range(lmax + 1):
            inc = np.where(pos >= a, base * 1.3, base) * rng.uniform(0.8, 1.2, lmax + 1)
            inc[0] = top_k
            cum = np.minimum(np.cumsum(inc), np.minimum(num_experts, (pos + 1) * top_k))   # physical bounds
            for k in range(max(a, 1), lmax + 1):
                U[i, k - 1, a] = cum[k]
    return OracleInputs(seq_id, category, p, q, U, np.arange(n) + prompt_len, top_k, num_experts,
                        {"seed": seed, "synthetic": True})


def replayed_inputs(routing, prompt_len: int, n: int, lmax: int, a: float, seq_id: str = "",
                    category: str = "") -> OracleInputs:
    """Oracle inputs for a subject whose routing is replayed from a trace
    (:class:`moespec.engine.replay.ReplayRouting`, its current document) and whose draft is the
    oracle draft of acceptance ``a``: every draft token matches with probability ``a``
    (p = q = a), and a verification pass at state i covers the positions prompt_len + i - 1 ..
    prompt_len + i - 1 + k whatever the tokens (the routing is a function of the position), so
    U(i, k, a') is the layer-averaged union of the trace's experts there, the same for every a'."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance a must lie in [0, 1], got {a}")
    ids = routing.ids.numpy()
    last = prompt_len - 1 + n - 1 + lmax
    if prompt_len < 2 or last >= ids.shape[0]:
        raise ValueError(f"trace document {routing.doc} has {ids.shape[0]} positions; states 0..{n - 1} with "
                         f"Lmax = {lmax} after a prompt of {prompt_len} need {last + 1}")
    U = np.full((n, lmax, lmax + 1), np.nan)
    for i in range(n):
        ctx = prompt_len + i - 1
        cum = union_sizes(ids[ctx:ctx + lmax + 1], routing.trace.num_experts).mean(axis=-1)   # [lmax + 1]
        for k in range(1, lmax + 1):
            U[i, k - 1, :k + 1] = cum[k]
    p = np.full(n, float(a))
    return OracleInputs(seq_id, category, p, np.full((n, lmax), float(a)), U, prompt_len + np.arange(n),
                        routing.trace.top_k, routing.trace.num_experts,
                        {"replayed": routing.trace.label, "doc": routing.doc, "a": float(a)})
