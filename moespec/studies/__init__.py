"""What the whole-model notebooks run, section by section: each function measures, writes its files
into the run folder (never naming a folder itself: :mod:`moespec.paths`) and returns a
:class:`Result` the notebook shows. The notebooks narrate; the orchestration, file names and
printouts live here.

* :mod:`.whole_model`: notebook 05 (breakdown, output checks, verify grid, per machine state the
  oracle-draft and real-draft runs with their round calibration and predictions), its run record;
* :mod:`.prediction_chain`: notebook 06 (the expert operation timed alone, fits, chain (22));
* :mod:`.ssp_oracle`: notebook 07 (paper 2: rounds, the cost regression and its Appendix A, junk
  tails, the Bellman oracle per cost model and transition model, Appendix B, ours beside paper 2);
* :mod:`.goals`: the goals tables of notebooks 05-07, decided from the runs' numbers;
* :mod:`.summaries`: what notebook 05 reports from its run tables.
"""

from .result import Result

__all__ = ["Result"]
