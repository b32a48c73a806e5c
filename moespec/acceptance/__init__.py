"""Per-position acceptance profiles of speculative decoding, as engines measure them.

:mod:`.profile` (the one object: p_1..p_K, G(k), intervals, the geometric fit, the rule beyond K),
:mod:`.prometheus` (vLLM and llama.cpp ``/metrics`` counters), :mod:`.engines` (vLLM, SGLang and
llama.cpp logs and responses), :mod:`.records` (per-request histograms), :mod:`.runs` (moespec's
own real-draft runs), :mod:`.load` (the format detected from the content), :mod:`.report` (the
profile as text).
"""

from .load import ENGINES, FORMATS, detect, load
from .profile import AcceptanceError, AcceptanceProfile, Counts, check_counts, geometric_G, pool
from .report import format_profile

__all__ = ["AcceptanceError", "AcceptanceProfile", "Counts", "check_counts", "detect", "load", "pool",
           "format_profile", "geometric_G", "ENGINES", "FORMATS"]
