"""Theory of paper 1 (Lan, arXiv:2610.34440), Section 3 and Appendices B-C, as pure functions.

No I/O and no torch. Inputs of ints and ``fractions.Fraction`` give exact results (object
arrays of Fractions); float inputs and numpy arrays are vectorized.

Modules: :mod:`.speculation` (G_a, T_a, k*, speedup (9), condition (8), a0),
:mod:`.staircase` (alpha_{k,i}, step points (B.31), staircase, convex shortcut (10)/(B.36)),
:mod:`.steptime` (verify time (5), saving (6), faster-kernel test (7)),
:mod:`.dedup` (rho_bar (11), E_dedup (12), thresholds (14) and (16), speedup (15)),
:mod:`.bounds` (Table 2: (17)-(21), C.7), :mod:`.table1` (verify times from a Table-1 row),
:mod:`.batch` (a verify pass of B sequences x (k + 1) tokens: bytes, V(k, B), k*(a, B), bounds at each B).
"""

from .batch import (batch_byte_saving, batch_byte_share, batch_error_bounds, batch_slot_bytes, batch_speedup,
                    batch_step_times, batch_throughput, batch_union_bytes, batch_verify_time, best_draft_lengths,
                    cross_reuse, exchangeable_union, pass_sizes, speculation_pays, stops_paying,
                    union_from_inclusion)
from .bounds import (MARGIN_VERDICTS, delta_from_eps, faster_kernel_margin, kernels_agree, log_gap, margin_verdict,
                     relative_step_error, saving_amplification, saving_bound, separation_holds, speedup_factor_from_eps,
                     speedup_interval, speedup_interval_by_k, throughput_loss_bound, verify_time_bound)
from .dedup import (byte_step_times, byte_threshold, dedup_bytes, dedup_speedup,
                    faster_draft_lengths, periodic_reuse, reuse_threshold, reuse_threshold_from, rho_bar,
                    union_bytes)
from .speculation import (best_draft_length, expected_tokens, faster_than_plain, first_threshold,
                          speedup, throughput)
from .staircase import (Staircase, convex_hypothesis, convex_step_points, pair_thresholds,
                        reaches_convex, staircase, step_points)
from .steptime import (VerifyTime, bandwidth_ratio, byte_share, crossover, crossover_distance, dedup_faster, saving,
                       saving_from_ratio, slot_expert_bytes)
from .table1 import (interpolate_bandwidth, reuse_from_byte_share, table1_verify_times,
                     verify_times_from_bandwidths)

__all__ = [
    "expected_tokens", "throughput", "best_draft_length", "speedup", "faster_than_plain",
    "first_threshold",
    "pair_thresholds", "step_points", "Staircase", "staircase", "convex_hypothesis",
    "reaches_convex", "convex_step_points",
    "VerifyTime", "slot_expert_bytes", "saving", "saving_from_ratio", "byte_share",
    "bandwidth_ratio", "dedup_faster", "crossover", "crossover_distance",
    "rho_bar", "union_bytes", "dedup_bytes", "reuse_threshold", "reuse_threshold_from",
    "byte_threshold", "byte_step_times", "faster_draft_lengths", "dedup_speedup",
    "verify_time_bound", "saving_bound", "saving_amplification", "faster_kernel_margin",
    "kernels_agree", "log_gap", "margin_verdict", "MARGIN_VERDICTS", "periodic_reuse", "throughput_loss_bound", "separation_holds", "speedup_interval", "speedup_interval_by_k",
    "delta_from_eps", "speedup_factor_from_eps", "relative_step_error",
    "interpolate_bandwidth", "reuse_from_byte_share", "table1_verify_times",
    "verify_times_from_bandwidths",
    "pass_sizes", "batch_slot_bytes", "batch_union_bytes", "batch_byte_saving", "batch_byte_share",
    "exchangeable_union", "union_from_inclusion",
    "cross_reuse", "batch_verify_time", "batch_step_times", "batch_throughput", "batch_speedup",
    "best_draft_lengths", "speculation_pays", "stops_paying", "batch_error_bounds",
]
