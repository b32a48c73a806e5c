"""The old name of :mod:`moespec.measure` (the README's library section named ``moespec.bench``
with its modules ``expert_op`` and ``timing`` until issue 18): importing it gives that package, with
a ``DeprecationWarning``. New code imports ``moespec.measure``."""

import sys
import warnings

from moespec import measure
from moespec.measure import expert_op, timing

warnings.warn("moespec.bench is now moespec.measure (the timing harness and the benchmarks' shared code); "
              "the old name is an alias", DeprecationWarning, stacklevel=2)
sys.modules[__name__ + ".expert_op"] = expert_op
sys.modules[__name__ + ".timing"] = timing
sys.modules[__name__] = measure
