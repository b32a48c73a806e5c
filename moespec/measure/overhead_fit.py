"""Fixed cost and streaming rate of the CUDA kernels in a GPU run, from its n = 1 rows.

At n = 1 a pass reads U = m distinct experts, so per-slot and dedup request the same bytes and no
expert is read twice. The f32 and bf16 layers of a preset differ only in bytes (2x), so the two
points give, per preset and kernel, the line t = a + bytes / beta through them: beta is the rate
at which the extra bytes stream, a the time that does not depend on the bytes (launches, ramp-up
and tail of each launch, latency chains before the first weight load, and anything the cache
protocol adds per call). Reads the first GPU run's layouts (slot/dedup columns) and the long one
of ``benchmarks/bench_kernels_cuda.py``; standard library only.
"""

from __future__ import annotations

import csv
from pathlib import Path


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a benchmark CSV as dicts of strings."""
    with Path(path).open(newline="") as fh:
        return list(csv.DictReader(fh))


def n1_times(rows: list[dict]) -> dict[tuple[str, str, str], tuple[float, float]]:
    """{(model, kernel, fmt): (bytes, median seconds)} of the n = 1 rows (eager legacy/fused
    calls; in the long layout the protocol and variant of the first such row)."""
    out = {}
    for r in rows:
        if int(r["n"]) != 1:
            continue
        if "kernel" in r:  # long layout: one row per callable
            if r["kernel"] not in ("slot", "dedup") or int(float(r.get("graph", 0) or 0)):
                continue
            key = (r["model"] + f" [{r['variant']}, {r['protocol']}]", r["kernel"], r["fmt"])
            out.setdefault(key, (float(r["bytes"]), float(r["t_s"])))
        else:  # the first run's layouts: slot and dedup columns (the standalone one without bytes)
            for k in ("slot", "dedup"):
                nbytes = (float(r[f"{k}_bytes"]) if f"{k}_bytes" in r else
                          float(r["expert_bytes"]) * (int(r["n"]) * int(r["m"]) if k == "slot" else int(r["U"])))
                out[(r["model"], k, r["fmt"])] = (nbytes, float(r[f"t_{k}_s"]))
    return out


def fit(rows: list[dict]) -> list[dict]:
    """Per (model, kernel): beta and a of the line through the f32 and bf16 points at n = 1, and
    the share of the bf16 call's time that a is."""
    t = n1_times(rows)
    out = []
    for (model, kernel, fmt), (b32, t32) in sorted(t.items()):
        if fmt != "f32" or (model, kernel, "bf16") not in t:
            continue
        b16, t16 = t[(model, kernel, "bf16")]
        beta = (b32 - b16) / (t32 - t16)
        a = t16 - b16 / beta
        out.append({"model": model, "kernel": kernel, "t_f32_us": t32 * 1e6, "t_bf16_us": t16 * 1e6,
                    "beta_GBps": beta / 1e9, "a_us": a * 1e6, "a_share_bf16": a / t16})
    return out


def markdown(fits: list[dict]) -> str:
    """The fits as a Markdown table."""
    lines = ["| preset | kernel | t f32 (us) | t bf16 (us) | beta (GB/s) | a (us) | a / t bf16 |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {f['model']} | {f['kernel']} | {f['t_f32_us']:.1f} | {f['t_bf16_us']:.1f} | {f['beta_GBps']:.0f} "
              f"| {f['a_us']:.1f} | {f['a_share_bf16']:.2f} |" for f in fits]
    return "\n".join(lines)
