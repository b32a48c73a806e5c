"""The real draft's time per round in two forms, on a run's real-draft sweeps
(:data:`moespec.predict.round_model.DRAFT_FORMS`; amendment of 2026-12-07 b).

Paper 2's line t_draft(k) = a k + b, and the catch-up form a k + b + c [k = 1] + e s(k): the
one-draft round at its own level, and e per round whose draft began by feeding two tokens (the last
draft and the bonus token, after a round that accepted every draft), s(k) the share of such rounds
(:func:`moespec.engine.speculative.catch_up_share`). Per machine state and form: the draft-time
error the fit leaves out of sample on the calibration runs (each prompt's runs predicted from the
other prompts', :func:`moespec.predict.calibration.held_out_draft_error`, the measure the form was
chosen on), overall, at k = 1 and at k >= 2; the fitted e and c per draft cost; the catch-up shares
of the calibration and the test runs; and the real-draft predictions scored as notebook 05 scores
them (:func:`moespec.engine.rescore.rescore`, the run's own read-slope grouping). The row of the
form a run used reproduces its published predictions.

Writes ``<out>/<stamp>_draft_forms.csv`` (one row per state and form) and ``.json`` with the run
it comes from. Measures nothing.

Run: ``.venv/bin/python benchmarks/draft_forms.py --data <clone>/data/engine/full``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moespec.engine.rescore import rescore
from moespec.engine.results_folder import read_real_draft_folder, reanalysis_main
from moespec.engine.speculative import catch_up_share
from moespec.predict import calibration as CAL
from moespec.predict.round_model import DRAFT_FORMS


def _rms(x) -> float:
    return float(np.sqrt(np.mean(np.square(x)))) if len(x) else float("nan")


def _shares(runs: pd.DataFrame) -> dict:
    """The mean catch-up share of the deduplicating drafted runs of each part."""
    drafted = runs[(runs["k"] >= 1) & runs["dedup"].astype(bool)]
    return {f"catch_up_{part}": float(catch_up_share(g).mean()) for part, g in drafted.groupby("part")}


def _per_cost(models: dict, field: str) -> str:
    """One fitted coefficient of each draft cost's draft time, in ms: "cost value; ..."."""
    return "; ".join(f"{r:g} {1e3 * getattr(m.draft, field):.3f}" for r, m in models.items())


def run(data: Path, out: Path | None = None, n_boot: int = 200) -> pd.DataFrame:
    folder = read_real_draft_folder(data)
    rows = []
    for state in folder.states:
        sweep = folder.whole_sweep(state)
        for form in DRAFT_FORMS:
            got = rescore(sweep, state, n_boot=n_boot, slope_by=folder.slope_by, draft_form=form)
            held = CAL.held_out_draft_error(got.adjusted[got.adjusted["part"] == "calibration"], form)
            rows.append({**got.summary, "used_by_run": form == folder.draft_form,
                         "held_out_rms": _rms(held["rel_error"]),
                         "held_out_rms_k1": _rms(held.loc[held["k"] == 1, "rel_error"]),
                         "held_out_rms_k2_up": _rms(held.loc[held["k"] >= 2, "rel_error"]),
                         **_shares(got.adjusted),
                         "catch_up_ms": _per_cost(got.models, "catch_up_s"),
                         "one_token_ms": _per_cost(got.models, "one_token_s")})
    table = pd.DataFrame(rows)
    folder.write_rows("draft_forms", table, out, n_boot=n_boot)
    print(table.drop(columns=["catch_up_ms", "one_token_ms"]).round(4).to_string(index=False))
    for r in table.itertuples():
        print(f"[{r.state}] {r.draft_form}: e per draft cost (ms) {r.catch_up_ms}; c {r.one_token_ms}")
    return table


def main() -> None:
    reanalysis_main(run, __doc__, "draft_forms")


if __name__ == "__main__":
    main()
