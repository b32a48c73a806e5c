"""What the benchmark scripts (``benchmarks/bench_*.py``) share: the cache protocols of a timed
call, the layer copies handed out in turn, the read flush, the check of the bandwidth regime, the
columns every row records, a run's stamp and output files, and the common command-line arguments.

Protocols (docs/kernels.md, "Benchmark"): ``cold`` flushes the caches (a read of ``flush_bytes``, by
default 4x the machine's last-level cache: :func:`moespec.measure.timing.flush_bytes`) before every
timed call, so the weights, the code and the driver's data are all cold; ``warm-code`` does not
flush between calls but gives each call the next of several copies of the layer (:class:`Copies`),
so its weights are cold (the other copies' reads evicted them) while the code and data are as warm
as between consecutive layers of a model.

The scripts set ``THP_MEM_ALLOC_ENABLE`` (transparent huge pages for torch's allocations) before
importing torch; the rows record it (:func:`run_columns`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from moespec import io, paths, provenance
from moespec.measure import timing

#: The cache protocols of the kernel benchmarks (module docstring).
PROTOCOLS = ("cold", "warm-code")

#: A block whose reference reads differ by more than this factor between rounds saw the machine's
#: bandwidth regime change (on this VM 34-38 vs 58-66 GB/s, minutes apart): a round's read and
#: kernel calls may then fall on different sides of the change, and its ratios are not to be trusted.
UNSTEADY_READ = 1.25


def read_flush(nbytes: int | None = None) -> Callable[[], object]:
    """A callable that evicts the caches by reading ``nbytes`` (default: the machine's flush,
    :func:`moespec.measure.timing.flush_bytes`; clean lines: a write flush would leave dirty lines
    whose write-back the next timed call pays for)."""
    buf = torch.ones(max(1, int(timing.flush_bytes() if nbytes is None else nbytes) // 4))
    return lambda: torch.sum(buf)


def read_unsteady(read_bw) -> bool:
    """True when the per-round read bandwidths ``read_bw`` span more than :data:`UNSTEADY_READ`."""
    read_bw = np.asarray(read_bw, dtype=float)
    return bool(read_bw.max() > UNSTEADY_READ * read_bw.min())


def check_protocol(protocol: str, copies: int) -> int:
    """The number of layer copies a run uses (``copies`` under ``warm-code``, one under ``cold``);
    refuses an unknown protocol or fewer than two copies under ``warm-code``."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, found {protocol!r}")
    if protocol == "warm-code" and copies < 2:
        raise ValueError(f"warm-code needs at least 2 layer copies, found {copies}")
    return int(copies) if protocol == "warm-code" else 1


class Copies:
    """The layer copies of a run, handed out in turn: every call (of any kernel) takes the next
    copy, so that under ``warm-code`` a call's weights were last read several calls earlier and
    the reads in between evicted them (one copy under ``cold``, where a flush does that)."""

    def __init__(self, items: Iterable):
        self.items, self.turn = list(items), 0

    def next(self):
        item = self.items[self.turn % len(self.items)]
        self.turn += 1
        return item


def rotating(passes: Sequence, log: list, fn: Callable) -> Callable[[], object]:
    """A timed call: ``fn(ids)`` on the next of ``passes`` (in turn), the ids logged in ``log``."""
    state = {"i": 0}

    def call():
        ids = passes[state["i"] % len(passes)]
        state["i"] += 1
        log.append(ids)
        return fn(ids)
    return call


def utc_now() -> str:
    """The time now, UTC, ISO 8601 to the second (the ``date`` column of every row)."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def stamp() -> str:
    """A run's file stamp: UTC ``YYYYmmddTHHMMSSZ``."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def kernels_dir() -> Path:
    """Where the CPU kernel benchmarks write: ``data/bench/kernels`` (:func:`moespec.paths.bench_dir`)."""
    return paths.ensure(paths.bench_dir() / "kernels")


def write_provenance(path: Path, args: argparse.Namespace | dict, **extra) -> Path:
    """The run's arguments with the machine, versions and commit (:func:`moespec.provenance.full_record`),
    the cache and the sizes the run's flush and reference reads had (``cold``:
    :func:`moespec.measure.timing.cold_record` of ``--flush-mib``/``--membw-gib``) and ``extra``."""
    given = dict(vars(args) if isinstance(args, argparse.Namespace) else args)
    cold = timing.cold_record("cpu", *sizes(argparse.Namespace(**{"flush_mib": None, **given})))
    return io.write_json(path, {"args": given, **provenance.full_record(), "cold": cold, **extra})


def sizes(args: argparse.Namespace) -> tuple[int | None, int | None]:
    """The flush and the reference read of :func:`add_common_arguments`' ``--flush-mib`` and
    ``--membw-gib`` in bytes; None where not given (the machine's:
    :func:`moespec.measure.timing.flush_bytes`, :func:`~moespec.measure.timing.read_bytes`)."""
    flush = None if args.flush_mib is None else int(args.flush_mib * 2**20)
    gib = getattr(args, "membw_gib", None)
    return flush, None if gib is None else int(gib * 2**30)


def run_columns(fmt: str | None = None) -> dict:
    """The columns every kernel-benchmark row carries about how it ran: torch's threads, huge
    pages, ``OMP_WAIT_POLICY``, ``MOESPEC_CPU_THREADS``, the ISA path of ``fmt`` (with the C++
    extension loaded) and the date."""
    cols = {"threads": torch.get_num_threads(), "thp": os.environ.get("THP_MEM_ALLOC_ENABLE", "0"),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", ""),
            "cpu_threads": os.environ.get("MOESPEC_CPU_THREADS", "auto")}
    if fmt is not None:
        cols["cpu_isa"] = torch.ops.moespec.cpu_isa(fmt)
    cols["date"] = utc_now()
    return cols


def machine_line(record: dict) -> str:
    """One line naming the machine, numpy and the commit of a :func:`moespec.provenance.full_record`."""
    cpu = record["hardware"]["cpu"]
    return (f"machine: {cpu.get('cpu_model')} ({cpu.get('logical_cpus')} logical CPUs), numpy "
            f"{record['versions']['numpy']}, commit {record['git_commit']}")


def add_common_arguments(ap: argparse.ArgumentParser, reps: int | None = None, protocol: bool = True,
                         membw: bool = True, seed: bool = True) -> argparse.ArgumentParser:
    """The arguments the kernel benchmarks share: ``--threads`` (2), ``--flush-mib`` (the machine's:
    4x its last-level cache, at least 256 MiB) and, as asked, ``--reps``, ``--membw-gib`` (the reference
    reads: at least 1 GiB and the flush), ``--seed`` and ``--protocol`` / ``--copies`` (:func:`sizes`)."""
    ap.add_argument("--threads", type=int, default=2, help="torch's intra-op threads (the kernels' too)")
    ap.add_argument("--flush-mib", type=float, default=None,
                    help="MiB read before a call to evict the caches (default: 4x the last-level cache, >= 256)")
    if reps is not None:
        ap.add_argument("--reps", type=int, default=reps, help="timed rounds")
    if membw:
        ap.add_argument("--membw-gib", type=float, default=None,
                        help="GiB of the reference reads (default: the larger of 1 GiB and the flush)")
    if seed:
        ap.add_argument("--seed", type=int, default=0)
    if protocol:
        ap.add_argument("--protocol", choices=PROTOCOLS, default="cold",
                        help="cold: a cache flush before every call; warm-code: no flush, each call on the next of "
                             "--copies layer copies (cold weights, warm code)")
        ap.add_argument("--copies", type=int, default=3, help="layer copies under --protocol warm-code")
    return ap
