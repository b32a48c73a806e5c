"""What ran, where: git commit, package versions and hardware, recorded beside every result.

GPU facts come from ``nvidia-ml-py`` (NVML) when an NVIDIA driver is present; CPU facts from
``/proc/cpuinfo``, ``lscpu``-style sysfs caches and the frequency governor otherwise. Nothing here
initialises CUDA.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

from . import paths

PACKAGES = ("moespec", "torch", "numpy", "pandas", "transformers", "tokenizers", "papermill",
            "scikit-learn", "statsmodels", "matplotlib", "nvidia-ml-py")


def git_commit(root: Path | None = None) -> str:
    """The checked-out commit, with ``-dirty`` when the work tree has changes; ``unknown`` outside git."""
    root = root or paths.ROOT
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.strip()
        # --no-optional-locks: reading the status must not take the index lock of the user's checkout
        dirty = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def package_versions(names=PACKAGES) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _size_bytes(text: str | None) -> int:
    """A sysfs cache size ('491520K', '32M', '1024') in bytes; 0 if unreadable."""
    text = (text or "").strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    digits = text[:-1] if text[-1:] in "KMG" else text
    return int(digits) * scale if digits.isdigit() else 0


def llc_record(cpu_root: str | Path = "/sys/devices/system/cpu") -> dict:
    """The CPU's last-level cache as sysfs reports it (what ``lscpu`` prints): its level, the size of
    one instance, the number of distinct instances over all CPUs and their total (``bytes``: what the
    machine can hold). A VM may report one instance per socket or one per core; the total counts each
    reported instance once (by its ``id``, else its ``shared_cpu_list``), so a per-core report gives
    more, never less, than the chip holds. ``bytes`` is 0 where sysfs has no caches."""
    instances: dict[tuple, int] = {}
    level = 0
    for idx in sorted(Path(cpu_root).glob("cpu[0-9]*/cache/index[0-9]*")):
        lvl, kind = _read(str(idx / "level")), _read(str(idx / "type"))
        if not (lvl and lvl.isdigit()) or kind == "Instruction":
            continue
        size = _size_bytes(_read(str(idx / "size")))
        if not size:
            continue
        if int(lvl) > level:
            level, instances = int(lvl), {}
        if int(lvl) == level:
            key = (_read(str(idx / "id")) or "", _read(str(idx / "shared_cpu_list")) or idx.parent.parent.name)
            instances[key] = size
    if not instances:
        return {"level": None, "instance_bytes": 0, "instances": 0, "bytes": 0, "source": f"no caches in {cpu_root}"}
    return {"level": f"L{level}", "instance_bytes": max(instances.values()), "instances": len(instances),
            "bytes": sum(instances.values()), "source": f"sysfs ({cpu_root})"}


def cpu_record() -> dict:
    """CPU model, core count, cache sizes (cpu0's, and the last-level cache's total: :func:`llc_record`),
    frequency governor and memory (Linux sysfs/procfs)."""
    rec: dict = {"machine": platform.machine(), "logical_cpus": os.cpu_count()}
    info = _read("/proc/cpuinfo") or ""
    for line in info.splitlines():
        if line.startswith("model name"):
            rec["cpu_model"] = line.split(":", 1)[1].strip()
            break
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                  if line.startswith("flags")), [])
    rec["simd"] = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni") if f in flags]
    caches = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    if base.exists():
        for idx in sorted(base.glob("index*")):
            level, kind, size = (_read(str(idx / f)) for f in ("level", "type", "size"))
            if level and size:
                caches[f"L{level}{'' if kind == 'Unified' else kind[0].lower()}"] = size
    rec["caches_per_core"] = caches
    rec["llc"] = llc_record()
    rec["governor"] = _read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") or "n/a (VM)"
    mem = _read("/proc/meminfo") or ""
    for line in mem.splitlines():
        if line.startswith(("MemTotal", "SwapTotal", "SwapFree")):
            key, val = line.split(":", 1)
            rec[key] = val.strip()
    return rec


def gpu_record() -> list[dict]:
    """One dict per NVIDIA GPU through NVML (empty list where there is no driver)."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver / no GPU: an expected state on CPU machines
        return []
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            rec = {"index": i, "name": name.decode() if isinstance(name, bytes) else name}
            for key, fn in (("sm_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
                            ("mem_clock_mhz", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
                            ("max_mem_clock_mhz", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
                            ("mem_bus_width_bits", lambda: pynvml.nvmlDeviceGetMemoryBusWidth(h)),
                            ("throttle_reasons", lambda: int(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))),
                            ("temperature_c", lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
                            ("driver", lambda: pynvml.nvmlSystemGetDriverVersion())):
                try:
                    val = fn()
                    rec[key] = val.decode() if isinstance(val, bytes) else val
                except Exception:
                    rec[key] = None
            if rec.get("max_mem_clock_mhz") and rec.get("mem_bus_width_bits"):
                # DDR: two transfers per clock; bytes = bits / 8
                rec["nominal_mem_bw_GBps"] = round(2 * rec["max_mem_clock_mhz"] * 1e6
                                                   * rec["mem_bus_width_bits"] / 8 / 1e9, 1)
            out.append(rec)
    finally:
        pynvml.nvmlShutdown()
    return out


def hardware_record() -> dict:
    return {"host": platform.node(), "os": platform.platform(), "cpu": cpu_record(), "gpus": gpu_record()}


def full_record() -> dict:
    """Commit, versions and hardware: the provenance written beside every result."""
    return {"git_commit": git_commit(), "versions": package_versions(), "hardware": hardware_record()}
