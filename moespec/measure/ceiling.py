"""The read ceiling: the fastest this machine reads memory the way the kernels read it, and the check
that no kernel's share of it is above 1.

Figure 2's reference line and every "share of read" divide a kernel's effective bandwidth by a read
of memory timed in the same interleaved rounds (paper 1, Section 2). A kernel cannot read memory
faster than memory can be read, so that reference has to be a ceiling. Here it is the best of a few
read patterns (:data:`CPU_PATTERNS`) of the C++ extension's ``read_probe``
(``moespec/kernels/csrc/cpu/read_probe.cpp``: vector loads and a running sum, nothing else), run with
the kernels' threads (torch's intra-op threads, the OpenMP team the kernels use; the process's CPU
affinity, so the same pinning) and streaming :data:`BUFFERS` independent buffers per call, as an
expert call streams its gate, up and down matrices. The buffers together hold
:func:`moespec.measure.timing.read_bytes` (more than the caches hold, so it is a read of memory).
Each pattern is one callable of the interleaved rounds (:func:`moespec.measure.timing.time_interleaved`,
a cache flush before each call, as before each kernel call); the ceiling is the pattern with the
highest median bandwidth (:meth:`ReadCeiling.summary`), or the ``torch.sum`` read of the same rounds
where that is faster (the benchmarks take the larger), which also stays beside it as a second
reference. On a CUDA device (and on a CPU without the extension) the patterns
are torch's own reads (:data:`TORCH_PATTERNS`).

A share above 1 beyond the spread of the shares (:func:`above`) is flagged with its likely cause
(:func:`cause`): the caches were not flushed (the flush is below the machine's cold size), re-reads
of repeated experts served by the cache (the per-slot kernel at n >= 2 counts every slot's bytes),
or the probe is not this machine's ceiling.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from moespec.measure import timing

#: The extension's read patterns the ceiling takes the best of (read_probe.cpp): one contiguous share
#: per thread, the kernels' lanes, whole matrices per thread, and int8 values beside their scales.
CPU_PATTERNS = ("halves", "lanes", "whole", "side")
#: torch's own reads: ``torch.sum`` of each buffer and ``copy_`` of each into a second buffer
#: (counted by the bytes read).
TORCH_PATTERNS = ("sum", "copy")
#: Independent buffers one ceiling call streams (an expert's gate, up and down matrices).
BUFFERS = 3
#: Bytes of one "matrix" of the lanes and whole patterns when the caller gives none (an int8 OLMoE
#: gate matrix, 2304 x 1024 bytes, as ``benchmarks/bench_read_patterns.py``).
MATRIX_BYTES = 2304 * 1024
#: Prefix of the ceiling's callables and row ids.
PREFIX = "ceiling:"
#: Kinds of a benchmark group's reference rows (the ``torch.sum`` read and the ceiling's patterns):
#: not timed rows of a kernel.
REFERENCE_KINDS = ("membw", "ceiling")
_MIN_BUFFER = 2**20   # read_probe's least buffer


class ReadCeiling:
    """The read ceiling's callables, one per pattern, and the summary of their timings.

    ``nbytes``: bytes one call reads over all its buffers (default :func:`timing.read_bytes` of
    ``device``); ``threads``: the probe's threads (default: torch's, at the first call, as the kernels
    take them); ``matrix_bytes``: one matrix of the lanes and whole patterns (the caller's expert
    matrix). ``probe``: ``read_probe(buf, pattern, matrix_bytes, threads, fmas, prefetch) -> (ns,
    bytes, checksum)`` (default: the C++ extension's; tests pass a fake). Buffers are allocated (and
    written, so that their pages are real) at the first call. ``bytes`` holds, per pattern, the bytes
    its last call read.
    """

    def __init__(self, nbytes: int | None = None, device: str = "cpu", threads: int | None = None,
                 patterns: tuple[str, ...] | None = None, buffers: int = BUFFERS, matrix_bytes: int | None = None,
                 probe: Callable | None = None):
        self.device = str(device)
        self.nbytes = int(timing.read_bytes(self.device) if nbytes is None else nbytes)
        if buffers < 1:
            raise ValueError(f"the read ceiling needs at least one buffer, found buffers={buffers}")
        self.buffers, self.threads = int(buffers), threads
        self.matrix_bytes = int(matrix_bytes or MATRIX_BYTES)
        self.probe = probe
        if probe is None and not self.device.startswith("cuda"):
            self.probe = _extension_probe()
        default = CPU_PATTERNS if self.probe is not None else TORCH_PATTERNS
        self.patterns = tuple(patterns or default)
        known = CPU_PATTERNS + ("fused",) if self.probe is not None else TORCH_PATTERNS
        if unknown := [p for p in self.patterns if p not in known]:
            raise ValueError(f"read ceiling patterns {unknown} are not among {list(known)}")
        self.bytes: dict[str, int] = {}
        self._bufs = None
        self._dst = None

    def _buffers(self):
        if self._bufs is None:
            import torch

            each = max(_MIN_BUFFER, self.nbytes // self.buffers) // 4096 * 4096
            self._bufs = [torch.ones(each // 4, dtype=torch.float32, device=self.device) for _ in range(self.buffers)]
        return self._bufs

    def _matrix(self, threads: int, each: int) -> int:
        """The lanes/whole matrix size read_probe accepts for a buffer of ``each`` bytes."""
        mb = min(max(self.matrix_bytes, 4096 * threads), each // threads)
        return max(4096, mb // 256 * 256)

    def _call(self, pattern: str) -> None:
        bufs = self._buffers()
        total = 0
        if self.probe is None:
            import torch

            for i, buf in enumerate(bufs):
                if pattern == "sum":
                    torch.sum(buf)
                else:
                    if self._dst is None:
                        self._dst = torch.empty_like(buf)
                    self._dst.copy_(buf)
                total += buf.numel() * 4
        else:
            if self.threads is None:
                import torch

                self.threads = torch.get_num_threads()
            each = bufs[0].numel() * 4
            mb = self._matrix(self.threads, each)
            for buf in bufs:
                total += int(self.probe(buf, pattern, mb, self.threads, 0, 0)[1])
        self.bytes[pattern] = total

    def calls(self) -> dict[str, Callable[[], None]]:
        """``{"ceiling:<pattern>": callable}``: one call reads every buffer once in that pattern."""
        return {PREFIX + p: (lambda p=p: self._call(p)) for p in self.patterns}

    def summary(self, timings: Mapping) -> dict:
        """The ceiling from the timings of :meth:`calls` (``{name: Timing}``; other names are
        ignored): per pattern its median bandwidth over the rounds (GB/s); the best pattern's median,
        quartiles and per-round bandwidth (``per_round``, for ratios paired per round)."""
        per = {}
        for p in self.patterns:
            t = timings.get(PREFIX + p)
            if t is None or p not in self.bytes:
                continue
            per[p] = self.bytes[p] / np.asarray(t.samples_ns, dtype=float)  # bytes per ns = GB/s
        if not per:
            raise ValueError("no timed read-ceiling calls among the timings (time ReadCeiling.calls() first)")
        best = max(per, key=lambda p: float(np.median(per[p])))
        bw = per[best]
        return {"pattern": best, "GBps": float(np.median(bw)), "q25_GBps": float(np.quantile(bw, 0.25)),
                "q75_GBps": float(np.quantile(bw, 0.75)), "per_round": bw,
                "patterns": {p: float(np.median(v)) for p, v in per.items()}}

    def record(self) -> dict:
        """What the provenance records about the ceiling."""
        return {"patterns": list(self.patterns), "buffers": self.buffers, "bytes": self.nbytes,
                "threads": self.threads, "matrix_bytes": self.matrix_bytes,
                "probe": "read_probe (C++ extension)" if self.probe is not None else "torch (sum, copy_)"}


def _extension_probe():
    """The C++ extension's ``read_probe``, or None where the extension does not build or load."""
    try:
        from moespec.kernels import build

        return build.load_cpu().read_probe
    except Exception:  # no compiler / no extension: torch's own reads are the ceiling
        return None


# --- the check: a share of the ceiling above 1 ------------------------------------------------------

#: The likely causes of a share above 1, in the words the tables and figures print.
CAUSE_FLUSH = "cache not flushed (the flush was below the machine's cold size)"
CAUSE_UNKNOWN = "cache possibly not flushed (no cache size recorded) or the probe is not the ceiling"
CAUSE_REREAD = "per-slot re-reads of repeated experts served by the cache (n·m·b counts them)"
CAUSE_PROBE = "the probe is not the ceiling (the flush covers the cache)"


def above(share_low) -> np.ndarray:
    """Whether a share of the read ceiling is above 1 beyond its spread: its bound nearest 1 (the
    kernel's bandwidth over the ceiling's fast quartile, or the lower quartile of a ratio paired per
    round) is above 1."""
    return np.asarray(share_low, dtype=float) > 1.0


def cause(kernel: str, n: int, ubar: float | None, flush_bytes: float | None, cold_bytes: float | None) -> str:
    """The likely cause of a flagged share: a flush below the machine's cold size
    (:func:`timing.flush_bytes`) first; no recorded cold size; else, for the per-slot kernel at
    n >= 2 with repeated experts (ubar < 1), re-reads served by the cache; else the probe."""
    if cold_bytes is None or not np.isfinite(cold_bytes) or cold_bytes <= 0:
        return CAUSE_UNKNOWN
    if flush_bytes is not None and np.isfinite(flush_bytes) and flush_bytes < cold_bytes:
        return CAUSE_FLUSH
    if kernel == "slot" and n >= 2 and ubar is not None and np.isfinite(ubar) and ubar < 1:
        return CAUSE_REREAD
    return CAUSE_PROBE
