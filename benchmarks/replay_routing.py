"""The real draft's verify passes of a notebook-05 run recorded without their routing, replayed to
count it, and the run's predictions rescored with the routing term (issue 27; amendment
``amendments_2026_12_05_night``, whose evidence this is).

Runs recorded before the routing tap (``moespec.engine.target.Engine.routing_tap``) carry no
``distinct_experts``. Every run is deterministic in its tokens (greedy target, the draft's own
greedy proposals; widening a draft changes no token, so one replay per (state, part, prompt, k)
stands for every draft cost and repetition): this script rebuilds the run's subject and turns from
its ``run.json``, generates each (part, prompt, k) once with the tap on, checks that the replay
took the recorded number of steps, attaches the counts to the recorded rows and fits the round
models again from the calibration rows (now with their routing term; the rows as notebook 05 analysed
them: adjusted by their machine factors where the run has them). It sets the recorded
(unrouted) predictions beside the routed ones for the same measurements. Nothing is timed; the
replay takes a few minutes of CPU.

Writes ``<out>/<stamp>_routing_replay.json`` (source run, machine, per state: the slope, the score
both ways) and ``<stamp>_routing_replay_points.csv`` (per state, draft cost and k) and
``<stamp>_routing_replay_distinct.csv`` (per state, part, prompt and k); ``<stamp>`` is the source
run's start.

    .venv/bin/python benchmarks/replay_routing.py --data /tmp/clone/data/engine/full
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from moespec import io, paths
from moespec.engine.results_folder import read_real_draft_folder
from moespec.engine.speculative import ModelDraft, speculative_generate
from moespec.engine.subject import load_subject
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP
from moespec.studies.whole_model import real_draft_parts, state_sizes


def replay_counts(sub, P: dict, state: str, seed: int) -> pd.DataFrame:
    """Per (part, prompt, k) of ``state``'s real-draft sweep: the replayed steps and mean distinct
    (expert, layer) pairs per verify pass."""
    eng, drafter = sub.engine, ModelDraft(sub.draft)
    rows = []
    parts = real_draft_parts(sub, state_sizes(P, state), seed)
    cells = [(part, pi, prompt, k) for part in parts for pi, prompt in enumerate(part.prompts)
             for k in [0] + list(P["real_ks"])]
    for part, pi, prompt, k in tqdm(cells, desc=f"replaying routing ({state})"):
        prompt = [int(t) for t in prompt]
        first = eng.prefill(prompt)
        with eng.routing_tap() as counts:
            _, steps = speculative_generate(eng, drafter, prompt, k, P["real_tokens"], first=first)
        rows.append({"state": state, "part": part.name, "prompt": pi, "k": k, "replayed_steps": len(steps),
                     "distinct_experts": float(np.mean(counts))})
    return pd.DataFrame(rows)


def _attach(rows: pd.DataFrame, counts: pd.DataFrame, part: str) -> pd.DataFrame:
    """``rows`` with their replayed routing; refused where a replay took another number of steps."""
    c = counts[counts["part"] == part].drop(columns="part")
    out = rows.drop(columns=[col for col in ("distinct_experts",) if col in rows]).merge(c, on=["state", "prompt", "k"],
                                                                                   how="left", validate="m:1")
    if out["replayed_steps"].isna().any() or (out["replayed_steps"] != out["steps"]).any():
        bad = out[out["replayed_steps"] != out["steps"]][["prompt", "k", "steps", "replayed_steps"]]
        raise RuntimeError(f"the replay of {part} turns differs from the recorded runs:\n{bad.head()}")
    return out.drop(columns="replayed_steps")


def run(data: Path, out: Path | None = None, seed: int | None = None) -> dict:
    """Replay ``data``'s sweeps with notebook 05's ``seed`` (None: the one its run.json records;
    runs before it recorded one used the default, 0)."""
    folder = read_real_draft_folder(data)
    record = folder.record
    P = record["sizes"]
    seed = int(record.get("seed", 0)) if seed is None else int(seed)
    torch.set_num_threads(int(record.get("threads", 1)))
    sub = load_subject(profile=record["profile"], device="cpu", backend=record.get("backend", "auto"), seed=seed,
                       **record["subject_args"])
    stamp = folder.stamp
    out = paths.ensure(Path(out) if out else paths.ROOT / "benchmarks" / "results" / "routing")
    summary, points, distinct = {}, [], []
    for state in folder.states:
        counts = replay_counts(sub, P, state, seed)
        distinct.append(counts)
        cal, test = folder.sweep(state, analysed=True)
        cal, test = _attach(cal, counts, "calibration"), _attach(test, counts, "test")
        models = CAL.from_draft_runs(cal, record["subject"], state, n_boot=P["n_boot"], seed=seed)
        pred = SP.real_draft_predictions(models, test)
        points.append(pred[["state", "draft_cost", "k", "measured", "predicted", "predicted_unrouted", "rel_error",
                            "rel_error_unrouted", "distinct_test", "distinct_calibration"]])
        rm = next(iter(models.values()))
        summary[state] = {
            "points": int(len(pred)), "ms_per_distinct_expert": 1e3 * rm.routing.s_per_expert,
            "routed_within_5pct": int((pred.rel_error.abs() <= 0.05).sum()),
            "routed_largest": float(pred.rel_error.abs().max()), "routed_mean": float(pred.rel_error.mean()),
            "unrouted_within_5pct": int((pred.rel_error_unrouted.abs() <= 0.05).sum()),
            "unrouted_largest": float(pred.rel_error_unrouted.abs().max()),
            "unrouted_mean": float(pred.rel_error_unrouted.mean())}
        print(SP.routing_line(pred, state))
    io.write_dataframe(out / f"{stamp}_routing_replay_points.csv", pd.concat(points, ignore_index=True))
    io.write_dataframe(out / f"{stamp}_routing_replay_distinct.csv", pd.concat(distinct, ignore_index=True))
    result = {"what": "a notebook-05 run's real-draft sweeps replayed to count each verify pass's distinct (expert, "
                      "layer) pairs, and its predictions rescored with the routing term (a retrospective: the "
                      "round models are refitted from the run's calibration rows; nothing is timed)",
              "source": folder.source(),
              "seed": seed, "by_state": summary}
    path = io.write_json(out / f"{stamp}_routing_replay.json", result)
    print(f"wrote {path}")
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="a notebook-05 results folder (data/engine/full)")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default benchmarks/results/routing)")
    ap.add_argument("--seed", type=int, default=None,
                    help="notebook 05's seed (default: the one run.json records, else 0)")
    args = ap.parse_args(argv)
    return run(args.data, args.out, args.seed)


if __name__ == "__main__":
    main()
