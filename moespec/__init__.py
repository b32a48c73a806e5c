"""moespec: speculative decoding on Mixture-of-Experts models.

Expert bytes from routing traces, effective bandwidth of per-slot and deduplicating expert
kernels, the fitted operation-time equations, the step-time theory and its predictions
(Lan, arXiv:2610.34440), and the verification-cost regression and Bellman oracle of
"The Limits of Speculation" (arXiv:2609.22156).

Importing moespec is cheap: no extension is compiled and no CUDA call is made at import time.
"""

__version__ = "0.1.0"


def advise(*args, **kwargs):
    """Expert kernel and draft length for speculative decoding on an MoE model, from a run's run
    file or a bandwidth table: :func:`moespec.advice.advise` (imported on first use, so that
    importing moespec stays cheap)."""
    from moespec.advice import advise as _advise

    return _advise(*args, **kwargs)
