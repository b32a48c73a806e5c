"""Every figure function of moespec.plots, rendered on small inputs: a figure a researcher reads
without the paper open names its subject (a title), its axes (labels, with units where they have
them) and what each mark means (a legend). A new figure function without a case here fails
``test_every_figure_function_has_a_case``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

import moespec.plots  # noqa: E402
from moespec import theory as th  # noqa: E402
from moespec.routing import distinct_share_against, synthetic, union_share_curves  # noqa: E402
from moespec.tables.predictions import oracle_cells  # noqa: E402

RNG = np.random.default_rng(0)
N = np.arange(1, 10)


def _round_model(state="quiet", context="d=64"):
    from moespec.predict.round_model import DraftTime, RoundModel, Term

    tau_s, tau_d = (1 + 0.3 * N) * 1e-3, (1 + 0.3 * N - 0.02 * (N - 1) ** 1.5) * 1e-3
    verify = {p: Term(t, t * 0.97, t * 1.03, np.full(9, 4), "test", "loop") for p, t in (("slot", tau_s), ("dedup", tau_d))}
    S = tau_s - tau_d
    return RoundModel("test subject", context, state, verify, Term.exact(np.full(9, 0.1e-3), "test", "loop"),
                      DraftTime.from_fit("a draft", 0.1e-3, 0.2e-3, 8, "test"),
                      saving=Term(S, S - 0.05e-3, S + 0.05e-3, np.full(9, 4), "test", "loop"))


def _protocols():
    rows = [dict(d=d, kernel=p, n=n, tau_grid_ms=2 + 0.2 * n + 0.1, tau_loop_ms=2 + 0.2 * n, state="quiet")
            for d in (64, 192) for p in ("slot", "dedup") for n in N]
    return pd.DataFrame(rows).assign(grid_minus_loop_ms=lambda f: f.tau_grid_ms - f.tau_loop_ms)


def _predictions():
    k = np.repeat(np.arange(1, 4), 2)
    oracle = pd.DataFrame({"k": k, "state": ["quiet", "loaded"] * 3, "speedup_meas": 1 + 0.1 * k,
                           "speedup_hat": 1.02 + 0.1 * k, "speedup_lo": 0.95 + 0.1 * k, "speedup_hi": 1.1 + 0.1 * k})
    real = pd.DataFrame({"k": k, "state": ["quiet", "loaded"] * 3, "measured": 0.9 - 0.02 * k,
                         "predicted": 0.88 - 0.02 * k, "predicted_lo": 0.85 - 0.02 * k, "predicted_hi": 0.93 - 0.02 * k})
    return oracle, real


def _curves():
    rows = []
    for d in (64, 192):
        for n in N:
            S = 0.02 * (n - 1)
            rows.append(dict(d=d, n=n, version="measured", tau_slot_ms=2 + 0.2 * n, tau_dedup_ms=2 + 0.2 * n - S, S_ms=S,
                             S_lo_ms=S - 0.01, S_hi_ms=S + 0.01))
            for v in ("prediction", "measured-time", "calibrated", "text"):
                rows.append(dict(d=d, n=n, version=v, tau_slot_ms=2 + 0.19 * n, tau_dedup_ms=2 + 0.19 * n - 0.9 * S,
                                 S_ms=0.9 * S, band_ms=0.01))
    return pd.DataFrame(rows)


def _metrics():
    m = dict(in_band=5, band_points=8, k_hat=[1, 2, 3], k_meas=[1, 3, 3], loss_V=0.02, loss_bound20=0.1,
             speedup_err=0.03, speedup_bound21=0.2)
    return {(v, d): m for v in ("measured-time", "calibrated", "prediction") for d in (64, 192)}


def _scores():
    return pd.DataFrame([dict(version=v, rule=r, d64="1/1, holds", d192="3, fails", holds_all=False)
                         for v in ("measured-time", "calibrated", "prediction")
                         for r in ("crossover within one", "verify time within 15%")])


def _oracle_runs():
    rows = []
    for d in (64,):
        for k in (0, 1, 2):
            for a in (0.5, 0.8):
                rows.append(dict(d=d, k=k, a=a, emitted=100, steps=100 / (1 + a * k), accepted=40 * k,
                                 rejections=10 * k, cut_short=0, throughput=300.0))
    return pd.DataFrame(rows)


def _appendix_b():
    """Appendix B on two synthetic sequences with random tokens (shown as ids: no tokenizer)."""
    from types import SimpleNamespace

    from moespec.oracle import analysis as A
    from moespec.oracle import boundaries
    from moespec.oracle.cost import CostModel
    from moespec.oracle.junk import synthetic_inputs
    items = [synthetic_inputs(n=20, lmax=4, seed=s, seq_id=f"s{s}") for s in range(2)]
    items = [it.__class__(**{**it.__dict__, "tokens": RNG.integers(0, 9, it.n),
                             "draft_chain": RNG.integers(0, 9, (it.n, it.lmax))}) for it in items]
    model = CostModel(draft_a=0.2, draft_b=0.1, beta0=3.0, alpha=0.3, c=0.0)
    by_t = {t: SimpleNamespace(solved=[A.solve(it.with_transitions(t), model) for it in items])
            for t in ("surrogate", "greedy")}
    return boundaries.appendix_b(items, by_t, None, n_boot=49), items


def _b4_cases():
    return {"greedy": pd.DataFrame([dict(seq_id="s0", i=2, k_full=1, k_alpha0=2, p_added=1.0, p_added_surrogate=0.9,
                                         dQ_full_ms=0.1, dQ_alpha0_ms=-0.1, dU_experts=1.5)])}


def _gallery_picks():
    from moespec.oracle.gallery import gallery
    B = _appendix_b()[0]
    return B, {t: gallery(B.decisions[t], 4) for t in B.decisions}


def _staircases():
    V = {"affine": [1 + k / 5 for k in range(5)], "jump": [1, 2, 2]}
    return {"panel": V}, {"panel": {name: th.staircase(v) for name, v in V.items()}}


def _appendix_a():
    """Appendix A's tables (moespec.oracle.categories, budget, robustness) on small synthetic rounds:
    two categories that meet the minimum and one that does not."""
    from fakes import synthetic_rounds

    from moespec.oracle import budget, categories, robustness
    coef = {"beta0": {m: 4.0 + 0.5 * m for m in range(2, 5)}, "alpha": {m: 0.1 + 0.05 * m for m in range(2, 5)},
            "c": 1e-3, "draft_a": 0.4, "draft_b": 0.1}
    rounds = synthetic_rounds(coef, ks=range(1, 4), generations_per_k=22, rounds_per_gen=6, seed=1)
    g = rounds.gen_id.str.extract(r"-g(\d+)$")[0].astype(int)
    rounds["category"] = np.where(g < 10, "code", np.where(g < 20, "prose", "math"))
    top = robustness.largest_k_rounds(rounds)
    return {"a3": categories.factor_importance_by_category(rounds), "a5": categories.model_by_category(rounds),
            "rounds": rounds, "per_k": budget.pooled_by_k(rounds), "a7": robustness.robustness_table(rounds, n_boot=20),
            "bins": robustness.binned_residuals(top)}


APPENDIX_A = {}


def _a(key):
    if not APPENDIX_A:
        APPENDIX_A.update(_appendix_a())
    return APPENDIX_A[key]


CASES = {
    "oracle_appendix_a.fig_a1_r2_by_category": lambda f: f(_a("a3")),
    "oracle_appendix_a.fig_a3_alpha_by_category": lambda f: f(_a("a5")),
    "oracle_appendix_a.fig_a4_metrics_by_category": lambda f: f(_a("a5")),
    "oracle_appendix_a.fig_a5_pooled_vs_per_k": lambda f: f(_a("rounds"), _a("per_k")),
    "oracle_appendix_a.fig_a7_robustness": lambda f: f(_a("a7")),
    "oracle_appendix_a.fig_binned_residuals": lambda f: f(_a("bins")),
    "rounds.round_terms_figure": lambda f: f([_round_model(), _round_model("loaded", "chat")], title="round model"),
    "rounds.protocols_figure": lambda f: f(_protocols(), title="grid and loop"),
    "rounds.predictions_figure": lambda f: f(*_predictions(), title="predictions"),
    "bandwidth.figure2_bandwidth": lambda f: f(
        pd.DataFrame([dict(model="olmoe", kernel=k, n=n, beta_GBps=20 + RNG.normal()) for k in ("slot", "dedup")
                      for n in N for _ in range(3)]),
        {"olmoe": pd.DataFrame({"n": N, "read_GBps": 25.0})}, title="fig 2"),
    "bandwidth.figure2_grid": lambda f: f(pd.DataFrame([dict(engine=e, model=m, fmt=fmt, n=n, slot_over_read=0.9,
                                                             dedup_over_read=0.85 - 0.01 * n)
                                                        for e in ("moespec CPU", "llama.cpp CPU") for m in ("x", "y")
                                                        for fmt in ("f32", "int8_b32") for n in N]), title="fig 2 grid"),
    "bandwidth.figure3_distinct_share": lambda f: f(pd.DataFrame([dict(label=lab, n=n, share=1 / n ** 0.3)
                                                                  for lab in ("a", "b") for n in (2, 4, 6, 8)])),
    "bandwidth.figure7_transfer": lambda f: f(pd.DataFrame([dict(model=m, n=n, beta_slot_meas=20, beta_slot_pred=21,
                                                                 beta_dedup_meas=15, beta_dedup_pred=14, r_meas=0.75,
                                                                 r_pred=0.66) for m in ("x", "y") for n in (2, 4, 6, 8)])),
    "kernels.kernel_share_figure": lambda f: f(pd.DataFrame([dict(model="olmoe", fmt=fmt, kernel=k, backend="cpp", n=n,
                                                                  beta_over_read=0.9, beta_over_read_q25=0.88,
                                                                  beta_over_read_q75=0.92, read_GBps=30.0,
                                                                  layer_read_over_read=0.95)
                                                             for fmt in ("f32", "bf16") for k in ("slot", "dedup")
                                                             for n in N]), "olmoe"),
    "kernels.call_stages_figure": lambda f: f(pd.DataFrame([dict(model="olmoe", fmt="f32", n=n, work_us=900.0,
                                                                 python_in_us=20.0, setup_us=10.0, wake_us=5.0,
                                                                 combine_us=5.0, python_out_us=20.0,
                                                                 total_over_read=0.9, work_over_read=0.95,
                                                                 read_GBps=30.0) for n in N]), "olmoe"),
    "models.training_curves": lambda f: f(pd.DataFrame([dict(model=m, tokens=t, lm_loss=5 - t / 1e3, aux_loss=a)
                                                        for m, a in (("MoE", 8.2), ("draft", 0.0))
                                                        for t in (0, 500, 1000)])),
    "models.expert_load": lambda f: f(RNG.dirichlet(np.ones(16), size=2), "expert load"),
    "oracle.fig_rounds_by_k": lambda f: f(pd.DataFrame([dict(K=K, ubar=10 + RNG.random() * 5, T_T_ms=7 + RNG.random(),
                                                             L=100) for K in (1, 2) for _ in range(20)]),
                                          pd.DataFrame([dict(K=K, beta0_ms=6.0, alpha_ms_per_expert=0.05,
                                                             c_ms_per_token=0.001, r2_in=0.1) for K in (1, 2)])),
    "oracle.fig_draft_time": lambda f: f(pd.DataFrame({"K": np.repeat([1, 2, 3], 5), "T_D_ms": RNG.random(15) * 5}),
                                         2.2, 0.2),
    "oracle.fig_lmax_sweep": lambda f: f(pd.DataFrame({"lmax": [1, 2, 3] * 2, "speedup": [1.0, 1.1, 1.1, 1.2, 1.4, 1.5],
                                                       "mean_draft_length": [1, 1.5, 1.6, 1, 1.8, 2.2],
                                                       "mean_accepted_length": [0.5, 0.6, 0.6, 0.8, 1.2, 1.5],
                                                       "transitions": ["surrogate"] * 3 + ["greedy"] * 3}),
                                         {"speedup": 2.3}),
    "oracle.fig_delta_space": lambda f: f({t: pd.DataFrame({"dA": RNG.random(50) * 0.2, "dC": RNG.random(50) * 20,
                                                            "k": RNG.integers(2, 9, 50), "k_opt": 1})
                                           for t in ("surrogate", "greedy")},
                                          {t: {"slope_ms_per_token": 20.0, "slope_source": "quadrant I"}
                                           for t in ("surrogate", "greedy")}),
    "oracle.fig_online_policy": lambda f: f(pd.DataFrame({"policy": ["oracle (bound)", "online early exit", "fixed k=1"] * 2,
                                                          "speedup": [1.3, 1.2, 1.0, 1.5, 1.3, 1.2],
                                                          "share_of_oracle": [1, 0.9, 0.77, 1, 0.87, 0.8],
                                                          "transitions": ["surrogate"] * 3 + ["greedy"] * 3})),
    "oracle.fig_oracle_vs_measured": lambda f: f(
        pd.DataFrame({"lmax": [1, 2] * 2, "speedup": [0.66, 0.664, 0.98, 1.05], "transitions": ["surrogate"] * 2 + ["greedy"] * 2}),
        pd.DataFrame({"K": [0, 1, 2], "speedup": [1.0, 0.975, 0.93], "speedup_lo": [1.0, 0.95, 0.9],
                      "speedup_hi": [1.0, 1.0, 0.96], "host_included": True}),
        pd.DataFrame({"k": [1, 2] * 2, "speedup": [0.662, 0.5, 0.98, 0.93], "transitions": ["surrogate"] * 2 + ["greedy"] * 2})),
    "predictions.verify_time_figure": lambda f: f(pd.DataFrame([dict(d=64, n=n, tau_slot_s=1e-3 * n, tau_slot_lo_s=9e-4 * n,
                                                                     tau_slot_hi_s=1.1e-3 * n, tau_dedup_s=9e-4 * n,
                                                                     tau_dedup_lo_s=8e-4 * n, tau_dedup_hi_s=1e-3 * n)
                                                                for n in N]), title="verify"),
    "predictions.oracle_figure": lambda f: f(oracle_cells(_oracle_runs()), title="oracle draft"),
    "oracle_boundaries.fig_b3": lambda f: f(_appendix_b()[0].b3),
    "oracle_boundaries.fig_b5": lambda f: f(_appendix_b()[0].b5),
    "oracle_boundaries.fig_b4": lambda f: f(_appendix_b()[0], _b4_cases(), {"s0": np.ones((20, 4))}, 4),
    "oracle_boundaries.fig_gallery": lambda f: f(*_gallery_picks(), 4),
    "predictions.real_draft_figure": lambda f: f(pd.DataFrame([dict(prompt=p, k=k, speedup=1 - 0.05 * k + 0.01 * p)
                                                               for p in range(3) for k in range(4)]), {1: 0.88},
                                                 title="real draft"),
    "engine.breakdown_figure": lambda f: f(pd.DataFrame([dict(subject=s, step_ms=t, experts_ms=0.7 * t, draft_token_ms=0.05 * t,
                                                             expert_share=0.7, draft_ratio=0.05, **_byte_columns(s))
                                                        for s, t in (("byte-faithful", 20.0), ("default", 2.0))]),
                                           title="decode step"),
    "engine.draft_cost_figure": lambda f: f(pd.DataFrame([dict(draft_cost=c, k=k, predicted=1.5 - c * k, measured=1.45 - c * k,
                                                              measured_q25=1.4 - c * k, measured_q75=1.5 - c * k)
                                                         for c in (0.0, 0.1, 0.2) for k in (1, 4)]),
                                            pd.DataFrame({"draft_cost": [0.0, 0.1, 0.2], "cost_ratio": [0.02, 0.1, 0.2]}),
                                            {"paper1_k1": 0.877, "paper2_ratio": 0.077}, title="draft cost"),
    "predictions.figure4_saving": lambda f: f(_curves(), _metrics()),
    "predictions.figure5_kstar": lambda f: f(_metrics()),
    "predictions.figure6_verify": lambda f: f(_curves(), scores=_scores(), rules_commit="5baa30861b78"),
    "routing.figure3_right": lambda f: f(distinct_share_against(
        {"d=24": synthetic.sticky(4, 40, 2, 16, 2, keep=0.5, seed=1)}, synthetic.sticky(4, 40, 2, 16, 2, keep=0.4, seed=2),
        resamples=50)),
    "batch.batch_predictions_figure": lambda f: f(pd.DataFrame(
        [dict(state=st, B=B, k=k, predicted=1 + 0.1 * k / B, measured=1 + 0.09 * k / B, measured_q25=1 + 0.08 * k / B,
              measured_q75=1 + 0.1 * k / B) for st in ("quiet", "loaded") for B in (1, 2, 4) for k in range(9)]),
        title="batch predictions"),
    "batch.schedule_figure": lambda f: f(pd.DataFrame(
        [dict(state=st, B=B, k_star_predicted=max(1, 6 - B), k_best_measured=max(1, 5 - B))
         for st in ("quiet", "loaded") for B in (1, 2, 4, 8)]), title="schedule"),
    "routing.union_share_figure": lambda f: f(union_share_curves(
        [synthetic.sticky(6, 30, 2, 16, 2, keep=0.5, seed=1, model="a"), synthetic.uniform(6, 30, 2, 32, 4, model="b")],
        batch_sizes=(2, 4), n_max=12, resamples=30)),
    "routing.figure1_reuse": lambda f: f(pd.DataFrame([dict(label=lab, model=lab, n=n, rho=1 - 0.9 ** (n - 1),
                                                            rho_low=0.95 * (1 - 0.9 ** (n - 1)),
                                                            rho_high=min(1, 1.05 * (1 - 0.9 ** (n - 1))), m=8, N=64)
                                                       for lab in ("olmoe", "qwen3") for n in N]),
                                         pd.DataFrame([dict(model="olmoe", n=2, rho=0.363, paper_label="OLMoE")])),
    "theory.fig_staircases": lambda f: f(*_staircases(), title="staircases"),
    "theory.fig_thresholds": lambda f: f(np.linspace(0, 0.99, 50), {1: {"D = 0": np.linspace(1, 0, 50)},
                                                                   2: {"D = 0": np.linspace(1, 0.2, 50)}},
                                         {1: {"D = 0": 0.3}}, title="thresholds"),
    "theory.fig_error_bounds": lambda f: f(np.linspace(0, 0.3, 31), {"delta": np.linspace(0, 0.43, 31)},
                                           {"engine": 0.05}, {"x": (N[1:], 0.1 * N[1:], 0.02 * N[1:])},
                                           {"x": (N[1:], 0.01 * N[1:], 0.1)}),
}


def figure_functions() -> dict:
    """Every public function of the moespec.plots modules whose return annotation is a Figure."""
    found = {}
    for info in pkgutil.iter_modules(moespec.plots.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"moespec.plots.{info.name}")
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if fn.__module__ == module.__name__ and not name.startswith("_") and "Figure" in str(
                    inspect.signature(fn).return_annotation):
                found[f"{info.name}.{name}"] = fn
    return found


def _byte_columns(subject: str) -> dict:
    """A breakdown row's byte columns (moespec.engine.breakdown.shares); the default subject has none."""
    if subject == "default":
        return {"published": None}
    out = {"published": "OLMoE-1B-7B", "bytes_depth": 64}
    for c, own, theirs in (("attention", 0.23, 0.22), ("experts", 0.68, 0.67), ("lm_head", 0.08, 0.09),
                           ("kv_cache", 0.01, 0.015), ("other", 0.0, 0.005)):
        out.update({f"{c}_share": own, f"{c}_share_published": theirs})
    return out


def test_engine_figures_keep_legend_off_the_axis_label_and_references_in_view():
    """The breakdown's legend sits in space of its own below the axes (it once covered the x label),
    and the draft-cost figure shows paper 2's reference line inside its x range."""
    from moespec.plots import engine
    shares = pd.DataFrame([dict(subject="byte-faithful", step_ms=9.4, experts_ms=6.2, draft_token_ms=0.97,
                                expert_share=0.65, draft_ratio=0.10)])
    fig = engine.breakdown_figure(shares, title="decode step at d = 64: " + "a long subject label " * 4)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    label = fig.axes[0].xaxis.label.get_window_extent(renderer)
    assert not legend.overlaps(label) and legend.y1 <= label.y0
    pred = pd.DataFrame([dict(draft_cost=c, k=1, predicted=1.0, measured=1.0, measured_q25=0.9, measured_q75=1.1)
                         for c in (0.0, 0.1)])
    ratios = pd.DataFrame({"draft_cost": [0.0, 0.1], "cost_ratio": [0.11, 0.2]})
    ax = engine.draft_cost_figure(pred, ratios, {"paper2_ratio": 0.077}).axes[0]
    assert ax.get_xlim()[0] < 0.077 < ax.get_xlim()[1]
    plt.close("all")


def test_every_figure_function_has_a_case():
    missing = sorted(set(figure_functions()) - set(CASES))
    assert not missing, f"figure functions without a rendering case in tests/test_figures.py: {missing}"


def _data_axes(fig):
    """Axes that show data: not hidden, not a colorbar, not switched off (tables)."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible() or not ax.axison or ax.get_label() == "<colorbar>":
            continue
        if ax.lines or ax.collections or ax.patches or ax.images:
            out.append(ax)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_figure_names_subject_axes_and_marks(name):
    fn = figure_functions()[name]
    fig = CASES[name](fn)
    try:
        assert isinstance(fig, plt.Figure)
        suptitle = fig._suptitle.get_text() if fig._suptitle else ""
        axes = _data_axes(fig)
        assert axes, f"{name}: no axes with data"
        assert suptitle.strip() or all(ax.get_title().strip() for ax in axes), f"{name}: no title"
        for ax in axes:
            assert ax.get_xlabel().strip(), f"{name}: an axes without an x label ({ax.get_title()!r})"
        rows = {}
        for ax in axes:
            rows.setdefault(round(ax.get_position().y0, 2), []).append(ax)
        for row in rows.values():
            assert any(ax.get_ylabel().strip() for ax in row), f"{name}: a row of panels without a y label"
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None] + list(fig.legends)
        assert legends, f"{name}: no legend says what the marks are"
        texts = [t.get_text() for lg in legends for t in lg.get_texts()]
        assert all(t.strip() and not t.startswith("_") for t in texts), f"{name}: an empty legend entry {texts}"
    finally:
        plt.close(fig)
