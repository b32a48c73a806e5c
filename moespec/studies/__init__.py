"""What the whole-model notebooks run, section by section: each function measures, writes its files
into the run folder (never naming a folder itself: :mod:`moespec.paths`) and returns a
:class:`Result` the notebook shows. The notebooks narrate; the orchestration, file names and
printouts live here.

* :mod:`.whole_model`: notebook 05 (breakdown, output checks, verify grid, round calibration per
  machine state, oracle-draft and real-draft runs against the round model's predictions).
* :mod:`.ssp_oracle`: notebook 07 (paper 2: rounds, the cost regression and its Appendix A, junk
  tails, the Bellman oracle per cost model and transition model, Appendix B, ours beside paper 2).
"""

from .result import Result

__all__ = ["Result"]
