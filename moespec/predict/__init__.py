"""Predictions and what they are scored against (paper 1, Sections 3-4; paper 2's cost model):

* :mod:`.round_model`: the round model V(k) = t_draft(k) + tau_p(k + 1) + h(k), one object per
  context, draft and machine state, every term with its source, protocol and interval;
* :mod:`.calibration`: round models built from notebook 05's calibration rows (decode loops and
  real-draft runs);
* :mod:`.chain`: chain (22), per-layer operation times -> whole-model verify times, in four versions;
* :mod:`.scoring`: a version against one depth's measurements (Tables 3, 4, 7, 8; Figures 4-6);
* :mod:`.speculative`: the round model's predictions of the oracle-draft and real-draft runs
  beside their measurements;
* :mod:`.noise`: the real-draft predictions' own noise, from their calibration turns resampled;
* :mod:`.rules`: the pre-registered rules of Table 8, read unchanged and decided.

``moespec.predict`` and :mod:`moespec.engine` do not import each other: the predictions read the
engine's run tables as data, and the row statistics both need live in :mod:`moespec.runstats`.
"""

from moespec.theory import crossover, crossover_distance

from .chain import KERNELS, Chain, calibrate, chain, fitted_layer_times, layer_times, saving_band
from .round_model import DraftTime, RoundModel, RoundModelError, RoundModels, RoutingTerm, Term, fit_draft_time
from .rules import load_rules, rules_path, rules_provenance, score
from .scoring import Measured, bench_regimes, curves, evaluate, evaluate_depths, in_regime, measured_at

__all__ = ["KERNELS", "Chain", "chain", "calibrate", "layer_times", "fitted_layer_times", "saving_band",
           "crossover", "crossover_distance", "Measured", "evaluate", "curves", "measured_at", "evaluate_depths",
           "bench_regimes", "in_regime", "load_rules", "rules_path", "rules_provenance", "score",
           "Term", "DraftTime", "RoundModel", "RoundModels", "RoundModelError", "RoutingTerm", "fit_draft_time"]
