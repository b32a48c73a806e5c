"""Appendix B of paper 2 on our text: where the oracle's chosen k* stops against the reference text,
and new experts at boundaries and at the first mismatch (Figures B3 and B5).

**Positions and decisions.** Reference token t (0-based) is x_{t+1}, the token a draft proposes at
state t; the decision at state i is k*[i] (:func:`moespec.oracle.analysis.solve`) and drafts the
reference positions i .. i + k* - 1 (steps j = 1 .. k*). A decision's context is the label of its
first drafted token (position i); ``label_next`` is the label of the token just past the draft
(position i + k*), where the decision stops.

**Context labels** (:func:`classify`), one per token from the decoded reference text, the first
rule that holds (``LABELS`` in this order):

1. ``script change``: the token's first letter has another Unicode script (the first word of its
   Unicode name: LATIN, CYRILLIC, GREEK, CJK, ARABIC, ...) than the last letter before it;
2. ``code-prose transition``: the first visible token of a line whose kind (code or prose, rule 4)
   differs from the previous non-blank line's;
3. ``paragraph / heading``: the token holds a newline, or its line is a WikiText heading
   (`` = Title = ``, `` = = Section = = ``);
4. ``code formatting``: its line looks like code (:data:`CODE_LINE`: braces, a line ending in ``;``,
   ``()``, ``==``, ``=>``, ``!=``, ``//``, ``#include``, a keyword line ending in ``:``/``(``/``{``,
   or four-space / tab indentation);
5. ``markup / formula``: the token holds a digit, WikiText's ``@`` markup (``@-@``, ``@,@``,
   ``@.@``) or a formula sign (``= + * / ^ < > % $ \\ | ~``), WikiText's ``<unk>`` (an
   out-of-vocabulary word) aside;
6. ``sentence boundary``: the token ends a sentence (its text ends in ``.``, ``!`` or ``?``, after
   closing quotes or brackets) or starts one (a capitalised word after such an end);
7. ``word continuation``: the token continues a word (no leading space, a letter after a letter);
8. ``prose vocabulary``: any other token (a new word, punctuation inside a sentence).

**First mismatch** of a decision: the first drafted step j whose drafted token differs from the
reference, read from the greedy indicator (the draft's argmax given the reference prefix is the
reference token exactly when ``greedy`` = 1, and along matched tokens the draft's chain is the
reference prefix).

**New experts** at continuation step j of chain a from state i (:func:`new_experts`): with V(i, m, a)
the layer-averaged union over the first m + 1 positions of chain a's verification input
([x_i] + chain), V(i, 0, a) = top_k (one token's experts) and V(i, m, a) = U[i, m - 1, min(a, m)]
for m >= 1 (``junk``: U[i, k - 1, a] is the union over positions 0..k of chain a; a chain with a >= m
has the reference as its first m tokens, so V(i, m, a) = V(i, m, m) there),

    new(i, j, a) = V(i, j, a) - V(i, j - 1, a),   j = 1 .. Lmax,

defined where the chain's first j tokens lie in the reference (i + j <= N; past its end the junk
tails draw every chain freely). Along the reference continuation a = Lmax; at the first mismatch at
step j the mismatching token is the junk tails' counterfactual wrong token (chain a = j - 1, drawn
from the draft with the reference token's probability zeroed: the tail the oracle's cost uses).

Intervals are percentile intervals of a response-level clustered bootstrap (:func:`cluster_weights`:
responses, i.e. reference sequences, resampled with replacement, seeded).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .junk import OracleInputs
from .transitions import acceptance_probs

#: The context labels, in the order :func:`classify` tries them.
LABELS = ("script change", "code-prose transition", "paragraph / heading", "code formatting", "markup / formula",
          "sentence boundary", "word continuation", "prose vocabulary")
#: The label of every position when the subject has no tokenizer (its text cannot be read).
NO_TEXT = "no text (no tokenizer)"
#: Labels that mark a boundary (a decision stopping right before one is a gallery case).
BOUNDARY_LABELS = ("script change", "code-prose transition", "paragraph / heading", "sentence boundary")

CODE_LINE = re.compile(r"[{}]|;\s*$|\(\)|==|=>|!=|//|#include|^(    |\t)\S|"
                       r"^\s*(def|class|import|return|for|while|if|elif|else|try|except|function|var|let|const)\b"
                       r".*[:({]\s*$")
HEADING_LINE = re.compile(r"^\s*=(\s*=)*\s.*\s=(\s*=)*\s*$|^\s*=(\s*=)*\s*$")
FORMULA = re.compile(r"[0-9@=+*/^<>%$\\|~]")
#: WikiText's out-of-vocabulary word: a word, not markup (its angle brackets are no formula).
UNK = "<unk>"
SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s*$")


def script_of(ch: str) -> str | None:
    """The Unicode script of a letter (first word of its Unicode name), None for a non-letter."""
    if not ch.isalpha():
        return None
    try:
        return unicodedata.name(ch).split()[0]
    except ValueError:
        return None


def _last_script(text: str) -> str | None:
    for ch in reversed(text):
        if (s := script_of(ch)) is not None:
            return s
    return None


def _first_script(text: str) -> str | None:
    for ch in text:
        if (s := script_of(ch)) is not None:
            return s
    return None


def token_texts(ids, tokenizer) -> list[str]:
    """Each token's text as it appears in the decoded sequence: decode(ids[:t + 1]) minus
    decode(ids[:t]) over a short window (byte-level BPE splits a character over tokens; a token
    alone may decode to a replacement character)."""
    ids = [int(t) for t in ids]
    out = []
    for t in range(len(ids)):
        lo = max(0, t - 8)
        before, upto = tokenizer.decode(ids[lo:t]), tokenizer.decode(ids[lo:t + 1])
        out.append(upto[len(before):] if upto.startswith(before) else tokenizer.decode([ids[t]]))
    return out


def classify(texts: list[str]) -> list[str]:
    """One context label (:data:`LABELS`, module docstring) per token text of one sequence."""
    full = "".join(texts)
    starts = np.cumsum([0] + [len(t) for t in texts])
    lines = full.split("\n")
    line_of = np.cumsum([0] + [len(s) + 1 for s in lines])           # start offset of every line

    def line_at(pos: int) -> int:
        return int(np.searchsorted(line_of, pos, side="right") - 1)

    kinds = ["blank" if not s.strip() else "code" if CODE_LINE.search(s) else "prose" for s in lines]
    labels = []
    for t, tok in enumerate(texts):
        before = full[:starts[t]]
        visible = len(tok) - len(tok.lstrip())                       # the token's first visible character
        ln = line_at(int(starts[t]) + min(visible, max(len(tok) - 1, 0)))
        prev_kind = next((kinds[m] for m in range(ln - 1, -1, -1) if kinds[m] != "blank"), None)
        first_visible = tok.strip() != "" and full[line_of[ln]:starts[t] + visible].strip() == ""
        s_prev, s_tok = _last_script(before), _first_script(tok)
        if s_prev is not None and s_tok is not None and s_prev != s_tok:
            label = "script change"
        elif first_visible and prev_kind is not None and kinds[ln] != prev_kind:
            label = "code-prose transition"
        elif "\n" in tok or HEADING_LINE.match(lines[ln]):
            label = "paragraph / heading"
        elif kinds[ln] == "code":
            label = "code formatting"
        elif FORMULA.search(tok.replace(UNK, "")):
            label = "markup / formula"
        elif (tok.strip() and SENTENCE_END.search(tok)) or (
                SENTENCE_END.search(before) and tok[:1].isspace() and tok.strip()[:1].isupper()):
            label = "sentence boundary"
        elif tok[:1].isalpha() and before[-1:].isalpha():
            label = "word continuation"
        else:
            label = "prose vocabulary"
        labels.append(label)
    return labels


def first_mismatch(greedy, i: int, steps: int) -> int:
    """The first step j in 1..steps (drafted from state i) whose token differs from the reference
    (greedy indicator 0), or 0 when all of them match; steps past the reference's end do not count."""
    n = len(greedy)
    for j in range(1, steps + 1):
        if i + j - 1 >= n:
            break
        if greedy[i + j - 1] < 0.5:
            return j
    return 0


def new_experts(U: np.ndarray, top_k: int) -> np.ndarray:
    """new(i, j, a) at index ``[i, j - 1, a]``, shape ``[N, Lmax, Lmax + 1]`` (module docstring);
    NaN where chain a's first j tokens run past the reference (i + j > N)."""
    U = np.asarray(U, dtype=float)
    n, lmax = U.shape[0], U.shape[1]
    V = np.empty((n, lmax + 1, lmax + 1))
    V[:, 0, :] = top_k
    for m in range(1, lmax + 1):
        V[:, m, :] = U[:, m - 1, np.minimum(np.arange(lmax + 1), m)]
    new = V[:, 1:, :] - V[:, :-1, :]
    inside = (np.arange(n)[:, None] + np.arange(1, lmax + 1)[None, :]) <= n      # i + j <= N
    new[~inside] = np.nan
    return new


def cluster_weights(n_clusters: int, n_boot: int = 999, seed: int = 0) -> np.ndarray:
    """``[n_boot, n_clusters]``: how often each response is drawn in each clustered-bootstrap
    resample (n_clusters draws with replacement); a statistic that is a ratio of per-response sums
    is then W @ sums / W @ counts for every resample at once."""
    if n_clusters < 1:
        raise ValueError("a clustered bootstrap needs at least one response")
    return np.random.default_rng(seed).multinomial(n_clusters, np.full(n_clusters, 1.0 / n_clusters), size=n_boot)


def _interval(samples: np.ndarray, level: float) -> tuple[float, float]:
    s = samples[np.isfinite(samples)]
    if not len(s):
        return float("nan"), float("nan")
    return tuple(float(v) for v in np.quantile(s, [(1 - level) / 2, (1 + level) / 2]))


def clustered_mean(values, clusters, n_boot: int = 999, seed: int = 0, level: float = 0.95) -> dict:
    """Pooled mean of ``values`` (decisions) with a response-level clustered bootstrap interval:
    ``{"estimate", "lo", "hi", "n", "responses"}``; NaN for no values."""
    values = np.asarray(values, dtype=float)
    clusters = np.asarray(clusters)
    if not len(values):
        return {"estimate": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": 0, "responses": 0}
    names, idx = np.unique(clusters, return_inverse=True)
    sums, counts = np.bincount(idx, values, len(names)), np.bincount(idx, minlength=len(names)).astype(float)
    W = cluster_weights(len(names), n_boot, seed)
    with np.errstate(invalid="ignore", divide="ignore"):
        boot = (W @ sums) / (W @ counts)
    lo, hi = _interval(boot, level)
    return {"estimate": float(sums.sum() / counts.sum()), "lo": lo, "hi": hi, "n": int(len(values)),
            "responses": int(len(names))}


def aligned_difference(event_values, event_steps, event_clusters, other_values, other_steps, other_clusters,
                       n_boot: int = 999, seed: int = 0, level: float = 0.95) -> dict:
    """Event mean, the comparison group's mean aligned by continuation step (its per-step means
    weighted by the event group's step shares), and their difference, each with a response-level
    clustered bootstrap interval (one set of resampled responses for all three)."""
    ev, es, ec = (np.asarray(x) for x in (event_values, event_steps, event_clusters))
    ov, os_, oc = (np.asarray(x) for x in (other_values, other_steps, other_clusters))
    out = {"events": int(len(ev)), "event_responses": int(len(np.unique(ec))), "others": int(len(ov))}
    if not len(ev) or not len(ov):
        return {**out, **{f"{q}{s}": float("nan") for q in ("event", "other", "difference") for s in ("", "_lo", "_hi")}}
    names, inv = np.unique(np.concatenate([ec, oc]), return_inverse=True)
    eci, oci = inv[:len(ec)], inv[len(ec):]
    steps = np.unique(np.concatenate([es, os_]))
    C, S = len(names), len(steps)
    esi, osi = np.searchsorted(steps, es), np.searchsorted(steps, os_)

    def table(ci, si, v):
        sums, counts = np.zeros((C, S)), np.zeros((C, S))
        np.add.at(sums, (ci, si), v.astype(float))
        np.add.at(counts, (ci, si), 1.0)
        return sums, counts

    e_sum, e_cnt = table(eci, esi, ev)
    o_sum, o_cnt = table(oci, osi, ov)

    def stats(w):                                   # w: [B, C] resample weights
        es_, en = w @ e_sum, w @ e_cnt              # [B, S]
        os_s, on = w @ o_sum, w @ o_cnt
        with np.errstate(invalid="ignore", divide="ignore"):
            event = es_.sum(1) / en.sum(1)
            share = en / en.sum(1, keepdims=True)
            other_step = os_s / on
            other = np.where(share > 0, share * other_step, 0.0).sum(1)
            other[np.any((share > 0) & (on == 0), axis=1)] = np.nan    # a step of the events without comparison
        return event, other, event - other

    point = stats(np.ones((1, C)))
    boot = stats(cluster_weights(C, n_boot, seed))
    for name, p, b in zip(("event", "other", "difference"), point, boot):
        out[name] = float(p[0])
        out[f"{name}_lo"], out[f"{name}_hi"] = _interval(b, level)
    return out


def decisions(solved, labels: dict, surrogate: dict | None = None) -> pd.DataFrame:
    """One row per decision of the solved sequences (``analysis.Solved``): seq_id, category, i, k
    (k*), label (of position i), label_next (of position i + k*, None past the end), first_mismatch
    (step, 0 none), all_matched, p_drafted (surrogate probability that the k* drafted tokens match),
    p_more (that k* + 1 match), a_mode (the modal accepted count under the solved transitions),
    new_at_mismatch / new_before_mismatch (experts at the first mismatch's step and the step before),
    and the same three for the whole window of Lmax steps whatever k* (``*_window``).
    ``labels``: seq_id -> the per-position labels (:func:`classify`); ``surrogate``: seq_id -> the
    recorded surrogate p (needed when the solved inputs hold the greedy-exact transitions)."""
    rows = []
    for s in solved:
        it: OracleInputs = s.inputs
        lab = labels[it.seq_id]
        if len(lab) != it.n:
            raise ValueError(f"labels of {it.seq_id!r}: {len(lab)} labels for {it.n} positions")
        if it.transitions == "surrogate":
            sp = it.p
        elif surrogate is not None and it.seq_id in surrogate:
            sp = np.asarray(surrogate[it.seq_id], dtype=float)
        else:
            raise ValueError(f"decisions of {it.seq_id!r}: the inputs hold the {it.transitions} transitions; pass the "
                             "recorded surrogate p (surrogate={seq_id: p}) for the match probabilities")
        padded = np.concatenate([sp, np.zeros(it.lmax + 1)])
        P = acceptance_probs(it.p, it.lmax)
        new = new_experts(it.U, it.top_k)
        for i in range(it.n):
            k = int(s.policy[i])
            j = first_mismatch(it.greedy, i, k)
            w = first_mismatch(it.greedy, i, it.lmax)
            rows.append({"seq_id": it.seq_id, "category": it.category, "i": i, "k": k, "label": lab[i],
                         "label_next": lab[i + k] if i + k < it.n else None, "first_mismatch": j,
                         "all_matched": j == 0 and i + k <= it.n, "p_drafted": float(np.prod(padded[i:i + k])),
                         "p_more": float(np.prod(padded[i:i + k + 1])) if k < it.lmax else float("nan"),
                         "a_mode": int(P[i, k - 1].argmax()),
                         "new_at_mismatch": float(new[i, j - 1, j - 1]) if j >= 2 else float("nan"),
                         "new_before_mismatch": float(new[i, j - 2, j - 1]) if j >= 2 else float("nan"),
                         "first_mismatch_window": w,
                         "new_at_mismatch_window": float(new[i, w - 1, w - 1]) if w >= 2 else float("nan"),
                         "new_before_mismatch_window": float(new[i, w - 2, w - 1]) if w >= 2 else float("nan")})
    return pd.DataFrame(rows)


def k_by_context(table: pd.DataFrame, n_boot: int = 999, seed: int = 0, labels=LABELS) -> pd.DataFrame:
    """Figure B3: per context label the share of k* = 1, of k* >= 4 and the mean k*, with
    clustered bootstrap intervals, decisions and responses counted; a label with no position in
    the text is listed with 0 decisions and NaN statistics (never an invented number)."""
    rows = []
    present = list(labels) + [lab for lab in dict.fromkeys(table.label) if lab not in labels]
    for lab in present:
        d = table[table.label == lab]
        row = {"label": lab, "decisions": len(d), "responses": int(d.seq_id.nunique()),
               "note": "" if len(d) else "no such position in our text"}
        for name, values in (("share_k1", d.k == 1), ("share_k4plus", d.k >= 4), ("mean_k", d.k)):
            r = clustered_mean(values.to_numpy(float), d.seq_id.to_numpy(), n_boot, seed)
            row.update({name: r["estimate"], f"{name}_lo": r["lo"], f"{name}_hi": r["hi"]})
        rows.append(row)
    return pd.DataFrame(rows)


def script_change_experts(items: list[OracleInputs], labels: dict, n_boot: int = 999, seed: int = 0) -> dict:
    """Figure B5, left: new experts along the reference continuation (a = Lmax) at every step
    j = 1..Lmax from every state, at tokens that change script against the others (aligned by step).
    No decision enters (the steps are the whole window), so it is the same for both transition models."""
    ev, es, ec, ov, os_, oc = [], [], [], [], [], []
    for it in items:
        new = new_experts(it.U, it.top_k)[:, :, it.lmax]
        lab = labels[it.seq_id]
        for i in range(it.n):
            for j in range(1, it.lmax + 1):
                if i + j > it.n:
                    break
                change = lab[i + j - 1] == "script change"
                (ev if change else ov).append(new[i, j - 1])
                (es if change else os_).append(j)
                (ec if change else oc).append(it.seq_id)
    out = aligned_difference(ev, es, ec, ov, os_, oc, n_boot, seed)
    out.update(comparison="script change vs no script change (aligned by step)", note="")
    if not out["events"]:
        out["note"] = "no script change in our text: the comparison cannot be computed"
    return out


def mismatch_experts(table: pd.DataFrame, window: bool = False, n_boot: int = 999, seed: int = 0) -> dict:
    """Figure B5, right: new experts at the first mismatch's step (the junk tails' wrong token) and
    at the step before (the reference), paired per decision with a first mismatch at step >= 2
    (step 1 has no drafted step before it); the mean of each and of the difference, clustered.
    The first mismatch among the k* drafted steps, or with ``window`` among all Lmax steps from
    the decision's state (then no decision enters: the same for every transition model)."""
    sfx = "_window" if window else ""
    d = table[table[f"first_mismatch{sfx}"] >= 2]
    at, before = d[f"new_at_mismatch{sfx}"].to_numpy(float), d[f"new_before_mismatch{sfx}"].to_numpy(float)
    out = {"comparison": "first mismatch vs the step before" + (" (Lmax window)" if window else " (drafted steps)"),
           "note": ""}
    for name, v in (("event", at), ("other", before), ("difference", at - before)):
        r = clustered_mean(v, d.seq_id.to_numpy(), n_boot, seed)
        out.update({name: r["estimate"], f"{name}_lo": r["lo"], f"{name}_hi": r["hi"]})
    out.update({"events": int(len(d)), "event_responses": int(d.seq_id.nunique())})
    if not len(d):
        out["note"] = ("no state whose draft chain matches a token and then mismatches within Lmax" if window else
                       "no decision drafts past a matched token into a first mismatch (step >= 2)")
    return out


@dataclass
class AppendixB:
    """Appendix B for one cost model under each transition model (:func:`appendix_b`)."""
    labels: dict                  # seq_id -> per-position labels
    texts: dict                   # seq_id -> per-position token texts (None without a tokenizer)
    draft_texts: dict             # seq_id -> [N][Lmax] the draft's greedy chain as texts
    decisions: dict               # transitions -> decisions table
    b3: pd.DataFrame
    b5: pd.DataFrame
    label_counts: pd.DataFrame


def _texts(ids, tokenizer) -> list[str]:
    return token_texts(ids, tokenizer) if tokenizer is not None else [f"#{int(t)}" for t in ids]


def appendix_b(items: list[OracleInputs], by_transitions: dict, tokenizer, n_boot: int = 999,
               seed: int = 0) -> AppendixB:
    """Classify the reference text of ``items`` and compute Figures B3 and B5 for each transition
    model's solved oracle (``by_transitions``: transitions -> ``analysis.Paper2Analysis``, whose
    ``solved`` are in the order of ``items``). Without a tokenizer every position is labelled
    :data:`NO_TEXT` and tokens are shown as ids."""
    labels, texts, draft_texts = {}, {}, {}
    for it in items:
        tokens, chain = it.require_tokens("Appendix B (the text of the reference)")
        texts[it.seq_id] = _texts(tokens, tokenizer)
        draft_texts[it.seq_id] = [_texts(row, tokenizer) for row in chain]
        labels[it.seq_id] = classify(texts[it.seq_id]) if tokenizer is not None else [NO_TEXT] * it.n
    tables, b3, b5 = {}, [], []
    surrogate = {it.seq_id: it.p for it in items}
    for t, analysis in by_transitions.items():
        tables[t] = decisions(analysis.solved, labels, surrogate)
        b3.append(k_by_context(tables[t], n_boot, seed).assign(transitions=t))
        b5.append({**mismatch_experts(tables[t], n_boot=n_boot, seed=seed), "transitions": t})
    anyway = "any (no decision enters)"
    b5.insert(0, {**script_change_experts(items, labels, n_boot, seed), "transitions": anyway})
    b5.insert(1, {**mismatch_experts(tables[next(iter(tables))], window=True, n_boot=n_boot, seed=seed),
                  "transitions": anyway})
    counts = pd.Series([lab for it in items for lab in labels[it.seq_id]]).value_counts()
    order = list(LABELS) + ([NO_TEXT] if tokenizer is None else [])
    label_counts = pd.DataFrame({"label": order, "positions": [int(counts.get(lab, 0)) for lab in order],
                                 "responses": [sum(lab in labels[it.seq_id] for it in items) for lab in order]})
    return AppendixB(labels, texts, draft_texts, tables, pd.concat(b3, ignore_index=True), pd.DataFrame(b5),
                     label_counts)
