"""Measured speculative rounds on this machine (paper 2, Section 3.5 / Appendix A.2, our analogue).

Runs the engine's speculative loop (``moespec.engine.speculative_generate`` with the real draft
model, ``ModelDraft``, greedy verification) for every question and every K, and records one
``RoundRecord`` per round: the engine's own timings of the draft and of the verification pass,
and Ubar_r of eq. (5) read from the target's routers during that pass (``hf.RouterTap``), and the
round's host work (``T_host_ms``: the step's time outside drafting and verification).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

import pandas as pd
from moespec.progress import tqdm

from moespec import paths
from moespec.engine import Engine, ModelDraft, speculative_step
from moespec.io import write_dataframe
from moespec.routing.stats import union_sizes
from moespec.threads import torch_threads

from .hf import RouterTap
from .rounds import RoundRecord, rounds_frame, validate_rounds


#: sha256 of the Spec-Bench question file copied into data/spec_bench (see its SOURCE.md).
SPEC_BENCH_SHA256 = "4b6d33e79484f9841c487ee87d1cf6aa8c6066f61d5d482ff09e5a007fafdf04"


def questions_path() -> Path:
    return paths.data_dir() / "spec_bench" / "question.jsonl"


def load_questions(categories=None, per_category: int | None = None, path=None) -> list[dict]:
    """Spec-Bench questions (first turn), optionally the first ``per_category`` of each category."""
    path = Path(path) if path else questions_path()
    if not path.is_file():
        raise FileNotFoundError(f"{path}: Spec-Bench questions missing (the repository's data/spec_bench/question.jsonl; see its SOURCE.md)")
    data = path.read_bytes()
    if path == questions_path() and hashlib.sha256(data).hexdigest() != SPEC_BENCH_SHA256:
        raise ValueError(f"{path}: sha256 {hashlib.sha256(data).hexdigest()} differs from the recorded "
                         f"{SPEC_BENCH_SHA256} (see data/spec_bench/SOURCE.md)")
    rows = []
    for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
        q = json.loads(line)
        for key in ("question_id", "category", "turns"):
            if key not in q:
                raise ValueError(f"{path}:{n}: field {key!r} missing")
        rows.append({"question_id": int(q["question_id"]), "category": q["category"], "text": q["turns"][0]})
    if categories is not None:
        known = {r["category"] for r in rows}
        unknown = set(categories) - known
        if unknown:
            raise ValueError(f"{path}: no category {sorted(unknown)}; categories are {sorted(known)}")
        rows = [r for r in rows if r["category"] in set(categories)]
    if per_category is not None:
        seen: dict[str, int] = {}
        kept = []
        for r in rows:
            if seen.get(r["category"], 0) < per_category:
                kept.append(r)
                seen[r["category"]] = seen.get(r["category"], 0) + 1
        rows = kept
    return rows


def _engine(target, backend: str):
    """``target`` itself when it is already an engine, else a new ``moespec.engine.Engine`` on it."""

    return target if isinstance(target, Engine) else Engine(target, backend=backend)


def reference_sequences(target, prompts, n_tokens: int, backend: str = "auto", threads: int | None = 1,
                        progress: bool = True) -> dict:
    """The target's greedy continuation of each prompt (the oracle's reference X), ``{question_id: tokens}``."""
    engine = _engine(target, backend)
    out = {}
    with torch_threads(threads):
        for p in tqdm(prompts, desc="reference sequences", disable=not progress):
            first = engine.prefill([int(t) for t in p["ids"]])
            out[int(p["question_id"])] = [first] + engine.greedy(first, n_tokens - 1)
    return out


def record_rounds(target_model, draft_model, prompts, ks=range(1, 11), n_tokens: int = 64,
                  repeats: int = 3, threads: int | None = 1, backend: str = "auto", dedup: bool = True,
                  progress: bool = True, reference=None, drafter=None):
    """Speculative runs of every prompt at every K; returns ``(rounds, outputs)``.

    Each round is the engine's step (``moespec.engine.speculative_step``, the step
    ``speculative_generate`` loops over): the engine's target (``Engine``: KV cache, kernels)
    verifies ``[current] + drafts`` in one pass, the engine's ``ModelDraft`` drafts greedily, the
    longest agreeing prefix is kept. Each stage is timed ``repeats`` times and the median kept (the
    verify pass is re-run after cropping the cache back, the draft re-proposed from the same text;
    both are deterministic): other jobs share this machine's two cores, and single timings carry
    their load. ``threads``
    sets torch's intra-op threads for the run (1 is the most stable under contention). ``dedup``
    sets the engine's switch: on (default), passes of 2..9 tokens run the deduplicating kernel, which
    reads each selected expert once (as fused MoE kernels do), so verification time can follow the union.
    ``target_model`` may be a model or an existing ``moespec.engine.Engine``. A prompt is prefilled
    once for all its K (the runs of one prompt follow each other): each later run crops the cache
    back to the prompt, as ``speculative_generate`` does with ``first`` (the draft keeps its prompt's
    cache likewise), the same cache value for value, without a pass over the whole prompt that
    nothing times.

    ``reference``: a :class:`moespec.measure.regimes.ReferenceRead` timed before each generation;
    its rounds carry the reading (``ref_GBps``), from which the bandwidth regime follows.
    ``drafter``: a drafter object to use instead of ``ModelDraft(draft_model)`` (e.g. an
    :class:`moespec.engine.OracleDraft` for a subject without a draft model; then ``repeats`` must be 1).

    prompts: list of dicts with ``question_id``, ``category`` and ``ids`` (prompt token ids).
    rounds: the validated rounds table (``rounds.ROUND_COLUMNS``). outputs: ``{question_id: tokens}``,
    the emitted tokens of the first K's run (greedy verification reproduces the target's greedy
    text, so these serve as the oracle's reference sequences).
    """

    engine = _engine(target_model, backend)
    engine.dedup = dedup
    target_model = engine.model
    drafter = drafter if drafter is not None else ModelDraft(draft_model, held_prompts=1)
    max_pos = int(getattr(target_model.config, "max_position_embeddings", 0) or 0)
    records, outputs, last = [], {}, None
    with torch_threads(threads):
        with RouterTap(target_model) as tap:
            jobs = [(p, K) for p in prompts for K in ks]
            for p, K in tqdm(jobs, desc="speculative runs", disable=not progress):
                prompt = [int(t) for t in p["ids"]]
                if max_pos and len(prompt) + n_tokens + K + 1 > max_pos:
                    raise ValueError(f"question {p['question_id']}: prompt {len(prompt)} + {n_tokens} tokens "
                                     f"exceeds max_position_embeddings={max_pos}")
                bw = reference() if reference is not None else None
                if last is not None and last[0] == p["question_id"]:    # the same prompt at the next K
                    engine.crop(len(prompt))
                    current = last[1]
                else:
                    current = engine.prefill(prompt)
                last = (p["question_id"], current)
                drafter.begin(prompt, current)
                generated: list[int] = []
                r = 0
                while len(generated) < n_tokens:
                    st = speculative_step(engine, drafter, generated, current, K, repeats=repeats,
                                          before_verify=tap.clear)
                    ids = tap.take()                                   # the last verify pass's routing
                    tap.clear()
                    u = union_sizes(ids[0], tap.num_experts)[-1]       # [layers]: union over the m positions
                    rec = RoundRecord(f"q{p['question_id']}-K{K}", int(p["question_id"]), p["category"],
                                      int(K), int(K) + 1, r, st.length, 1e3 * st.t_verify_s,
                                      1e3 * st.t_draft_s, float(u.mean()), float(u.max()), st.accepted,
                                      (st.length + K + 1) / max_pos if max_pos else float("nan"), "measured")
                    host_ms = 1e3 * (st.t_step_s - st.t_draft_s - st.t_verify_s)    # acceptance, cache crop
                    records.append({**asdict(rec), "T_host_ms": max(host_ms, 0.0),
                                    **({} if bw is None else {"ref_GBps": bw})})
                    generated += [current] + st.emitted
                    current = st.next_token
                    r += 1
                outputs.setdefault(int(p["question_id"]), list(generated[:n_tokens]))
    return rounds_frame(records), outputs


def check_reused(path, found, wanted, what: str) -> None:
    """Refuse a reused file (``reuse=True``) whose workload is not the one asked for: ``found`` and
    ``wanted`` are the sets of (question, ...) keys the file holds and the run would measure."""
    found, wanted = set(found), set(wanted)
    if found != wanted:
        raise ValueError(f"{path}: the reused {what} hold {len(found)} keys, the run asks for {len(wanted)} "
                         f"(missing {sorted(wanted - found)[:4]}, extra {sorted(found - wanted)[:4]}); delete the file "
                         "or pass reuse=False to measure this workload")


def save_rounds(df: pd.DataFrame, path) -> Path:

    return write_dataframe(path, df)


def load_rounds(path) -> pd.DataFrame:

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no rounds table")
    return validate_rounds(pd.read_csv(path), where=str(path))
