"""How the real draft's verify pass varies with the MT-Bench turn it verifies, from a notebook-05
run's rows (issue 27, the 5 % goal's remaining quiet error).

Reads a notebook-05 results folder (``<run data>/engine/full`` of a ``make reproduce`` clone, or a
notebook's ``out_dir``): ``draft_calibration.csv``, ``real_draft.csv`` / ``real_draft_<state>.csv``
and ``run.json``. Per machine state, :func:`moespec.engine.summaries.verify_by_turn` sets the
calibration turns' deduplicating verify times beside the test turns', per k, with the calibration
mean when each of its turns is left out (the rows as notebook 05 analysed them: adjusted by their
machine factors where the run has them). Writes ``<out>/<stamp>_verify_by_turn.json`` (the source
run's commit, start and end, the machine, and the per-k table) and the two tables beside it as CSV;
``<stamp>`` is the source run's start. Measures nothing: it reads what the run measured.

    .venv/bin/python benchmarks/verify_by_turn.py --data /tmp/clone/data/engine/full
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from moespec import io, paths
from moespec.engine.results_folder import read_real_draft_folder
from moespec.engine.summaries import verify_by_turn


def run(data: Path, out: Path | None = None) -> dict:
    folder = read_real_draft_folder(data)
    stamp = folder.stamp
    out = paths.ensure(Path(out) if out else paths.ROOT / "benchmarks" / "results" / "interleaved")
    turns_all, by_k_all = [], []
    for state in folder.states:
        turns, by_k = verify_by_turn(*folder.sweep(state, analysed=True))
        turns_all.append(turns.assign(state=state))
        by_k_all.append(by_k.assign(state=state))
    turns, by_k = pd.concat(turns_all, ignore_index=True), pd.concat(by_k_all, ignore_index=True)
    io.write_dataframe(out / f"{stamp}_verify_by_turn_turns.csv", turns)
    io.write_dataframe(out / f"{stamp}_verify_by_turn_by_k.csv", by_k)
    result = {"what": "the real draft's deduplicating verify time per MT-Bench turn, calibration against test, "
                      "from a notebook-05 run's rows (moespec.engine.summaries.verify_by_turn)",
              "source": folder.source(),
              "by_k": by_k.to_dict(orient="records")}
    path = io.write_json(out / f"{stamp}_verify_by_turn.json", result)
    print(by_k.round(2).to_string(index=False))
    print(f"wrote {path}")
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, required=True, help="a notebook-05 results folder")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    return run(args.data, args.out)


if __name__ == "__main__":
    main()
