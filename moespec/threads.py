"""Torch's intra-op threads for the two kinds of work a notebook does.

Timed work (a step, a round, an expert operation) runs on the notebooks' ``threads`` (1 by
default: batch-one passes on a shared 2-core CPU, where more threads wait on descheduled ones).
Work whose time is not measured (the oracle's reference text and junk tails, the routing a fit
reads) only needs its numbers, and those do not depend on the thread count here: moespec's CPU
kernels give each output row to one thread (docs/kernels.md), and the tests check that routing and
junk tails recorded on one thread and on every core are identical. :func:`untimed_threads` gives
that work every core the process may use.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int | None):
    """Temporarily set torch's intra-op threads to ``n`` (None or 0: leave them as they are)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(old)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # macOS, Windows
        return os.cpu_count() or 1


def untimed_threads(n: int = 0) -> int:
    """Threads for untimed work: ``n`` when it is positive, else every usable core."""
    if n < 0:
        raise ValueError(f"untimed_threads must be >= 0 (0: every core), got {n}")
    return int(n) if n else usable_cores()
