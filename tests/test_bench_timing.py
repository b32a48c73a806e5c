"""The timing harness on a fake clock: exact medians and quartiles, round-robin order, flushes."""

from __future__ import annotations

import numpy as np
import pytest

from moespec.measure import timing


class FakeClock:
    """A nanosecond clock that only moves when a timed callable advances it."""

    def __init__(self):
        self.now = 0

    def __call__(self) -> int:
        return self.now


def scripted(clock, durations):
    """A callable whose k-th call takes ``durations[k]`` fake nanoseconds."""
    it = iter(durations)

    def fn():
        clock.now += next(it)
    return fn


def test_median_and_quartiles_exact():
    clock = FakeClock()
    # warm-up call (1000 ns) is not counted; then 5 reps
    fn = scripted(clock, [1000, 50, 10, 40, 20, 30])
    res = timing.time_interleaved({"a": fn}, reps=5, warmup=1, timer=timing.CpuTimer(clock))
    t = res["a"]
    assert t.samples_ns == (50.0, 10.0, 40.0, 20.0, 30.0)
    assert t.median_s == pytest.approx(30e-9)
    assert t.q25_s == pytest.approx(20e-9)
    assert t.q75_s == pytest.approx(40e-9)
    assert t.row() == {"t_median_s": pytest.approx(30e-9), "t_q25_s": pytest.approx(20e-9),
                       "t_q75_s": pytest.approx(40e-9), "reps": 5}
    even = timing.Timing("b", (1.0, 2.0, 3.0, 4.0))  # numpy's linear interpolation
    assert even.median_s == pytest.approx(2.5e-9) and even.q25_s == pytest.approx(1.75e-9)


def test_round_robin_order_and_flush_before_every_call():
    clock = FakeClock()
    events = []
    calls = {name: scripted(clock, [d] * 10) for name, d in (("slot", 3), ("dedup", 5), ("read", 7))}
    res = timing.time_interleaved(calls, reps=3, warmup=1, timer=timing.CpuTimer(clock),
                                  flush=lambda: events.append("flush"),
                                  on_call=lambda name, rep: events.append((name, rep)))
    expected = []
    for rep in (-1, 0, 1, 2):
        for name in ("slot", "dedup", "read"):
            expected += ["flush", (name, rep)]
    assert events == expected
    assert res["dedup"].samples_ns == (5.0, 5.0, 5.0)
    assert res["read"].median_s == pytest.approx(7e-9)


def test_prepare_runs_untimed_between_the_flush_and_its_call():
    clock = FakeClock()
    events = []
    calls = {name: scripted(clock, [d] * 10) for name, d in (("slot", 3), ("dedup", 5))}

    def previous_round():
        events.append("prepare")
        clock.now += 1000  # untimed: the call's samples stay its own

    res = timing.time_interleaved(calls, reps=2, warmup=1, timer=timing.CpuTimer(clock),
                                  flush=lambda: events.append("flush"),
                                  on_call=lambda name, rep: events.append((name, rep)),
                                  prepare={"dedup": previous_round})
    expected = []
    for rep in (-1, 0, 1):
        expected += ["flush", ("slot", rep), "flush", "prepare", ("dedup", rep)]
    assert events == expected
    assert res["dedup"].samples_ns == (5.0, 5.0) and res["slot"].samples_ns == (3.0, 3.0)
    with pytest.raises(ValueError, match=r"^prepare: names not among the callables: \['other'\]$"):
        timing.time_interleaved(calls, reps=1, prepare={"other": lambda: None})


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="at least one repetition"):
        timing.time_interleaved({"a": lambda: None}, reps=0)
    with pytest.raises(ValueError, match="nothing to time"):
        timing.time_interleaved({}, reps=3)
    with pytest.raises(ValueError, match="no repetitions"):
        timing.Timing("x", ())
    with pytest.raises(ValueError, match="cannot time a CUDA device"):
        timing.timer_for("cuda", clock=FakeClock())


def test_cuda_timer_makes_no_cuda_call_when_built():
    t = timing.timer_for("cuda:0")
    assert isinstance(t, timing.CudaTimer) and t._events is None
    q = timing.QueuedCudaTimer("cuda:0")
    assert q._events is None and q.spin_s is None and q.overruns == 0


@pytest.mark.cuda
def test_queued_cuda_timer_brackets_gpu_work():
    """The events bracket the call's GPU work: a longer spin kernel inside the call takes longer,
    and the host enqueue stays inside the leading spin (no overruns for a tiny call)."""
    import torch

    q = timing.QueuedCudaTimer("cuda")
    short = q(lambda: torch.cuda._sleep(100_000))
    long = q(lambda: torch.cuda._sleep(1_000_000))
    assert 0 < short < long and q.spin_s > 0 and q.overruns == 0


def test_cache_flush_touches_its_buffer():
    f = timing.CacheFlush(4096)
    f()
    f()
    assert f._buf.numel() == 1024 and int(f._buf[0]) == 2
    timing.CacheFlush(0)()  # a zero-byte flush is a no-op


def test_machine_monitor_flags_busy_machine(monkeypatch):
    import psutil

    class Times:
        def __init__(self, user):
            self.user, self.nice, self.system, self.irq, self.softirq, self.steal = user, 0, 0, 0, 0, 0

    seq = iter([Times(0.0), Times(1e6)])
    monkeypatch.setattr(psutil, "cpu_times", lambda: next(seq))
    with timing.MachineMonitor("cpu") as mon:
        pass
    assert mon.state.other_load == 1.0 and mon.state.flagged
    assert mon.state.flags[0].startswith("busy=")
    assert mon.state.row()["flags"].startswith("busy=")


def test_read_bandwidth_callable_reads_its_bytes():
    fn, nbytes = timing.read_bandwidth_callable(2**20)
    assert nbytes == 2**20
    assert float(fn()) == pytest.approx(2**18)
    t = timing.time_interleaved({"read": fn}, reps=3, warmup=0)["read"]
    assert np.isfinite(t.median_s) and t.median_s > 0
