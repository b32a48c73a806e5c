"""Timing harness and the expert-operation benchmark (paper 1, Section 2 and Appendix E)."""
