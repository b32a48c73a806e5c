"""Inputs and tables of the theory notebook (paper 1, Sec. 3): a Table-1 CSV read and checked,
the step times built from each of its rows, and the step points of every staircase."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moespec import paper_reference, paths
from moespec import theory as th
from moespec.model_shapes import PRESETS, get_spec
from moespec.paper_reference import PAPER1_LABEL as PAPER_LABEL
from moespec.validate import reference
from moespec.validate.invariants import check_byte_share_rows
from moespec.validate.tables import Column, check_rows, read_csv

#: Columns a Table-1 CSV must carry (paper 1, Table 1; :func:`moespec.tables.bandwidth.table1`).
TABLE1_NEEDED = ["engine", "model", "n2_beta_slot_GBps", "n2_beta_dedup_GBps", "n2_ubar",
                 "n8_beta_slot_GBps", "n8_beta_dedup_GBps", "n8_ubar"]
#: Storage format of each engine's model files in paper 1 (App. D.2); others use the preset's.
ENGINE_FORMAT = {"MLX-LM": "mlx_4bit"}


def published_table1_path() -> Path:
    """Paper 1's Table 1 as published, checked against its recorded digest (:mod:`moespec.paper_reference`)."""
    return paper_reference.checked_path("table1_bandwidth")


def label_of_rows(source: str) -> str:
    """A label given for a table's rows (``--source``): ``"published"`` or ``"paper1"`` (or the
    label itself) stands for :data:`PAPER_LABEL`, paper 1's published numbers; any other text is
    the label."""
    return PAPER_LABEL if source.strip().lower() in ("published", "paper1", PAPER_LABEL.lower()) else source


def read_table1(path: str | Path = "", source: str | None = None) -> pd.DataFrame:
    """A Table-1 CSV (default: paper 1's published rows) with a ``source`` column. A row is paper
    1's published row (:data:`PAPER_LABEL`) when its content is, whatever the file's name or
    folder (:func:`moespec.validate.reference.published_rows`); other rows keep the CSV's own
    ``source`` (else the file name). ``source`` labels every row instead (``"published"``: paper
    1's numbers). Refused, naming the file, row and column: a number column that is not positive,
    a byte share outside [1/n, 1] (ubar(2) in [1/2, 1], ubar(8) in [1/8, 1]), and a row whose
    ``source`` claims the published label while its numbers are not the published ones."""
    path = Path(path) if path else published_table1_path()
    if not path.exists():
        raise FileNotFoundError(f"Table-1 CSV {path} does not exist")
    columns = [Column("engine", "str"), Column("model", "str"),
               *(Column(c, low=0, low_open=True) for c in TABLE1_NEEDED[2:])]
    df = read_csv(path, columns, "Table-1 CSV", dtype={"reread_cost": str}, keep_default_na=False, na_values=[""])
    for n in (2, 8):
        check_byte_share_rows(df, path, None, f"n{n}_ubar", n=n)
    published = reference.published_rows(df, path)
    if source is not None:
        df["source"] = label_of_rows(source)
        return df
    own = df["source"].astype(str) if "source" in df.columns else pd.Series(f"ours ({path.name})", index=df.index)
    check_rows(df, path, (own == PAPER_LABEL).to_numpy() & ~published, "column 'source'",
               "paper 1's published numbers for a row labelled as theirs (their content digest, data/paper_reference/"
               "digests.json); label an edited copy with --source (source=)", own.tolist())
    df["source"] = np.where(published, PAPER_LABEL, own)
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
    """The preset named ``model`` (its key or paper 1's label), else ``model`` itself."""
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
