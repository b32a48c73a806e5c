"""Inputs and tables of the theory notebook (paper 1, Sec. 3): a Table-1 CSV read and checked,
the step times built from each of its rows, and the step points of every staircase."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moespec import paper_reference, paths
from moespec import theory as th
from moespec.model_shapes import get_spec, preset_name
from moespec.paper_reference import PAPER1_LABEL as PAPER_LABEL

def table1_step_times(df: pd.DataFrame, kmax: int = 8, dense_ratio: float = 0.0) -> list[dict]:
    """Per row: per-slot and deduplicating verify times (ms) and step times V(k), k = 0..kmax,
    from :func:`moespec.theory.table1_verify_times`. m and W come from the model preset (bytes
    of the format the engine ran, or the CSV's ``top_k`` / ``expert_bytes_W`` columns if present);
    D = ``dense_ratio`` m W, read at the per-slot one-token bandwidth (an assumption: Table 1 has
    no dense bandwidth)."""
    out = []
    for _, row in df.iterrows():
        if "top_k" in row and "expert_bytes_W" in row:
            m, W = int(row["top_k"]), float(row["expert_bytes_W"])
        else:
            spec = get_spec(preset_name(row["model"]))
            m, W = spec.top_k, spec.total_expert_bytes(paper_reference.ENGINE_FORMAT.get(row["engine"]))
        per_ms = 1e6                                   # GB/s -> bytes per ms
        beta1 = th.interpolate_bandwidth(row["n2_beta_slot_GBps"], row["n8_beta_slot_GBps"], kmax + 1)[0]
        slot, dedup, rho = th.table1_verify_times(
            row["n2_beta_slot_GBps"] * per_ms, row["n8_beta_slot_GBps"] * per_ms,
            row["n2_beta_dedup_GBps"] * per_ms, row["n8_beta_dedup_GBps"] * per_ms,
            row["n2_ubar"], row["n8_ubar"], m, W, dense_bytes=dense_ratio * m * W,
            dense_bandwidth=beta1 * per_ms, n_max=kmax + 1)
        out.append(dict(source=row["source"], engine=row["engine"], model=row["model"], m=m, W=W,
                        label=f"{row['engine']}, {row['model']}", slot=slot, dedup=dedup, rho=rho,
                        V_slot=slot.step_times(), V_dedup=dedup.step_times()))
    return out


def step_point_table(records: list[dict]) -> pd.DataFrame:
    """One row per Table-1 row and engine kind: the step points a_1..a_kmax (eq. B.31), k*(0)
    and the rises of more than one (jumps) of the staircase."""
    rows = []
    for rec in records:
        for kernel in ("slot", "dedup"):
            V = rec[f"V_{kernel}"]
            a = th.step_points(V)
            st = th.staircase(V)
            row = dict(source=rec["source"], engine=rec["engine"], model=rec["model"],
                       engine_kind="per-slot" if kernel == "slot" else "deduplicating",
                       k_at_0=st.at_zero, jumps=len(st.jumps))
            row.update({f"a_{j}": float(x) for j, x in enumerate(a, start=1)})
            rows.append(row)
    return pd.DataFrame(rows)


def bound_curves(eps_grid) -> dict[str, np.ndarray]:
    """Table 2's bounds against the bandwidth error eps, from the theory's own functions at every
    point: delta (C.7), the throughput lost (20) and the speedup factor - 1 (21)."""
    eps = [float(e) for e in eps_grid]
    delta = [th.delta_from_eps(e) for e in eps]
    return {"delta = eps/(1-eps) (C.7)": np.array(delta),
            "throughput lost 2 delta/(1+delta) (20)": np.array([th.throughput_loss_bound(d) for d in delta]),
            "speedup factor - 1 = 1/(1-2 eps) - 1 (21)": np.array([th.speedup_factor_from_eps(e) - 1 for e in eps])}


#: Paper 1's bandwidth error eps per engine (Section 4), read by notebook 04 beside Table 2's bounds.
published_epsilon = paper_reference.paper1_epsilon


def bounds_epsilon(table1: pd.DataFrame, engine: str, bandwidth_csv: str | Path = "", epsilon_csv: str | Path = "",
                   eps_override: float = 0.0) -> tuple[float, str]:
    """The bandwidth error eps of ``engine``'s rows of ``table1`` and where it comes from:
    ``eps_override`` when it is > 0; for rows of paper 1's published table the paper's eps of that
    engine (:func:`published_epsilon`); for rows of our own benchmark the engine eps notebook 03
    measured (``03_epsilon.csv``: ``epsilon_csv``, else the one beside ``bandwidth_csv``, else this
    run's, :func:`moespec.paths.figures_dir`). Nothing is assumed: a missing eps is an error naming
    what to give."""
    if eps_override:
        return float(eps_override), f"eps_override = {eps_override:g}"
    rows = table1[table1["engine"] == engine]
    if rows.empty:
        raise ValueError(f"engine {engine!r} is not in the Table-1 CSV; engines: {sorted(set(table1['engine']))}")
    if (rows["source"] == PAPER_LABEL).all():
        published = published_epsilon()
        if engine not in published:
            raise ValueError(f"paper 1 publishes no eps for {engine!r} (it does for {sorted(published)}); "
                             "pass eps_override")
        return published[engine], f"paper 1's published eps of {engine}"
    candidates = [Path(epsilon_csv)] if epsilon_csv else []
    if bandwidth_csv:
        candidates.append(Path(bandwidth_csv).parent / "03_epsilon.csv")
    candidates.append(paths.figures_dir() / "03_epsilon.csv")
    found = next((c for c in candidates if c.is_file()), None)
    if found is None:
        raise FileNotFoundError(f"no eps for {engine!r} (our benchmark's rows): none of "
                                f"{[str(c) for c in candidates]} exists; run notebook 03 on the same benchmark, or "
                                "pass epsilon_csv or eps_override")
    eps = pd.read_csv(found)
    if "eps_engine" not in eps.columns or eps.empty:
        raise ValueError(f"{found}: expected notebook 03's column eps_engine")
    if len(eps) > 1 and "backend" in eps.columns:
        mine = eps[[str(b) in engine for b in eps["backend"]]]
        if len(mine) != 1:
            raise ValueError(f"{found}: {len(eps)} backends {list(eps['backend'])}; none or several match engine "
                             f"{engine!r}; pass eps_override")
        eps = mine
    return float(eps["eps_engine"].iloc[0]), f"notebook 03's engine eps ({found.name})"
