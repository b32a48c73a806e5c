"""Counterfactual junk tails and the union matrix U(i, k, a) (paper 2, Section 4.2).

For a reference sequence X = x_1..x_N after a prompt, and every state i (x_1..x_i produced):

1. the draft's confidence in the reference, p[i] = P_draft(x_{i+1} | prompt, X_<=i) (eq. 7's p_j is
   p[i + j]: paper 2's surrogate transition model), and from the same distribution the greedy
   indicator g[i] = 1 when the draft's argmax given the reference prefix is x_{i+1}, else 0 (the
   greedy-exact transition model: a greedy draft under greedy verification, as moespec's engine
   runs it, has its j-th drafted token accepted exactly when g[i + j] = 1 and all before it were);
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
greedy token along its own greedy chain), which the online early-exit policy may use, and that
chain itself (``draft_chain[i, j]``: the draft's greedy token j + 1 from state i, along its own
tokens), kept with the reference tokens (``tokens``) for the text analyses of Appendix B
(:mod:`moespec.oracle.boundaries`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import torch
from moespec.progress import tqdm

from moespec.io import atomic_path
from moespec.routing.stats import union_sizes
from moespec.threads import torch_threads

from .hf import RouterTap, cache_prefix, full_cache


#: The transition models of the oracle (``OracleInputs.with_transitions``): paper 2's surrogate
#: p_j = P_draft(reference token | reference prefix), and greedy-exact p_j = g (0 or 1).
TRANSITIONS = ("surrogate", "greedy")


@dataclass
class OracleInputs:
    """Everything the oracle needs for one reference sequence (single-sample Monte Carlo tails).

    ``p`` is what the oracle's transitions (eq. 7) use: paper 2's surrogate as recorded;
    :meth:`with_transitions` gives the same inputs with the greedy-exact ``greedy`` in its place.
    """
    seq_id: str
    category: str
    p: np.ndarray            # [N] draft confidence in the reference token (the transitions in use)
    greedy: np.ndarray       # [N] probability that a drafted token there is accepted under greedy verification:
    #                          1.0 / 0.0 for a greedy model draft (argmax == reference token), a for the oracle draft
    q: np.ndarray            # [N, Lmax] draft confidence in its own greedy chain (online signal)
    U: np.ndarray            # [N, Lmax, Lmax + 1] layer-averaged unions; entries a > k are NaN
    L_prefix: np.ndarray     # [N] prompt length + i
    top_k: int
    num_experts: int
    meta: dict = field(default_factory=dict)
    tokens: np.ndarray | None = None        # [N] the reference token ids x_1..x_N (optional: Appendix B's text)
    draft_chain: np.ndarray | None = None   # [N, Lmax] the draft's greedy chain from each state (optional)

    def __post_init__(self):
        n = np.shape(self.p)[0] if np.ndim(self.p) else 0
        g = np.asarray(self.greedy, dtype=float)
        if g.shape != (n,):
            raise ValueError(f"oracle inputs {self.seq_id!r}: greedy must have shape [{n}] like p; got {g.shape}")
        if not np.all((g >= 0) & (g <= 1)):
            raise ValueError(f"oracle inputs {self.seq_id!r}: greedy must lie in [0, 1] (acceptance probabilities); "
                             f"found {g[~((g >= 0) & (g <= 1))][:3]}")
        self.greedy = g
        if self.tokens is not None:
            self.tokens = np.asarray(self.tokens, dtype=np.int64)
            if self.tokens.shape != (n,):
                raise ValueError(f"oracle inputs {self.seq_id!r}: tokens must have shape [{n}] like p; "
                                 f"got {self.tokens.shape}")
        if self.draft_chain is not None:
            self.draft_chain = np.asarray(self.draft_chain, dtype=np.int64)
            want = (n, np.shape(self.q)[1])
            if self.draft_chain.shape != want:
                raise ValueError(f"oracle inputs {self.seq_id!r}: draft_chain must have shape [N, Lmax] = "
                                 f"{list(want)} like q; got {self.draft_chain.shape}")

    def require_tokens(self, what: str = "this analysis") -> tuple[np.ndarray, np.ndarray]:
        """(tokens, draft_chain), or a ValueError naming the missing field: inputs replayed from a
        routing trace carry no tokens and cannot be read as text."""
        missing = [name for name in ("tokens", "draft_chain") if getattr(self, name) is None]
        if missing:
            raise ValueError(f"oracle inputs {self.seq_id!r}: {what} needs {' and '.join(missing)} (the reference "
                             f"token ids and the draft's greedy chain, recorded by junk_tails); these inputs have "
                             f"none (replayed from a routing trace, which has no text): record the "
                             f"junk tails again (notebook 07 with reuse=False)")
        return self.tokens, self.draft_chain

    @property
    def n(self) -> int:
        return int(self.p.shape[0])

    @property
    def transitions(self) -> str:
        """The transition model ``p`` holds: ``"surrogate"`` (as recorded) or ``"greedy"``."""
        return self.meta.get("transitions", "surrogate")

    def with_transitions(self, transitions: str) -> "OracleInputs":
        """These inputs with ``p`` from the named transition model (:data:`TRANSITIONS`): ``"surrogate"``
        (paper 2, eq. 7: p = P_draft(reference token | reference prefix)) or ``"greedy"`` (p = greedy:
        under greedy verification with a greedy draft a drafted token is accepted exactly when the
        draft's argmax is the reference token). U, costs and the online signal q are unchanged."""
        if transitions not in TRANSITIONS:
            raise ValueError(f"transitions must be one of {TRANSITIONS}; got {transitions!r}")
        if transitions == self.transitions:
            return self
        if self.transitions != "surrogate":
            raise ValueError(f"oracle inputs {self.seq_id!r} already use the {self.transitions} transitions; "
                             "take the recorded inputs (surrogate) to change them")
        return replace(self, p=self.greedy, meta={**self.meta, "transitions": transitions})

    @property
    def lmax(self) -> int:
        return int(self.U.shape[1])

    def truncated(self, lmax: int) -> "OracleInputs":
        """The same inputs for a smaller budget (U(i, k, a) does not depend on Lmax)."""
        if not 1 <= lmax <= self.lmax:
            raise ValueError(f"lmax must lie in 1..{self.lmax}; got {lmax}")
        return replace(self, q=self.q[:, :lmax], U=self.U[:, :lmax, :lmax + 1], meta=dict(self.meta),
                       draft_chain=None if self.draft_chain is None else self.draft_chain[:, :lmax])


def junk_tails(target, draft, prompt, reference, lmax: int = 12, seed: int = 0, seq_id: str = "",
               category: str = "", progress: bool = False, threads: int | None = 1) -> OracleInputs:
    """Run Section 4.2's counterfactual simulation for one reference sequence (module docstring)."""
    with torch_threads(threads):
        return _junk_tails(target, draft, prompt, reference, lmax, seed, seq_id, category, progress)


def twin_agreement(target, twin, draft, prompt, reference, states: int = 4, lmax: int = 12, seed: int = 0,
                   threads: int | None = 1) -> dict:
    """:func:`junk_tails` over the first ``states`` reference positions of one sequence, once on
    ``target`` and once on its narrow ``twin`` (:func:`moespec.engine.subject.routing_twin`), same
    draft and seed: what the twin's counterfactual routing is worth in place of the target's. Returns
    the positions compared, the union cells (i, k, a) compared and how many are equal, the largest
    union difference, and the largest difference of the draft confidences p and q (the draft is the
    same, so these are 0 unless the target's choices feed back into the draws: they do not)."""
    ref = [int(t) for t in reference][:max(int(states), 1)]
    a = junk_tails(target, draft, prompt, ref, lmax=lmax, seed=seed, threads=threads)
    b = junk_tails(twin, draft, prompt, ref, lmax=lmax, seed=seed, threads=threads)
    cells = ~np.isnan(a.U)
    if not np.array_equal(cells, ~np.isnan(b.U)):
        raise RuntimeError("target and twin filled different union cells; they do not run the same simulation")
    diff = np.abs(a.U[cells] - b.U[cells])
    return {"states": len(ref), "lmax": int(lmax), "union_cells": int(cells.sum()),
            "union_cells_equal": int((diff == 0).sum()), "union_max_abs_diff": float(diff.max(initial=0.0)),
            "p_max_abs_diff": float(np.abs(a.p - b.p).max(initial=0.0)),
            "q_max_abs_diff": float(np.abs(a.q - b.q).max(initial=0.0))}


def sequences_junk_tails(target, draft, prompts: list, references: dict, lmax: int = 12, seed: int = 0,
                         threads: int | None = 1, twin=None, check_states: int = 8,
                         progress: bool = True) -> tuple[list[OracleInputs], dict | None]:
    """:func:`junk_tails` of every prompt (dicts with ``ids``, ``question_id``, ``category``; its
    reference in ``references[question_id]``; prompt s drawn with seed ``seed + s``). With a
    ``twin`` (:func:`moespec.engine.subject.routing_twin`) the tails run on it once
    :func:`twin_agreement` over the first prompt's first ``check_states`` positions finds every
    union cell equal; otherwise, or without a twin, on ``target``. Returns (inputs, the agreement
    with ``"used"``: ``"twin"`` or ``"target"``; None without a twin)."""
    agreement, runner = None, target
    if twin is not None:
        first = prompts[0]
        agreement = twin_agreement(target, twin, draft, first["ids"], references[first["question_id"]],
                                   states=check_states, lmax=lmax, seed=seed, threads=threads)
        same = agreement["union_cells_equal"] == agreement["union_cells"]
        runner = twin if same else target
        agreement["used"] = "twin" if same else "target"
    items = [junk_tails(runner, draft, p["ids"], references[p["question_id"]], lmax=lmax, seed=seed + s,
                        seq_id=str(p["question_id"]), category=p["category"], threads=threads)
             for s, p in enumerate(tqdm(prompts, desc="junk tails", disable=not progress))]
    return items, agreement


def junk_tails_summary(items: list[OracleInputs], agreement: dict | None, seconds: float, threads: int) -> str:
    """One line on :func:`sequences_junk_tails`' work: positions, time, threads, the model they ran
    on and the twin's agreement with the target."""
    on = "the subject's target" if agreement is None or agreement["used"] == "target" else "its narrow twin"
    line = (f"junk tails: {sum(it.n for it in items)} positions in {seconds:.0f} s on {threads} torch thread(s) "
            f"(not timed), on {on}")
    if agreement is not None:
        line += (f"; twin against target over {agreement['states']} positions: {agreement['union_cells_equal']} of "
                 f"{agreement['union_cells']} union cells equal (largest difference {agreement['union_max_abs_diff']:g})")
    return line


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
    g = np.empty(N)
    q = np.empty((N, lmax))
    own = np.empty((N, lmax), dtype=np.int64)            # the draft's greedy chain from each state
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
                logits = draft(input_ids=tokens, cache=dc, use_cache=True).logits[:, -1]
                probs = torch.softmax(logits.float(), -1)
                free = torch.multinomial(probs, 1, generator=gen)[:, 0]
                top_p, top = probs.max(-1)
                q[i, j] = float(top_p[lmax])
                tok = free.clone()
                if i + j < N:                            # a reference token x_{i+1+j} exists
                    r = ref[i + j]
                    if j == 0:                           # every row's input is x_i: the reference prefix
                        p[i] = float(probs[0, r])
                        g[i] = float(int(logits[0].argmax()) == r)   # the token a greedy draft proposes
                    zeroed = probs.clone()
                    zeroed[:, r] = 0.0
                    ok = zeroed.sum(-1) > 0              # a draft sure of the reference has nothing else
                    wrong = torch.where(ok, torch.multinomial(torch.where(ok[:, None], zeroed, probs), 1,
                                                              generator=gen)[:, 0], free)
                    tok = torch.where(a_idx > j, torch.full_like(free, r), torch.where(a_idx == j, wrong, free))
                tok[lmax] = top[lmax]                    # the greedy chain
                chains[:, j] = tok
                tokens = tok[:, None]
            own[i] = chains[lmax].cpu().numpy()          # the draft's greedy chain: row lmax of the chains
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
    return OracleInputs(seq_id, category, p, g, q, U, np.arange(N) + Lp, top_k, n_exp,
                        {"seed": seed, "prompt_len": Lp}, tokens=np.array(ref), draft_chain=own)


#: The arrays of an oracle-inputs file (:func:`save_inputs`).
INPUT_ARRAYS = ("p", "greedy", "q", "U", "L_prefix", "offsets", "seq_id", "category", "top_k", "num_experts")
#: Optional arrays (Appendix B's text): saved when every sequence has them; a file without them loads with None.
TOKEN_ARRAYS = ("tokens", "draft_chain")


def save_inputs(items: list[OracleInputs], path) -> None:
    """All sequences into one ``.npz`` (concatenated along positions, with offsets), atomically.
    Only recorded inputs (surrogate ``p``) are saved, not a :meth:`OracleInputs.with_transitions` copy."""

    if not items:
        raise ValueError("no oracle inputs to save")
    lmax = {it.lmax for it in items}
    if len(lmax) != 1:
        raise ValueError(f"all sequences must share Lmax; found {sorted(lmax)}")
    swapped = [it.seq_id for it in items if it.transitions != "surrogate"]
    if swapped:
        raise ValueError(f"sequences {swapped[:3]} hold another transition model in p; save the recorded inputs")
    offsets = np.cumsum([0] + [it.n for it in items])
    optional = {name: np.concatenate([getattr(it, name) for it in items]) for name in TOKEN_ARRAYS
                if all(getattr(it, name) is not None for it in items)}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, p=np.concatenate([it.p for it in items]),
                                greedy=np.concatenate([it.greedy for it in items]),
                                q=np.concatenate([it.q for it in items]), U=np.concatenate([it.U for it in items]),
                                L_prefix=np.concatenate([it.L_prefix for it in items]), offsets=offsets,
                                seq_id=np.array([it.seq_id for it in items]),
                                category=np.array([it.category for it in items]),
                                top_k=np.array([it.top_k for it in items]),
                                num_experts=np.array([it.num_experts for it in items]), **optional)


def load_inputs(path) -> list[OracleInputs]:
    """The sequences :func:`save_inputs` wrote. A file without one of :data:`INPUT_ARRAYS` is
    refused with what to do; one without the optional :data:`TOKEN_ARRAYS` (replayed routing) loads
    with ``tokens`` / ``draft_chain`` None."""
    with np.load(path, allow_pickle=False) as z:
        if missing := set(INPUT_ARRAYS) - set(z.files):
            raise ValueError(f"{path}: expected the oracle-inputs arrays {list(INPUT_ARRAYS)}, found {sorted(z.files)} "
                             f"(missing {sorted(missing)}); delete it, or run notebook 07 with reuse=False, to record "
                             "the junk tails again")
        off = z["offsets"]
        if z["greedy"].shape != z["p"].shape:
            raise ValueError(f"{path}: array 'greedy' has shape {z['greedy'].shape}; expected {z['p'].shape} like p")
        optional = {name: z[name] for name in TOKEN_ARRAYS if name in z.files}
        for name, arr in optional.items():
            if arr.shape[0] != z["p"].shape[0]:
                raise ValueError(f"{path}: array {name!r} has {arr.shape[0]} positions; expected {z['p'].shape[0]} "
                                 "like p")
        return [OracleInputs(str(z["seq_id"][s]), str(z["category"][s]), z["p"][a:b], z["greedy"][a:b], z["q"][a:b],
                             z["U"][a:b], z["L_prefix"][a:b], int(z["top_k"][s]), int(z["num_experts"][s]),
                             **{name: arr[a:b] for name, arr in optional.items()})
                for s, (a, b) in enumerate(zip(off[:-1], off[1:]))]


def synthetic_inputs(n: int = 200, lmax: int = 12, num_experts: int = 64, top_k: int = 8, prompt_len: int = 64,
                     seed: int = 0, seq_id: str = "syn", category: str = "synthetic") -> OracleInputs:
    """Synthetic oracle inputs for tests and the quick profile: confidences with runs of easy and hard
    tokens, unions that grow with the number of positions and faster past a mismatch. The greedy
    indicator is 1 where p > 1/2 (the reference token is then the argmax) and otherwise 1 with
    probability p (drawn from a second stream, so the other arrays are those of ``seed`` alone)."""
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
    greedy = ((p > 0.5) | (np.random.default_rng([seed, 1]).random(n) < p)).astype(float)
    return OracleInputs(seq_id, category, p, greedy, q, U, np.arange(n) + prompt_len, top_k, num_experts,
                        {"seed": seed, "synthetic": True})


def replayed_inputs(routing, prompt_len: int, n: int, lmax: int, a: float, seq_id: str = "",
                    category: str = "") -> OracleInputs:
    """Oracle inputs for a subject whose routing is replayed from a trace
    (:class:`moespec.engine.replay.ReplayRouting`, its current document) and whose draft is the
    oracle draft of acceptance ``a``: every draft token matches with probability ``a``
    (p = q = a), and a verification pass at state i covers the positions prompt_len + i - 1 ..
    prompt_len + i - 1 + k whatever the tokens (the routing is a function of the position), so
    U(i, k, a') is the layer-averaged union of the trace's experts there, the same for every a'.

    Greedy-exact transitions for the oracle draft: it is not a greedy draft; it proposes the target's
    greedy token and replaces each one, independently, with probability 1 - a
    (:class:`moespec.engine.OracleDraft`), so under greedy verification a drafted token is accepted
    with probability a whatever the position. That is the exact law, and it is the surrogate's:
    ``greedy`` = a, and the two transition models give the same oracle on a replayed subject."""
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
    return OracleInputs(seq_id, category, p, p.copy(), np.full((n, lmax), float(a)), U, prompt_len + np.arange(n),
                        routing.trace.top_k, routing.trace.num_experts,
                        {"replayed": routing.trace.label, "doc": routing.doc, "a": float(a)})
