"""Row statistics of measured runs, below both the engine that measures them and the predictions
scored against them (:mod:`moespec.engine` and :mod:`moespec.predict` import this, never each
other):

* :mod:`.speedups`: each run's speedup over its prompt's plain runs, its catch-up share, the
  oracle grid's throughput per (a, k), the paired-bootstrap interval of a draft length's regret;
* :mod:`.machine_adjust`: each run of a shuffled sweep taken to the sweep's typical machine state.
"""

from .speedups import catch_up_share, regret_interval, speedup_over_plain, speedups_by_part, throughput_grid

__all__ = ["catch_up_share", "regret_interval", "speedup_over_plain", "speedups_by_part", "throughput_grid"]
