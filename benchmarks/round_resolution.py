"""How finely notebook 05's real-draft runs resolve a speedup: the rounds (steps) each run takes.

A real-draft run generates ``real_tokens`` tokens (32 in the full profile), so at a long draft a
run is a handful of rounds, and its tokens per step, emitted / steps, moves in whole rounds: one
round more or less changes it by about 1 / steps. A measured speedup at one k, and so the measured
best k that ``moespec advise`` is held to, can turn on a single round of a few prompts.

Reads a notebook-05 results folder (:mod:`moespec.engine.results_folder`) and, per machine state,
draft cost and k (deduplicating kernel, the test runs), writes the rounds per run over the prompts
and repetitions (smallest, median, largest), the tokens per run, the prompts' median tokens per step
and ``one_round_share``, the change of the median prompt's tokens per step that one round fewer
makes (steps / (steps - 1) - 1 at the median rounds), and for each k >= 2 the prompts whose rounds
differ from k - 1 (``prompts_changed``). Writes ``<out>/<stamp>_round_resolution.csv`` and ``.json``
(the run it comes from). Measures nothing.

Run: ``.venv/bin/python benchmarks/round_resolution.py --data <clone>/data/engine/full``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from moespec.engine.results_folder import read_real_draft_folder


def resolution(test: pd.DataFrame) -> pd.DataFrame:
    """Per (draft cost, k >= 1) of one state's test runs (deduplicating kernel): the rounds per run and
    what one round is worth (module docstring)."""
    need = {"draft_cost", "k", "dedup", "prompt", "steps", "emitted"}
    if missing := need - set(test.columns):
        raise ValueError(f"real-draft runs lack column(s) {sorted(missing)}")
    runs = test[(test["k"] >= 1) & test["dedup"].astype(bool)]
    if (runs["steps"] < 1).any():
        raise ValueError("real-draft runs with fewer than one round (steps < 1)")
    per_prompt = runs.groupby(["draft_cost", "k", "prompt"]).agg(steps=("steps", "median"), emitted=("emitted", "median"))
    rows = []
    for (cost, k), g in per_prompt.groupby(level=["draft_cost", "k"]):
        steps = g["steps"].to_numpy(float)
        mid = float(np.median(steps))
        before = per_prompt.loc[(cost, k - 1)] if (cost, k - 1) in per_prompt.index.droplevel("prompt") else None
        changed = (int((before["steps"].reindex(g.index.get_level_values("prompt")).to_numpy() != steps).sum())
                   if before is not None else None)
        rows.append({"draft_cost": float(cost), "k": int(k), "prompts": int(len(g)), "rounds_min": float(steps.min()),
                     "rounds_median": mid, "rounds_max": float(steps.max()),
                     "tokens_per_run_median": float(np.median(g["emitted"])),
                     "tokens_per_step_median": float(np.median(g["emitted"].to_numpy(float) / steps)),
                     "one_round_share": mid / (mid - 1) - 1 if mid > 1 else float("nan"),
                     "prompts_changed": changed})
    return pd.DataFrame(rows)


def run(data: Path, out: Path | None = None) -> pd.DataFrame:
    folder = read_real_draft_folder(data)
    table = pd.concat([resolution(folder.sweep(state)[1]).assign(state=state) for state in folder.states],
                      ignore_index=True)
    folder.write_rows("round_resolution", table, out)
    print(table[table["draft_cost"] == table["draft_cost"].min()].round(3).to_string(index=False))
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="a notebook-05 results folder")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default benchmarks/results/round_resolution)")
    args = ap.parse_args()
    run(args.data, args.out)


if __name__ == "__main__":
    main()
