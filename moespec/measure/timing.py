"""The one timing harness: warm-up, repetitions, median and interquartile range, a cache flush
between passes, several callables interleaved in one run, and a record of the machine's state.

Paper 1, Section 2 and Appendix E: each time is the median over repetitions of one expert
operation, run after a cache flush (the paper's is 256 MiB). Here the flush is sized from the
machine's last-level cache (:func:`flush_bytes`: four times the cache, never below the paper's
256 MiB), and so are the reference reads (:func:`read_bytes`), so that both are served by memory.
Two kernels are compared only inside one run with their repetitions interleaved (round-robin), so
that a drift of the machine's bandwidth (on a shared CPU it drifts by tens of percent within
minutes) falls on both alike.

Clocks: ``time.perf_counter_ns`` on the CPU; CUDA events on a GPU (created on first use, so
importing this module makes no CUDA call). Tests inject a fake clock.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from moespec import provenance

#: The paper's flush (paper 1, Appendix E: "the same 256 MiB cache flush"): the least :func:`flush_bytes` gives.
FLUSH_FLOOR_BYTES = 256 * 2**20
#: The flush reads this many times the last-level cache: caches are not LRU (a victim L3, pseudo-LRU
#: replacement, adaptive insertion) and one cache's worth of reads leaves part of it in place.
FLUSH_CACHE_MARGIN = 4
#: The least reference read (Figure 2's read-bandwidth reference, ``torch.sum``).
READ_FLOOR_BYTES = 2**30

#: Share of the machine's CPU time used by other processes above which a run is flagged.
BUSY_THRESHOLD = 0.5


@dataclass(frozen=True)
class Timing:
    """The repetitions of one callable, in nanoseconds, and their summary (median, quartiles)."""

    name: str
    samples_ns: tuple[float, ...]

    def __post_init__(self):
        if not self.samples_ns:
            raise ValueError(f"timing {self.name!r} has no repetitions")

    @property
    def reps(self) -> int:
        return len(self.samples_ns)

    def quantile(self, q: float) -> float:
        """Quantile ``q`` of the repetitions in seconds (linear interpolation, numpy's default)."""
        return float(np.quantile(np.asarray(self.samples_ns, dtype=float), q)) * 1e-9

    @property
    def median_s(self) -> float:
        return self.quantile(0.5)

    @property
    def q25_s(self) -> float:
        return self.quantile(0.25)

    @property
    def q75_s(self) -> float:
        return self.quantile(0.75)

    def row(self) -> dict:
        """The columns every timing row carries: ``t_median_s, t_q25_s, t_q75_s, reps``."""
        return {"t_median_s": self.median_s, "t_q25_s": self.q25_s, "t_q75_s": self.q75_s,
                "reps": self.reps}


def summary_line(name: str, row: Mapping, unit: str = "s", width: int = 24) -> str:
    """One printed line of a timing row (:meth:`Timing.row`): median and IQR in ``unit`` (s or ms)."""
    scale = {"s": 1.0, "ms": 1e3}[unit]
    return (f"  {name:{width}s} median {row['t_median_s'] * scale:.3f} {unit}  (IQR {row['t_q25_s'] * scale:.3f}-"
            f"{row['t_q75_s'] * scale:.3f} {unit}, {row['reps']} runs)")


class CpuTimer:
    """Times one call with a nanosecond clock (``time.perf_counter_ns`` unless one is injected)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns):
        self.clock = clock

    def __call__(self, fn: Callable[[], object]) -> float:
        start = self.clock()
        fn()
        return float(self.clock() - start)


class CudaTimer:
    """Times one call with a pair of CUDA events (GPU time, not host time).

    The events are created lazily, on the first call, so constructing the timer needs no GPU.
    """

    def __init__(self, device: str = "cuda"):
        self.device = device
        self._events = None

    def _record(self, fn: Callable[[], object], before: Callable[[], object] | None = None) -> tuple[float, float]:
        """(GPU nanoseconds between the events around ``fn``, host seconds spent enqueueing them
        and ``fn``); ``before`` is enqueued ahead of the start event."""
        import torch

        if self._events is None:
            self._events = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        start, stop = self._events
        torch.cuda.synchronize(self.device)
        if before is not None:
            before()
        t0 = time.perf_counter()
        start.record()
        fn()
        stop.record()
        host_s = time.perf_counter() - t0
        stop.synchronize()
        return start.elapsed_time(stop) * 1e6, host_s  # ms -> ns

    def __call__(self, fn: Callable[[], object]) -> float:
        return self._record(fn)[0]


class QueuedCudaTimer(CudaTimer):
    """GPU time of one call without the host's launch overhead.

    ``CudaTimer`` records its start event on an idle GPU, so the host's time to
    reach the first kernel launch falls inside the events; for a 25 us expert operation that is a
    large share. Here a spin kernel (``torch.cuda._sleep``) holds the stream while the host enqueues
    the start event, the call's kernels and the stop event, so the events bracket GPU work alone.
    ``overruns`` counts calls whose host enqueue took longer than 80% of the spin (then some host
    time may be inside); the spin's length is measured once with events.
    """

    def __init__(self, device: str = "cuda", spin_cycles: int = 2_000_000):
        super().__init__(device)
        self.spin_cycles = int(spin_cycles)
        self.spin_s, self.overruns = None, 0

    def _spin(self) -> None:
        import torch

        torch.cuda._sleep(self.spin_cycles)

    def __call__(self, fn: Callable[[], object]) -> float:
        if self.spin_s is None:
            self.spin_s = self._record(self._spin)[0] * 1e-9
        ns, host_s = self._record(fn, before=self._spin)
        if host_s > 0.8 * self.spin_s:
            self.overruns += 1
        return ns


def last_level_cache(device: str = "cpu") -> dict:
    """The last-level cache of ``device``: on the CPU the hardware record's
    (:func:`moespec.provenance.llc_record`: the total of every instance sysfs reports), on a CUDA
    device its L2 (``torch.cuda.get_device_properties``). ``bytes`` is 0 where nothing reports one."""
    if str(device).startswith("cuda"):
        import torch

        props = torch.cuda.get_device_properties(torch.device(device))
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        return {"level": "L2", "instance_bytes": l2, "instances": 1, "bytes": l2,
                "source": f"torch.cuda.get_device_properties ({props.name})"}
    return provenance.llc_record()


def flush_bytes(device: str = "cpu", cache: Mapping | None = None) -> int:
    """Bytes a cache flush reads: :data:`FLUSH_CACHE_MARGIN` times the last-level cache ``cache``
    (a record of :func:`last_level_cache`; default: ``device``'s), never below the paper's
    :data:`FLUSH_FLOOR_BYTES`. Any working set meant to be cold is at least this large."""
    cache = last_level_cache(device) if cache is None else cache
    return max(FLUSH_FLOOR_BYTES, FLUSH_CACHE_MARGIN * int(cache.get("bytes") or 0))


def read_bytes(device: str = "cpu", cache: Mapping | None = None) -> int:
    """Bytes of a reference read (Figure 2's read bandwidth, the read ceiling): at least
    :data:`READ_FLOOR_BYTES` and at least :func:`flush_bytes`, so that it is a read of memory."""
    return max(READ_FLOOR_BYTES, flush_bytes(device, cache))


def cold_record(device: str = "cpu", flush: int | None = None, read: int | None = None) -> dict:
    """What a benchmark records beside its rows about its cold working sets: ``device``'s last-level
    cache, the size rule, the flush the machine gets (``cold_bytes``) and the flush and reference
    read the run used (``flush``/``read``, when it set them otherwise)."""
    cache = last_level_cache(device)
    cold = flush_bytes(device, cache)
    return {"cache": cache, "rule": f"max({FLUSH_FLOOR_BYTES >> 20} MiB, {FLUSH_CACHE_MARGIN} x last-level cache)",
            "cold_bytes": cold, "flush_bytes": cold if flush is None else int(flush),
            "read_bytes": read_bytes(device, cache) if read is None else int(read)}


class CacheFlush:
    """Evicts the caches between passes by writing and reading ``nbytes`` (CPU: last-level
    caches; GPU: the L2; default :func:`flush_bytes` of ``device``). The buffer is allocated on the
    first flush."""

    def __init__(self, nbytes: int | None = None, device: str = "cpu"):
        nbytes = flush_bytes(device) if nbytes is None else nbytes
        if nbytes < 0:
            raise ValueError(f"flush size must be >= 0 bytes, got {nbytes}")
        self.nbytes = int(nbytes)
        self.device = device
        self._buf = None

    def __call__(self) -> None:
        if self.nbytes == 0:
            return
        import torch

        if self._buf is None:
            self._buf = torch.zeros(self.nbytes // 4, dtype=torch.int32, device=self.device)
        self._buf.add_(1)  # one read and one write of every byte
        if self._buf.is_cuda:
            torch.cuda.synchronize(self.device)


def timer_for(device: str, clock: Callable[[], int] | None = None):
    """The timer for ``device``: CUDA events on ``cuda*``, ``perf_counter_ns`` (or ``clock``) otherwise."""
    if str(device).startswith("cuda"):
        if clock is not None:
            raise ValueError("an injected clock times host code; it cannot time a CUDA device")
        return CudaTimer(str(device))
    return CpuTimer(clock or time.perf_counter_ns)


def time_interleaved(callables: Mapping[str, Callable[[], object]], reps: int, warmup: int = 1,
                     timer: Callable[[Callable[[], object]], float] | None = None,
                     flush: Callable[[], None] | None = None,
                     on_call: Callable[[str, int], None] | None = None,
                     prepare: Mapping[str, Callable[[], object]] | None = None) -> dict[str, Timing]:
    """Time every callable ``reps`` times, round-robin: repetition r runs each callable once,
    in the mapping's order, each after a cache flush; ``warmup`` untimed rounds come first.
    ``prepare[name]``, where given, runs untimed between the flush and every call of ``name`` (what
    the call follows in the loop it stands for: a decode round's previous round).

    ``on_call(name, rep)`` is told of every timed call (rep 0-based; warm-up calls are rep -1);
    tests use it to check the order. Returns name -> :class:`Timing`.
    """
    if reps < 1:
        raise ValueError(f"need at least one repetition, got reps={reps}")
    if warmup < 0:
        raise ValueError(f"warmup must be >= 0, got {warmup}")
    if not callables:
        raise ValueError("nothing to time: no callables given")
    timer = timer or CpuTimer()
    flush = flush or (lambda: None)
    names = list(callables)
    prepare = dict(prepare or {})
    unknown = sorted(set(prepare) - set(names))
    if unknown:
        raise ValueError(f"prepare: names not among the callables: {unknown}")

    def before(name):
        flush()
        if name in prepare:
            prepare[name]()

    for _ in range(warmup):
        for name in names:
            before(name)
            callables[name]()
            if on_call:
                on_call(name, -1)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names:
            before(name)
            samples[name].append(timer(callables[name]))
            if on_call:
                on_call(name, rep)
    return {name: Timing(name, tuple(s)) for name, s in samples.items()}


# --- the machine's state during a run (the discard rule) -----------------------------------------

@dataclass
class MachineState:
    """What happened on the machine while a block of timings ran.

    ``swapped``: swap-in/out counters changed. ``other_load``: share of all CPUs' time used by
    other processes. ``gpu_throttle``: NVML clock-throttle reason bits seen (0: none; idle and
    application-clock settings are not counted). ``flags``: the reasons this block is flagged.
    """

    wall_s: float = 0.0
    swapped: bool = False
    other_load: float = 0.0
    gpu_throttle: int = 0
    flags: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        return bool(self.flags)

    def row(self) -> dict:
        return {"other_load": round(self.other_load, 3), "swapped": int(self.swapped),
                "gpu_throttle": self.gpu_throttle, "flags": ";".join(self.flags)}


# NVML throttle reasons that mean a slowed clock (not GpuIdle = 0x1, not ApplicationsClocksSetting
# = 0x2, which are normal states): SwPowerCap, HwSlowdown, SyncBoost, SwThermal, HwThermal, HwPowerBrake.
_NVML_SLOW = 0x4 | 0x8 | 0x10 | 0x20 | 0x40 | 0x80


def _gpu_throttle_reasons(index: int) -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            return int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)) & _NVML_SLOW
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML / no driver: nothing to report
        return 0


class MachineMonitor:
    """Context manager that records :class:`MachineState` over the block it wraps.

    Flags a block if the machine swapped (psutil swap counters changed), if a GPU reported a
    slowing throttle reason (NVML, sampled at entry and exit), or if other processes used more
    than ``busy_threshold`` of all CPUs' time (psutil: system busy time minus this process's).
    """

    def __init__(self, device: str = "cpu", busy_threshold: float = BUSY_THRESHOLD):
        self.device = str(device)
        self.busy_threshold = busy_threshold
        self.state = MachineState()

    def _gpu_index(self) -> int | None:
        if not self.device.startswith("cuda"):
            return None
        return int(self.device.split(":")[1]) if ":" in self.device else 0

    def __enter__(self) -> "MachineMonitor":
        import psutil

        self._proc = psutil.Process()
        self._swap0 = psutil.swap_memory()
        self._cpu0 = psutil.cpu_times()
        self._own0 = self._proc.cpu_times()
        self._t0 = time.perf_counter()
        gpu = self._gpu_index()
        self._throttle = _gpu_throttle_reasons(gpu) if gpu is not None else 0
        return self

    def __exit__(self, *exc) -> None:
        import psutil

        wall = time.perf_counter() - self._t0
        swap1, cpu1, own1 = psutil.swap_memory(), psutil.cpu_times(), self._proc.cpu_times()
        busy = lambda t: sum(getattr(t, f, 0.0) for f in ("user", "nice", "system", "irq", "softirq", "steal"))
        own = (own1.user + own1.system + getattr(own1, "children_user", 0) + getattr(own1, "children_system", 0)
               - self._own0.user - self._own0.system - getattr(self._own0, "children_user", 0)
               - getattr(self._own0, "children_system", 0))
        ncpu = psutil.cpu_count() or 1
        other = max(0.0, busy(cpu1) - busy(self._cpu0) - own) / max(wall * ncpu, 1e-9)
        gpu = self._gpu_index()
        throttle = self._throttle | (_gpu_throttle_reasons(gpu) if gpu is not None else 0)
        s = self.state
        s.wall_s, s.other_load, s.gpu_throttle = wall, min(other, 1.0), throttle
        s.swapped = (swap1.sin, swap1.sout) != (self._swap0.sin, self._swap0.sout)
        if s.swapped:
            s.flags.append("swap")
        if throttle:
            s.flags.append(f"gpu_throttle=0x{throttle:x}")
        if s.other_load > self.busy_threshold:
            s.flags.append(f"busy={s.other_load:.2f}")


def read_bandwidth_callable(nbytes: int | None = None, device: str = "cpu") -> tuple[Callable[[], object], int]:
    """A callable that reads ``nbytes`` of memory once (``torch.sum`` over an fp32 buffer; default
    :func:`read_bytes` of ``device``), and the bytes it reads: the machine's ``torch.sum`` read, kept
    beside the read ceiling (:mod:`moespec.measure.ceiling`). Time it with :func:`time_interleaved`
    beside the kernels, so that it sees the same drift."""
    import torch

    numel = max(1, int(read_bytes(device) if nbytes is None else nbytes) // 4)
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    return (lambda: torch.sum(buf)), numel * 4

