"""Routing traces and the reuse statistics of paper 1 (Sections 1-2, Appendix D.2).

``RoutingTrace`` holds the expert sets; ``reuse``, ``mean_union``, ``distinct_share`` (Figure 3
right; ``distinct_share_against`` sets verified text beside a reference), ``byte_share``, ``e_slot``,
``e_dedup`` and ``rho_bar`` estimate eqs. (1)-(3) and (11); ``bootstrap`` gives document-level
intervals; :mod:`.batch` the same over the tokens of B sequences (``batch_union``,
``batch_byte_share``, ``batch_reuse``, ``union_share``, ``batch_bootstrap``); ``synthetic`` builds
seeded synthetic traces; ``record`` records a transformers model's routers; ``from_vllm``/``from_sglang``
import the routed experts that vLLM and SGLang return.
"""

from moespec.routing import synthetic
from moespec.routing.batch import (BATCH_STATISTICS, batch_bootstrap, batch_byte_share, batch_e_dedup, batch_reuse,
                                   batch_union, inclusion_sums, union_share, union_share_curves)
from moespec.routing.engines import from_sglang, from_vllm, import_jsonl
from moespec.routing.record import record
from moespec.routing.stats import (STATISTICS, Bootstrap, WindowSums, bootstrap, byte_share, distinct_share,
                                   distinct_share_against, e_dedup, e_slot, mean_union, resample_counts, reuse,
                                   rho_bar, window_sums)
from moespec.routing.trace import RoutingTrace

__all__ = ["RoutingTrace", "reuse", "mean_union", "byte_share", "e_slot", "e_dedup", "rho_bar",
           "distinct_share", "distinct_share_against", "bootstrap", "Bootstrap", "resample_counts",
           "window_sums", "WindowSums", "STATISTICS",
           "synthetic", "record", "from_vllm", "from_sglang", "import_jsonl",
           "batch_union", "batch_e_dedup", "batch_byte_share", "batch_reuse", "union_share", "batch_bootstrap",
           "inclusion_sums", "union_share_curves", "BATCH_STATISTICS"]
