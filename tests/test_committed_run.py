"""The committed run's tables, re-derived from the run's own files by the current code.

The committed full run (``figures/``) keeps the inputs of its analysis beside its results: the
round models (``05_round_model.json``), each real-draft point's measured acceptance and median
prompt's tokens per step, the measured points and cost ratios, notebook 07's fits and policies.
Every table that follows from those files alone is recomputed here and compared with the
committed one (numbers to the last bit, or to the rounding of the CSV's text). Notebook 04 is
re-run whole with the profile the committed run used. The per-run rows the round models were
fitted on stay in the run's data folder, which is not committed: the fits themselves are checked
on the quick profile's runs (``tests/test_notebooks_engine.py``), the run file and the advice in
``tests/test_advise.py``, REPORT.md in ``tests/test_report.py``."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from moespec import paths, predict
from moespec.predict import speculative as SP
from moespec.predict.calibration import draft_name
from moespec.studies import goals as G
from moespec.tables.rounds import round_terms_table
from moespec.theory import expected_tokens
from moespec.validate import run_identity

FIGURES = paths.committed_figures_dir()
RTOL = 1e-12          # the CSVs hold floats as Python prints them: round trips to the last bit or one ulp


def _csv(name: str) -> pd.DataFrame:
    return pd.read_csv(FIGURES / name)


def _models() -> predict.RoundModels:
    return predict.RoundModels.load(FIGURES / "05_round_model.json")


def _same_numbers(mine: pd.DataFrame, committed: pd.DataFrame, columns) -> None:
    for col in columns:
        a, b = mine[col].to_numpy(), committed[col].to_numpy()
        if a.dtype.kind in "fiu" and b.dtype.kind in "fiu":
            np.testing.assert_allclose(a.astype(float), b.astype(float), rtol=RTOL, atol=0, equal_nan=True,
                                       err_msg=col)
        else:
            assert [str(x) for x in a] == [str(x) for x in b], col


def test_round_terms_from_the_round_models():
    committed = _csv("05_round_terms.csv")
    mine = round_terms_table(_models().models)
    assert list(mine.columns) == list(committed.columns) and len(mine) == len(committed) == 108
    _same_numbers(mine, committed, committed.columns)


def test_step_times_and_model_predictions_of_every_real_draft_point():
    """V(k), V(0), the geometric prediction G_a(k) V(0) / V(k), the median prompt's E(k) V(0) / V(k)
    and the band's relative width, each from the round model of the point's state and draft."""
    pred = _csv("05_draft_cost_predictions.csv")
    models = _models()
    assert len(pred) == 64
    for state, rows in pred.groupby("state"):
        for cost, g in rows.groupby("draft_cost"):
            rm = models.get(state=state, context="chat", draft=draft_name(cost))
            E = np.ones(rm.kmax + 1)
            E[g.k.to_numpy(int)] = g.tokens_per_step.to_numpy(float)
            sp = rm.speedups(E)
            k = g.k.to_numpy(int)
            np.testing.assert_allclose(1e3 * sp["V_s"][k], g.V_hat_ms, rtol=RTOL)
            np.testing.assert_allclose(1e3 * sp["V_s"][0], g.V0_hat_ms, rtol=RTOL)
            np.testing.assert_allclose(g.G * sp["V_s"][0] / sp["V_s"][k], g.predicted_geometric, rtol=RTOL)
            np.testing.assert_allclose(sp["speedup"][k], g.predicted_unrouted, rtol=RTOL)
            np.testing.assert_allclose(sp["speedup_lo"][k] / sp["speedup"][k], g.predicted_lo / g.predicted,
                                       rtol=1e-9)
            np.testing.assert_allclose(sp["speedup_hi"][k] / sp["speedup"][k], g.predicted_hi / g.predicted,
                                       rtol=1e-9)


def test_errors_and_bands_of_every_point():
    pred = _csv("05_draft_cost_predictions.csv")
    np.testing.assert_allclose(pred.predicted / pred.measured - 1, pred.rel_error, rtol=RTOL)
    assert (SP.inside_band(pred.measured, pred.predicted_lo, pred.predicted_hi) == pred.inside).all()


def test_oracle_draft_predictions_of_every_cell():
    """Each (state, d, k, a) cell's V(k), G_a(k) / V(k), the geometric speedup and its band, the
    speedup at the cell's realized tokens per step, from the depth's round model; the errors and
    the band's verdict from them."""
    cells = _csv("05_oracle_predictions.csv")
    models = _models()
    assert len(cells) == 396
    for (state, d), g in cells.groupby(["state", "d"]):
        rm = models.get(state=state, context=f"d={d}", draft="oracle draft")
        V = rm.step_times("dedup")
        for row in g.itertuples():
            a, k = min(row.a, 1 - 1e-12), int(row.k)
            sp, G_k = rm.speedups(a), float(expected_tokens(a, k))
            assert 1e3 * V[k] == pytest.approx(row.V_hat_ms, rel=RTOL)
            assert G_k / V[k] == pytest.approx(row.throughput_hat, rel=RTOL)
            for mine, theirs in ((sp["speedup"][k], row.speedup_hat), (sp["speedup_lo"][k], row.speedup_lo),
                                 (sp["speedup_hi"][k], row.speedup_hi),
                                 (row.tokens_per_step * V[0] / V[k], row.speedup_hat_realized)):
                assert mine == pytest.approx(theirs, rel=RTOL)
    np.testing.assert_allclose(cells.speedup_hat / cells.speedup_meas - 1, cells.speedup_rel_error, rtol=RTOL)
    np.testing.assert_allclose(cells.V_hat_ms / cells.V_meas_ms - 1, cells.V_rel_error, rtol=RTOL)
    assert (SP.inside_band(cells.speedup_meas, cells.speedup_lo, cells.speedup_hi) == cells.speedup_inside).all()


def test_where_drafting_stops_paying():
    pred = _csv("05_draft_cost_predictions.csv")
    committed = json.loads((FIGURES / "05_draft_cost_stop.json").read_text())
    mine = SP.stop_paying(pred[pred.state == "quiet"], _csv("05_draft_cost_ratios.csv"))
    assert set(mine) == set(committed) - {"subject"}
    for key, value in mine.items():
        assert np.asarray(value, dtype=float) == pytest.approx(np.asarray(committed[key], dtype=float), rel=RTOL), key


def test_goals_of_notebook_05_from_its_tables():
    """Value, target and verdict of every goal; the goals' names are today's (they say what each
    goal measures, and a column whether it was pre-registered)."""
    plain, oracle, real = _csv("05_plain_step.csv"), _csv("05_oracle_predictions.csv"), _csv(
        "05_draft_cost_predictions.csv")
    stop = json.loads((FIGURES / "05_draft_cost_stop.json").read_text())
    mine = pd.concat([G.round_model_goals(plain, oracle, real), G.stop_paying_goal(stop)], ignore_index=True)
    committed = _csv("05_goals.csv")
    assert len(mine) == len(committed) == 17
    _same_numbers(mine, committed, ["value", "target", "met"])
    for new, old in zip(mine.goal, committed.goal):
        assert old.startswith(new.split(" (")[0].rsplit(",", 1)[0])


def test_goals_of_notebook_07_from_its_fits_and_policies():
    regression = _csv("07_regression_by_regime.csv").set_index("rows").loc["all rows"].to_dict()
    online = json.loads((FIGURES / "07_online_policy_info.json").read_text())["surrogate"]
    sweep = _csv("07_fig2_lmax_sweep.csv")
    greedy = sweep[sweep.transitions == "greedy"].sort_values("lmax").iloc[-1]
    measured = _csv("07_measured_fixed_k.csv")
    mine = pd.concat([G.paper2_goals({**regression, "rows": "all rows"}, online),
                      G.oracle_bound_goal(float(greedy.speedup), measured)], ignore_index=True)
    committed = _csv("07_goals.csv")
    _same_numbers(mine, committed, ["goal", "value", "target", "met"])


@pytest.mark.notebook
def test_notebook_04_rerun_gives_the_committed_tables(run_notebook):
    """Notebook 04 (the theory on paper 1's published Table 1) run again with the parameters the
    committed run recorded: every table it writes equals the committed one."""
    manifest = json.loads((FIGURES / "MANIFEST.json").read_text())
    params = next(nb["parameters"] for nb in manifest["notebooks"] if nb["name"] == "04_theory")
    _, figures, _ = run_notebook("04_theory", **params)
    written = sorted(p.name for p in figures.glob("04_*.csv"))
    assert written == sorted(p.name for p in FIGURES.glob("04_*.csv")) and written
    for name in written:
        mine, committed = pd.read_csv(figures / name), _csv(name)
        assert set(mine["stamp_run_id"]) == {figures.parent.name}, name   # the rerun's own stamp
        mine = mine.drop(columns=[c for c in run_identity.COLUMNS if c not in committed.columns])
        assert list(mine.columns) == list(committed.columns), name
        _same_numbers(mine, committed, committed.columns)
