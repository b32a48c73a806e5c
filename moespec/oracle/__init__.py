"""Paper 2: the verification-cost regression, junk tails, the Bellman oracle, delta space, and an
online early-exit policy (beyond the paper). See docs/oracle.md.

Modules: ``rounds`` (round records, eq. 5), ``record`` (measured rounds from the engine's speculative
loop), ``regression`` (eq. 4, A3, A4, Table A2), ``transitions`` (P(a | k), eq. 7), ``bellman``
(eq. 8, policy evaluation), ``junk`` (Section 4.2's counterfactual tails), ``cost`` (Cost(i, k, a)),
``delta`` (Figure 3), ``policy`` (online early exit), ``analysis`` (Lmax sweep, ablations).
"""

from .bellman import PolicyValue, bellman, evaluate_policy, fixed_policy, q_values, speedup
from .transitions import acceptance_probs, confidence_windows, next_states

__all__ = ["PolicyValue", "acceptance_probs", "bellman", "confidence_windows", "evaluate_policy",
           "fixed_policy", "next_states", "q_values", "speedup"]
