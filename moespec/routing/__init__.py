"""Routing traces and the reuse statistics of paper 1 (Sections 1-2, Appendix D.2)."""

from moespec.routing.trace import RoutingTrace

__all__ = ["RoutingTrace"]
