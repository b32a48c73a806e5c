"""``moespec advise --bandwidth``: a round model predicted from a bandwidth table (paper 1's Table 1
layout with n = 2 and 8, or one row per n = 1..9) plus, optionally, a routing trace whose byte share
ubar(n) replaces the table's; the margin (19) judged over the rounding of the table's cells.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import theory as th
from moespec.model_shapes import get_spec, preset_name
from moespec.paper_reference import ENGINE_FORMAT, PAPER1_LABEL, label_of_rows, paper1_epsilon, read_table1
from moespec.predict.round_model import DraftTime
from moespec.routing import byte_share
from moespec.validate.tables import check_rows

from . import validate
from .curves import N_MAX, VerifyCurves, draft_assumption, draft_or_refuse, finite, predicted_round
from .errors import AdviceInputError


def _pick_row(df: pd.DataFrame, path: Path, engine: str | None, model: str | None) -> pd.Series:
    sel = df
    if engine:
        sel = sel[sel["engine"].astype(str).str.lower() == engine.lower()]
    if model:
        sel = sel[sel["model"].astype(str).str.lower() == model.lower()]
    rows = sorted(set(zip(df["engine"].astype(str), df["model"].astype(str))))
    if len(sel) != 1:
        raise AdviceInputError(f"{path}: engine={engine!r}, model={model!r} select {len(sel)} rows; "
                               f"choose one of (engine, model) = {rows}")
    return sel.iloc[0]


def _half_unit(text) -> float:
    """Half a unit of the last printed digit of a table cell ("0.34" -> 0.005, "114" -> 0.5)."""
    mantissa, _, exponent = str(text).strip().lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** ((int(exponent) if exponent else 0) - decimals)


def _gap_range(gap_of, values: dict, halves: dict) -> np.ndarray:
    """[n, 2]: the least and greatest of ``gap_of(values)`` (ln r(n) - ln ubar(n)) over every corner
    of the box values +- halves. Each value enters r(n) or ubar(n) monotonically, so the extremes
    over the box lie on its corners."""
    names = [k for k in values if np.any(np.asarray(halves[k]) > 0)]
    gaps = [gap_of({**values, **{k: values[k] + sign * halves[k] for k, sign in zip(names, signs)}})
            for signs in itertools.product((-1.0, 1.0), repeat=len(names))]
    return np.stack([np.min(gaps, axis=0), np.max(gaps, axis=0)], axis=1)


def _table1_ubar(u2, u8) -> np.ndarray:
    """ubar(n), n = 1..N_MAX, of the geometric model through ubar(2), ubar(8) (moespec.theory.table1)."""
    rho = th.reuse_from_byte_share(u2, u8, N_MAX)
    return np.cumsum(1 - rho) / np.arange(1, N_MAX + 1)


def _table1_r(v: dict) -> np.ndarray:
    """r(n) of a Table-1 row: the published n2_r/n8_r where given (linear in n, as the bandwidths),
    else the ratio of the interpolated bandwidths; r(1) = 1 (one token runs the per-slot kernel)."""
    if "r2" in v:
        r = th.interpolate_bandwidth(v["r2"], v["r8"], N_MAX)
    else:
        r = th.interpolate_bandwidth(v["bd2"], v["bd8"], N_MAX) / th.interpolate_bandwidth(v["bs2"], v["bs8"], N_MAX)
    r[0] = 1.0
    return r


def from_bandwidth_table(path: str | Path, engine: str | None = None, model: str | None = None,
                         trace=None, eps: float | None = None, dense_ratio: float = 0.5,
                         draft: DraftTime | None = None, fmt: str | None = None,
                         source_label: str | None = None) -> VerifyCurves:
    """Verify curves from a bandwidth table: paper 1's Table-1 layout (effective bandwidths and ubar
    at n = 2 and 8, interpolated as :mod:`moespec.theory.table1` states; notebook 04's step times)
    or one row per n = 1..9 (``beta_slot_GBps``, ``beta_dedup_GBps``, ``ubar``, as notebook 02's
    ``02_bandwidth_by_n.csv``). ``trace``: a RoutingTrace whose byte share ubar(n) is used instead
    of the table's. m and W come from the model preset (``fmt``: its storage format; default the
    paper's) or the table's ``expert_bytes`` column; D = ``dense_ratio`` m W at the per-slot
    one-token bandwidth. ``eps``: the bandwidth error; for the published rows the paper's eps of
    the engine (labelled as theirs) when not given. ``source_label``: the label of the table's rows
    (``"published"``: paper 1's published numbers), else the rows recognised by their content
    (:mod:`moespec.validate.reference`) or the table's ``source`` column."""

    path = Path(path)
    if not path.exists():
        raise AdviceInputError(f"bandwidth table {path} does not exist")
    head = validate.table_header(path)
    n = np.arange(1, N_MAX + 1)
    assumptions = []
    if "n2_beta_slot_GBps" in head:
        df = read_table1(path, source_label)
        row = _pick_row(df, path, engine, model)
        spec = get_spec(preset_name(str(row["model"])))
        fmt = fmt or ENGINE_FORMAT.get(str(row["engine"])) or spec.default_format
        m, W = spec.top_k, float(spec.total_expert_bytes(fmt))
        beta_slot = th.interpolate_bandwidth(row["n2_beta_slot_GBps"], row["n8_beta_slot_GBps"], N_MAX) * 1e9
        beta_dedup = th.interpolate_bandwidth(row["n2_beta_dedup_GBps"], row["n8_beta_dedup_GBps"], N_MAX) * 1e9
        ubar = _table1_ubar(row["n2_ubar"], row["n8_ubar"])
        source = str(row["source"])
        eng_name, model_name = str(row["engine"]), str(row["model"])
        assumptions.append("bandwidths linear in n through the table's n = 2 and n = 8 values, new-expert "
                           "share geometric in the token index (moespec.theory.table1)")
        cells = pd.read_csv(path, dtype=str, keep_default_na=False).loc[row.name]
        rounded = {"u2": "n2_ubar", "u8": "n8_ubar"}
        published_r = {"n2_r", "n8_r"} <= set(head) and all(str(cells[c]).strip() for c in ("n2_r", "n8_r"))
        rounded.update({"r2": "n2_r", "r8": "n8_r"} if published_r else
                       {"bs2": "n2_beta_slot_GBps", "bs8": "n8_beta_slot_GBps",
                        "bd2": "n2_beta_dedup_GBps", "bd8": "n8_beta_dedup_GBps"})
        values = {k: float(cells[c]) for k, c in rounded.items()}
        halves = {k: _half_unit(cells[c]) for k, c in rounded.items()}
        bad = [rounded[k] for k in ("r2", "r8") if k in values and not (np.isfinite(values[k]) and values[k] > 0)]
        if bad:
            raise AdviceInputError(f"{path}: row ({eng_name}, {model_name}): column(s) {bad} need positive numbers; "
                                   f"found {[cells[c] for c in bad]}")
        r_table = _table1_r(values)
        assumptions.append("bandwidth ratio r(n) for the margin (19): the table's published n2_r, n8_r (linear in n "
                           "between them, as the bandwidths), not the ratio of its rounded bandwidth columns"
                           if published_r else "bandwidth ratio r(n) for the margin (19): the ratio of the table's "
                                               "interpolated bandwidths (it has no r columns)")
    else:
        need = ["n", "beta_slot_GBps", "beta_dedup_GBps"]
        df = validate.read_bandwidth_table(path, need)
        if "source" in df.columns:
            check_rows(df, path, (df["source"] == PAPER1_LABEL).to_numpy(), "column 'source'",
                       "a label of these numbers (paper 1 publishes no per-n table; its Table 1 has n = 2 and 8)",
                       df["source"].tolist(), AdviceInputError)
        if "model" in df.columns and (model or df["model"].nunique() > 1):
            if not model:
                raise AdviceInputError(f"{path}: rows of several models {sorted(df['model'].unique())}; choose one")
            held = sorted(df["model"].astype(str).unique())
            df = df[df["model"].astype(str).str.lower() == model.lower()]
            if df.empty:
                raise AdviceInputError(f"{path}: column 'model': expected rows of --model {model!r}; found rows of "
                                       f"{held} (name one of them, or leave --model out)", where=str(path),
                                       field="model", expected=model, found=held)
        df = df.sort_values("n")
        if list(df["n"]) != list(n):
            raise AdviceInputError(f"{path}: rows cover n = {list(df['n'])}, need one row per n = 1..{N_MAX}")
        beta_slot = finite(df["beta_slot_GBps"], f"{path}: beta_slot_GBps") * 1e9
        beta_dedup = finite(df["beta_dedup_GBps"], f"{path}: beta_dedup_GBps") * 1e9
        cells = pd.read_csv(path, dtype=str, keep_default_na=False).loc[df.index]
        r_table, values, halves, rounded = None, {}, {}, {}
        for key, col in (("bs", "beta_slot_GBps"), ("bd", "beta_dedup_GBps"), ("u", "ubar")):
            if col in cells.columns:
                rounded[key] = col
                values[key] = pd.to_numeric(cells[col], errors="coerce").to_numpy(float)
                halves[key] = np.array([_half_unit(c) for c in cells[col]])
        model_name = model or (str(df["model"].iloc[0]) if "model" in df.columns else None)
        spec, W = _table_shape(df, path, model_name, trace, fmt, assumptions)
        model_name = model_name or spec.name
        m = spec.top_k
        ubar = finite(df["ubar"], f"{path}: ubar") if "ubar" in df.columns else None
        source = str(df["source"].iloc[0]) if "source" in df.columns else f"ours ({path.name})"
        eng_name = engine or (f"moespec {df['backend'].iloc[0]}" if "backend" in df.columns else "as measured")
        fmt = fmt or (str(df["fmt"].iloc[0]) if "fmt" in df.columns else spec.default_format)
    source = source if source_label is None else label_of_rows(source_label)
    theirs = source == PAPER1_LABEL
    if trace is not None:
        validate.check_trace(trace, spec, model_name)

        ubar = byte_share(trace, N_MAX)
        assumptions.append(f"byte share ubar(n) from the given routing trace ({trace.num_layers} layers, "
                           f"m = {trace.top_k})")
    if ubar is None:
        raise AdviceInputError(f"{path}: no ubar column; give a routing trace")
    eps_source = "given (--eps)"
    if eps is None:
        eps = paper1_epsilon().get(eng_name) if theirs else None
        if eps is None:
            raise AdviceInputError(f"{path}: no bandwidth error eps for these rows; give eps")
        assumptions.append(f"eps = {eps} of {eng_name}: paper 1's published value (their hardware)")
        eps_source = f"paper 1's published value for {eng_name}"
    slot, dedup = th.verify_times_from_bandwidths(beta_slot, beta_dedup, ubar, m, W,
                                                  dense_bytes=dense_ratio * m * W, dense_bandwidth=beta_slot[0])
    half = np.asarray(th.saving_bound(eps, slot.expert_time(), dedup.expert_time()), float)
    draft = draft_or_refuse(draft, f"bandwidth table {path}")
    r = th.bandwidth_ratio(dedup.bandwidth, slot.bandwidth) if r_table is None else r_table
    try:
        gap_range = _margin_rounding(values, halves, ubar if trace is not None else None)
    except ValueError as exc:
        raise AdviceInputError(f"{path}: the table's values moved by their rounding leave the model they are read "
                               f"with ({exc})") from None
    assumptions += [f"dense bytes per pass D = {dense_ratio:g} m W (the table has none), read at the per-slot "
                    "one-token bandwidth; t0 = phi = 0", draft_assumption(draft),
                    "host time h(k) = 0: a bandwidth table does not measure it",
                    "margin (19) judged over the table's rounding (each cell +- half a unit of its last printed "
                    "digit): 'within rounding' where that rounding alone can decide it"]
    subject = {"model": model_name, "engine": eng_name, "format": fmt,
               "source": PAPER1_LABEL if theirs else source,
               "from": "paper 1's published Table 1 (their hardware): an illustration, not a measurement of "
                       "this project" if theirs else f"bandwidth table {path.name}"}
    rm = predicted_round({"slot": slot.tau(), "dedup": dedup.tau()},
                         {"slot": slot.memory_time(), "dedup": dedup.memory_time()}, float(eps), half, draft,
                         str(model_name), "bandwidth table", f"bandwidth table {path.name}, bound (17) at eps")
    return VerifyCurves(round_model=rm, interval="band of bound (18) at eps around the saving of these step times",
                        eps=float(eps), subject=subject, inputs=[str(path)], assumptions=assumptions,
                        covers=["verify: bound (17) at eps", f"draft: {draft.term.protocol}",
                                "host: not covered (taken as 0)"],
                        ubar=th.byte_share(dedup.expert_bytes, slot.expert_bytes), r=r, log_gap_range=gap_range,
                        sources={"bandwidth table": f"{path} ({source})", "eps": eps_source,
                                 **({} if trace is None else {"routing trace": str(trace.path or "given")})})


def _table_shape(df: pd.DataFrame, path: Path, model: str | None, trace, fmt: str | None, assumptions: list):
    """(shape, W) of the model a per-n table's rows are of: the N, m, L its columns record (notebooks
    02 and 03 write them), else the preset ``model`` names, else the given trace's own shape (L, N, m
    and its expert bytes, said in ``assumptions``); W = L times the table's expert bytes where it
    has them, else the preset's or the trace's. A trace of another shape is refused by the caller."""
    recorded = {c: df[c].iloc[0] for c in ("N", "m", "L") if c in df.columns}
    spec = validate.routing_shape(recorded if len(recorded) == 3 else None, model) if model or recorded else None
    if spec is None and trace is None:
        raise AdviceInputError(f"{path}: the rows' model {model!r} is not a preset and the table has no columns N, m, "
                               "L: give its routing trace (--trace), whose shape is then used", where=str(path),
                               field="model", found=model)
    if spec is None:
        spec = validate.RoutingShape(trace.model or "the trace's model", trace.num_experts, trace.top_k,
                                     trace.num_layers)
        assumptions.append(f"the model's shape from the routing trace: L = {trace.num_layers} MoE layers, "
                           f"N = {trace.num_experts}, m = {trace.top_k}")
    if "expert_bytes" in df.columns:
        return spec, float(df["expert_bytes"].iloc[0]) * spec.num_moe_layers
    if hasattr(spec, "total_expert_bytes"):
        return spec, float(spec.total_expert_bytes(fmt))
    if trace is not None and np.all(trace.expert_bytes > 1) and spec.num_moe_layers == trace.num_layers:
        assumptions.append("expert bytes W: the routing trace's own per-layer bytes")
        return spec, float(np.sum(trace.expert_bytes))
    raise AdviceInputError(f"{path}: no expert_bytes column, and neither a preset nor the trace gives the model's "
                           "expert bytes (a trace without them counts experts: 1 per expert)", where=str(path),
                           field="expert_bytes")


def _margin_rounding(values: dict, halves: dict, trace_ubar) -> np.ndarray | None:
    """[N_MAX, 2] range of ln r(n) - ln ubar(n) over the rounding of the bandwidth table's cells
    (Table-1 cells: ``u2, u8`` and ``r2, r8`` or the four bandwidths; per-n cells: ``bs, bd, u``);
    a routing trace's ubar has no rounding."""
    def gap_of(v: dict) -> np.ndarray:
        if "u2" in v or "r2" in v or "bs2" in v:  # Table-1 layout
            r = _table1_r(v)
            u = trace_ubar if trace_ubar is not None else _table1_ubar(v["u2"], v["u8"])
        else:
            r = v["bd"] / v["bs"]
            r[0] = 1.0
            u = trace_ubar if trace_ubar is not None else v["u"]
        return np.log(r) - np.log(u)

    values, halves = dict(values), dict(halves)
    if trace_ubar is not None:
        for k in ("u", "u2", "u8"):
            values.pop(k, None), halves.pop(k, None)
    if not values:
        return None
    return _gap_range(gap_of, values, halves)
