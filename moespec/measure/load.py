"""Declared machine states: the measurement harness runs a block of work either on a quiet machine
or under a background load it starts and stops itself (issue 24, item 7; docs/engine.md,
"Machine states").

``quiet``: nothing is started; the measuring process is pinned to one CPU (the first it may use)
so that both states run it on the same core. ``loaded``: the same, and a separate process pinned to
another CPU copies a buffer of ``nbytes`` (256 MiB by default) into another one in a loop: a
memory-bandwidth load that competes with the measured process for the memory system (not for its
core). The load is started when the block is entered and stopped (terminated, then killed if it
does not end within a second) when it is left, also on an error or an interrupt; every timed row of
the block still carries its same-round reference read, which is what tells the state in the data.

    with machine_state("loaded") as state:
        ...   # timed work; state.describe() says what ran beside it
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field

#: The states a whole-model notebook can measure in, and what each starts.
STATES = {
    "quiet": "nothing else started by the harness; the measuring process pinned to one CPU",
    "loaded": "a memory-bandwidth load on another CPU (a process copying a 256 MiB buffer into another in a loop), "
              "started and stopped by the harness; the measuring process pinned to its own CPU",
}
LOAD_BYTES = 2**28

_LOAD_CODE = """
import sys, numpy as np
n = int(sys.argv[1]) // 8
src = np.ones(n); dst = np.empty(n)
sys.stdout.write("ready\\n"); sys.stdout.flush()
while True:
    np.copyto(dst, src)
    np.copyto(src, dst)
"""


@dataclass
class MachineState:
    """What a block ran beside: ``name`` (a key of :data:`STATES`), the CPU the measuring process
    was pinned to, the load's CPU, process id and buffer size (``loaded``), start and stop times."""

    name: str
    cpu: int | None = None
    load_cpu: int | None = None
    load_pid: int | None = None
    load_bytes: int | None = None
    started: float | None = None
    stopped: float | None = None
    notes: list = field(default_factory=list)

    def describe(self) -> dict:
        return {"state": self.name, "what": STATES[self.name], "cpu": self.cpu, "load_cpu": self.load_cpu,
                "load_bytes": self.load_bytes, "seconds": None if self.stopped is None or self.started is None
                else round(self.stopped - self.started, 1), "notes": list(self.notes)}


def _cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


class machine_state:
    """Context manager for a declared state (module docstring). ``pin=False`` leaves the measuring
    process's CPUs as they are (the ``quiet`` state then changes nothing)."""

    def __init__(self, name: str = "quiet", nbytes: int = LOAD_BYTES, pin: bool = True):
        if name not in STATES:
            raise ValueError(f"machine state must be one of {sorted(STATES)}; found {name!r}")
        if nbytes < 2**20:
            raise ValueError(f"the load's buffer must be at least 1 MiB; found {nbytes} bytes")
        self.state = MachineState(name)
        self.nbytes, self.pin = int(nbytes), bool(pin)
        self._proc: subprocess.Popen | None = None
        self._affinity: set | None = None

    def __enter__(self) -> MachineState:
        cpus = _cpus()
        if self.state.name == "loaded" and len(cpus) < 2:
            raise RuntimeError(f"the 'loaded' state needs two CPUs (one measured, one loaded); this process may "
                               f"use {cpus or 'an unknown set of CPUs'}")
        if self.pin and cpus:
            self._affinity = set(cpus)
            os.sched_setaffinity(0, {cpus[0]})
            self.state.cpu = cpus[0]
        if self.state.name == "loaded":
            self._proc = subprocess.Popen([sys.executable, "-c", _LOAD_CODE, str(self.nbytes)],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                os.sched_setaffinity(self._proc.pid, {cpus[1]})
                line = self._proc.stdout.readline().strip()
                if line != "ready":
                    raise RuntimeError(f"the background load did not start: {self._proc.stderr.read().strip()}")
            except BaseException:
                self._stop()
                self._restore()
                raise
            self.state.load_cpu, self.state.load_pid, self.state.load_bytes = cpus[1], self._proc.pid, self.nbytes
        self.state.started = time.time()
        return self.state

    def _stop(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is not None:
            self.state.notes.append(f"the load had ended by itself (exit code {self._proc.returncode})")
        else:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def _restore(self) -> None:
        if self._affinity:
            os.sched_setaffinity(0, self._affinity)

    def __exit__(self, *exc) -> None:
        self._stop()
        self._restore()
        self.state.stopped = time.time()
