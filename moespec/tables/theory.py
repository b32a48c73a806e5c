"""Inputs and tables of the theory notebook (paper 1, Sec. 3): a Table-1 CSV read and checked,
the step times built from each of its rows, and the step points of every staircase."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moespec import paths
from moespec import theory as th
from moespec.model_shapes import PRESETS, get_spec
from moespec.tables.bandwidth import PAPER_LABEL

#: Columns a Table-1 CSV must carry (paper 1, Table 1; :func:`moespec.tables.bandwidth.table1`).
TABLE1_NEEDED = ["engine", "model", "n2_beta_slot_GBps", "n2_beta_dedup_GBps", "n2_ubar",
                 "n8_beta_slot_GBps", "n8_beta_dedup_GBps", "n8_ubar"]
#: Storage format of each engine's model files in paper 1 (App. D.2); others use the preset's.
ENGINE_FORMAT = {"MLX-LM": "mlx_4bit"}


def published_table1_path() -> Path:
    return paths.reference_dir() / "paper1_table1_bandwidth.csv"


def read_table1(path: str | Path = "") -> pd.DataFrame:
    """A Table-1 CSV (default: paper 1's published rows) with a ``source`` column: the paper's
    label for the published file, the CSV's own ``source`` (or its file name) otherwise."""
    path = Path(path) if path else published_table1_path()
    if not path.exists():
        raise FileNotFoundError(f"Table-1 CSV {path} does not exist")
    df = pd.read_csv(path, dtype={"reread_cost": str}, keep_default_na=False, na_values=[""])
    missing = [c for c in TABLE1_NEEDED if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {missing}; expected at least {TABLE1_NEEDED}")
    for col in TABLE1_NEEDED[2:]:
        values = pd.to_numeric(df[col], errors="coerce")
        if values.isna().any() or (values <= 0).any():
            bad = df.loc[values.isna() | (values <= 0), ["engine", "model", col]].iloc[0].tolist()
            raise ValueError(f"{path}: column {col} needs positive numbers; found {bad}")
        df[col] = values.astype(float)
    if path.resolve() == published_table1_path().resolve():
        df["source"] = PAPER_LABEL
    elif "source" not in df.columns:
        df["source"] = f"ours ({path.name})"
    return df


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
            spec = get_spec(_preset_name(row["model"]))
            m, W = spec.top_k, spec.total_expert_bytes(ENGINE_FORMAT.get(row["engine"]))
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


def _preset_name(model: str) -> str:

    for name, spec in PRESETS.items():
        if model.lower() in (name, spec.paper_label.lower()):
            return name
    return model


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
