"""Where the time of one C++ kernel call goes: the driver's stage clock, read from Python.

A call of :func:`~moespec.kernels.expert_forward` on the ``cpp`` backend passes through

====================  =====================================================================
``python_in``         Python (expert_forward's fast path; its checked path on the first call for
                      a weights object and kernel) and pybind11 taking the arguments
``setup``             input checks, groups, work items, activation conversion (one thread)
``wake``              until the first work item starts (helper threads waking)
``work``              the work items: every weight row streamed once per group (all threads)
``combine``           step 4, ``y_t = sum_s g_ts o_ts`` (one thread)
``python_out``        the op's clean-up, pybind11 returning the output tensor, and Python
====================  =====================================================================

``work`` is where the weights are read; the other stages are per-call fixed work, whose share
is largest for the smallest calls (one token, int8 weights). With the caches cold (as after the
benchmark's flush, or between the layers of a model) the fixed stages are mostly cache misses on
code and data; ``benchmarks/bench_call_stages.py`` reports them against the read bandwidth
(docs/kernels.md, "Where a call's time goes").

The driver's clock is ``std::chrono::steady_clock``; on Linux that is CLOCK_MONOTONIC, the clock
of :func:`time.monotonic_ns`, so the Python stages come from the same time line
(:func:`same_clock` checks it).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from moespec.kernels import build
from moespec.kernels.dispatch import expert_forward
from moespec.kernels.weights import ExpertWeights

STAGES = ("python_in", "setup", "wake", "work", "combine", "python_out")


@dataclass(frozen=True)
class CallStages:
    """Durations (microseconds) of one call's stages (module docstring); ``total`` = their sum."""

    python_in: float
    setup: float
    wake: float
    work: float
    combine: float
    python_out: float

    @property
    def total(self) -> float:
        return sum(asdict(self).values())

    @property
    def fixed(self) -> float:
        """Everything but ``work``: the per-call fixed work."""
        return self.total - self.work

    @property
    def op(self) -> float:
        """The C++ op alone, from its first line to its return (``total`` less the Python and
        pybind11 stages)."""
        return self.setup + self.wake + self.work + self.combine

    @classmethod
    def from_clock(cls, before_ns: int, stages_ns, after_ns: int) -> "CallStages":
        """From the Python times around the call and the driver's record
        ``[entry, setup_done, first_item, work_done, exit]`` (ns). Raises ``ValueError`` when the
        record is missing (zeros) or out of order."""
        entry, setup_done, first_item, work_done, exit_ = (int(v) for v in stages_ns)
        points = [before_ns, entry, setup_done, first_item, work_done, exit_, after_ns]
        if entry == 0:
            raise ValueError("no stage record: the call did not reach the C++ driver with the stage clock on")
        if any(b < a for a, b in zip(points, points[1:])):
            raise ValueError(f"stage times out of order (clock mismatch?): {points}")
        d = [(b - a) / 1e3 for a, b in zip(points, points[1:])]
        return cls(*d)


def same_clock(tolerance_ns: int = 10_000_000) -> bool:
    """Whether the driver's clock and :func:`time.monotonic_ns` read the same time line (within
    ``tolerance_ns``)."""
    mod = build.load_cpu()
    a = time.monotonic_ns()
    c = mod.clock_ns()
    b = time.monotonic_ns()
    return a - tolerance_ns <= c <= b + tolerance_ns


_clock = {"on": False}


@contextmanager
def stage_clock():
    """Keep the driver's stage clock on inside the block (off again after it). A benchmark keeps it
    on across its calls, so that nothing of the extension runs between its cache flush and the
    timed call. Raises ``RuntimeError`` when the clocks differ (not Linux)."""
    mod = build.load_cpu()
    if not same_clock():
        raise RuntimeError("the C++ stage clock and time.monotonic_ns differ on this platform")
    mod.take_last_stages()  # clear a stale record
    mod.set_stage_clock(True)
    _clock["on"] = True
    try:
        yield
    finally:
        mod.set_stage_clock(False)
        _clock["on"] = False


def timed_call(x: torch.Tensor, ids: torch.Tensor, weights: ExpertWeights, gates=None,
               kernel: str = "dedup") -> tuple[torch.Tensor, CallStages]:
    """Run ``expert_forward(x, ids, weights, gates, kernel, backend="cpp")`` with the stage clock
    on (inside :func:`stage_clock`, or switched on for this call alone); return its output and
    :class:`CallStages`. Raises what ``expert_forward`` and :func:`stage_clock` raise."""
    if not _clock["on"]:
        with stage_clock():
            return timed_call(x, ids, weights, gates, kernel)
    mod = build.load_cpu()
    before = time.monotonic_ns()
    y = expert_forward(x, ids, weights, gates, kernel=kernel, backend="cpp")
    after = time.monotonic_ns()
    return y, CallStages.from_clock(before, mod.take_last_stages(), after)
