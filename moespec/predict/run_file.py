"""The run file: one schema'd JSON document (:data:`RUN_FILE`) with everything ``moespec advise``
needs from a run, so that the answer reads that file and nothing else of the run.

It holds the run's identity (id, status, hardware), the subject (model, engine, storage format),
the round models of notebook 05 as ``05_round_model.json`` holds them (every term with its
interval, per machine state, context and draft), the machine states (read bandwidth and the
engine's bandwidth error eps per state), the acceptance the real-draft runs measured (per state
and per prompt, and their per-position acceptance profile: per prompt and draft length k the verify
steps and the steps that accepted at least i drafts, or, for a run that predates that table, the
measured tokens per step of its runs at each k) and their measured speedup and tokens per step at
every k; a run without notebook
05 holds notebook 03's fits of the expert operation instead of round models. ``sources`` names,
once per part, the notebook and files it was built from.

:func:`build_run_file` assembles it from the tables a run already writes (:data:`SOURCE_FILES`),
:func:`write_run_file` writes it beside them (checked against :data:`RUN_FILE_SCHEMA` first), and
:func:`read_run_file` reads it back, checked the same way; a file of another ``schema_version``
is refused naming the version this package reads. Building from the same tables gives the same
file (no time stamp of its own), so a rebuilt file can be compared with a committed one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import io
from moespec.acceptance import AcceptanceProfile
from moespec.acceptance import runs as acceptance_runs
from moespec.validate import invariants, jsonfile, run_identity, runs
from moespec.validate.errors import InputError
from moespec.validate.tables import Column, read_csv

from .calibration import ORACLE_DRAFT, draft_name
from .round_model import SCHEMA_ID as ROUND_MODEL_SCHEMA
from .round_model import RoundModel, RoundModelError, RoundModels

RUN_FILE = "moespec_run.json"
SCHEMA_ID = "moespec.run_file"
SCHEMA_VERSION = 2
MAKE_IT = "make it with `moespec run-file {run}` (or run notebook 08 on the run)"


class RunFileError(InputError):
    """A run file, or a table it is built from, is missing or malformed; the message names it."""


# --- the tables a run writes, by the part of the run file they fill ----------------------------
_POS = dict(low=0, low_open=True)
# a = 1 (the median prompt accepted every draft) is data: the pooled rate decides (moespec.advice.measured)
_ACCEPTANCE = (Column("state", "str"), Column("a", low=0, high=1), Column("label", "str"),
               Column("a_pooled", low=0, high=1, required=False), Column("prompts", "count", required=False),
               Column("accepted_total", "count", required=False), Column("rejections_total", "count", required=False),
               Column("k_max", "count", required=False))
_BY_PROMPT = (Column("state", "str"), Column("prompt", "str"), Column("accepted", "count"),
              Column("rejections", "count"), Column("a", low=0, high=1, required=False))
_MEASURED = (Column("state", "str"), Column("draft_cost", low=0), Column("k", "int", low=1), Column("measured", **_POS),
             Column("tokens_per_step", low=1, required=False), Column("measured_q25", required=False, missing_ok=True),
             Column("measured_q75", required=False, missing_ok=True))
_FITS = (Column("model", "str"), Column("layer", "int", low=0), Column("kernel", "str", choices=("slot", "dedup")),
         *(Column(c, missing_ok=True) for c in ("t_op", "c_u", "c_g", "c_t", "c_re")),
         Column("n_passes", "count", required=False), Column("backend", "str", required=False),
         Column("fmt", "str", required=False))
_BANDWIDTH = (Column("model", "str"), Column("n", "int", low=1), Column("ubar"), Column("expert_bytes", **_POS),
              Column("read_GBps", low=0, low_open=True, required=False, missing_ok=True),
              *(Column(c, "int", low=1, required=False) for c in ("N", "m", "L")))
_EPS = (Column("eps_engine", low=0),)

#: Part of the run file -> (files, what it is). The one place that names the run's tables; a
#: table's name begins with the number of the notebook that writes it.
SOURCE_FILES = {
    "round_models": (("05_round_model.json",),
                     "round models: every term of a round timed in decode loops, per state, context and draft"),
    "eps": (("06_epsilon.csv", "06_epsilon_{state}.csv"), "the engine's bandwidth error eps, per state"),
    "subject": (("06_table3_predictions.csv", "06_fits.csv", "05_round_terms.csv"),
                "model, engine and storage format"),
    "acceptance": (("05_real_draft_acceptance.csv", "05_real_draft_acceptance_by_prompt.csv",
                    acceptance_runs.PROFILE_FILE),
                   "acceptance of the real-draft runs, per state and prompt, and their per-position profile"),
    "measured": (("05_draft_cost_predictions.csv",),
                 "measured speedup and tokens per step of the real-draft runs at every k"),
    "expert_op_fits": (("03_fit_coefficients.csv", "03_epsilon.csv", "03_bandwidth_all_models.csv"),
                       "fits (4)/(E.1) of the expert operation, its eps and byte shares"),
}
ROUND_MODEL_FILE = SOURCE_FILES["round_models"][0][0]
FITS_FILE = SOURCE_FILES["expert_op_fits"][0][0]

# --- the schema ------------------------------------------------------------------------------------
_STR = {"type": "string"}
_STR_OR_NULL = {"type": ["string", "null"]}
_NUM_OR_NULL = {"type": ["number", "null"]}
_COUNT = {"type": "integer", "minimum": 0}
_SHARE = {"type": "number", "minimum": 0, "maximum": 1}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}


def _object(required: dict, optional: dict | None = None) -> dict:
    return {"type": "object", "required": list(required), "properties": {**required, **(optional or {})}}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


_SOURCE = _object({"by": _STR, "files": {"type": "array", "items": _STR, "minItems": 1}, "what": _STR})
# one round model as 05_round_model.json holds it (RoundModel.to_dict): every field typed, times in ms
_NUMS = {"type": "array", "minItems": 1, "items": {"type": "number"}}
_TERM = _object({"values_ms": _NUMS, "lo_ms": _NUMS, "hi_ms": _NUMS, "runs": {"type": "array", "items": _COUNT},
                 "source": _STR, "protocol": _STR})
_NUM_NULL_OR_ABSENT = {"type": ["number", "null"]}
ROUND_MODEL_ITEM = _object(
    {"subject": _STR, "context": _STR, "state": _STR, "verify": _object({"slot": _TERM, "dedup": _TERM}),
     "host": _TERM, "draft": _object({"name": _STR, "term": _TERM}, {
         "a_ms_per_token": _NUM_NULL_OR_ABSENT, "b_ms_per_round": _NUM_NULL_OR_ABSENT,
         "one_token_ms": _NUM_NULL_OR_ABSENT, "catch_up_ms": _NUM_NULL_OR_ABSENT,
         "catch_up_share": _nullable({"type": "array", "items": _SHARE})})},
    {"depth": _NUM_NULL_OR_ABSENT, "regime": _STR, "read_GBps": _NUM_NULL_OR_ABSENT, "saving": _nullable(_TERM),
     "notes": {"type": "object"}, "routing": _nullable(_object({"s_per_expert": {"type": "number"}, "distinct": _NUMS,
                                                              "runs": {"type": "integer", "minimum": 0},
                                                              "source": _STR}))})
_ROUND_MODELS = _object({"schema": {"const": ROUND_MODEL_SCHEMA}, "order": {"type": "object"},
                         "models": {"type": "array", "minItems": 1, "items": {"type": "object"}}})
_STATE = _object({"state": _STR, "read_GBps": _nullable(_POSITIVE), "regime": _STR_OR_NULL,
                  "eps": _nullable({"type": "number", "minimum": 0})})
_PROMPT = _object({"prompt": _STR, "accepted": _COUNT, "rejections": _COUNT}, {"a": _SHARE})
_PROFILE = _object({"source": _STR,
                    "runs": {"type": "array", "items": _object(
                        {"k": {"type": "integer", "minimum": 1}, "prompt": _STR, "steps": _COUNT,
                         "at_least": {"type": "array", "items": _COUNT, "minItems": 1}})},
                    "tokens_per_step": {"type": "array", "items": _object(
                        {"k": {"type": "integer", "minimum": 1},
                         "tokens_per_step": {"type": "number", "minimum": 1}})}})
_ACCEPTED = _object({"state": _STR, "a": _SHARE, "label": _STR,
                     "by_prompt": {"type": "array", "items": _PROMPT}},
                    {"a_pooled": _SHARE, "prompts": _COUNT, "accepted_total": _COUNT, "rejections_total": _COUNT,
                     "k_max": _COUNT, "profile": _nullable(_PROFILE)})
_MEASURED_ROW = _object({"state": _STR, "draft": _STR, "draft_cost": {"type": "number", "minimum": 0},
                         "k": {"type": "integer", "minimum": 1}, "speedup": _POSITIVE},
                        {"tokens_per_step": _NUM_OR_NULL, "speedup_q25": _NUM_OR_NULL, "speedup_q75": _NUM_OR_NULL,
                         "speedup_by_rep": {"type": "array", "items": _POSITIVE}})
_FITS_PART = _object({"model": _STR, "backend": _STR_OR_NULL, "fmt": _STR_OR_NULL,
                      "eps": {"type": "number", "minimum": 0},
                      "fits": {"type": "array", "minItems": 2, "items": _object(
                          {"layer": _COUNT, "kernel": {"enum": ["slot", "dedup"]}},
                          {c: _NUM_OR_NULL for c in ("t_op", "c_u", "c_g", "c_t", "c_re", "n_passes")})},
                      "bandwidth": {"type": "array", "minItems": 1, "items": _object(
                          {"n": {"type": "integer", "minimum": 1}, "ubar": _SHARE, "expert_bytes": _POSITIVE},
                          {"read_GBps": _NUM_OR_NULL})}},
                     {"shape": _object({k: {"type": "integer", "minimum": 1} for k in ("N", "m", "L")})})

#: JSON Schema (draft 2020-12) of the run file; checked when it is written and when it is read.
RUN_FILE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": f"{SCHEMA_ID}/{SCHEMA_VERSION}",
    "title": "moespec run file: what moespec advise reads from a run",
    "type": "object",
    "required": ["schema", "schema_version", "run", "hardware", "subject", "sources", "round_models",
                 "expert_op_fits", "machine_states", "acceptance", "measured"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "schema_version": {"const": SCHEMA_VERSION},
        "run": _object({"id": _STR, "status": _STR, "complete": {"type": "boolean"}, "described": _STR,
                        "finished_notebooks": {"type": "array", "items": _STR}, "manifest": _STR_OR_NULL},
                       {"started": _STR_OR_NULL, "git_commit": _STR_OR_NULL, "profile": _STR_OR_NULL}),
        "hardware": _nullable(_object({"text": _STR})),
        "subject": _object({"model": _STR_OR_NULL, "engine": _STR_OR_NULL, "format": _STR_OR_NULL}),
        "sources": {"type": "object", "additionalProperties": _SOURCE},
        "round_models": _nullable(_ROUND_MODELS),
        "expert_op_fits": _nullable(_FITS_PART),
        "machine_states": {"type": "array", "items": _STATE},
        "acceptance": {"type": "array", "items": _ACCEPTED},
        "measured": {"type": "array", "items": _MEASURED_ROW},
    },
    "anyOf": [{"properties": {"round_models": _ROUND_MODELS}}, {"properties": {"expert_op_fits": _FITS_PART}}],
}


# --- where a run's tables and its run file are -------------------------------------------------------
def outputs_folder(run: str | Path, error: type[InputError] = RunFileError) -> Path:
    """The folder that holds a run's tables: the run folder itself or its ``figures/`` sub-folder
    (the first with notebook 05's round models or notebook 03's fits)."""
    run = Path(run)
    if not run.is_dir():
        raise error(f"run folder {run} does not exist or is not a folder", where=str(run))
    for folder in (run, run / "figures"):
        if (folder / ROUND_MODEL_FILE).is_file() or (folder / FITS_FILE).is_file():
            return folder
    raise error(f"{run}: no {ROUND_MODEL_FILE} (notebook 05) or {FITS_FILE} (notebook 03) in {run} or "
                f"{run / 'figures'}: run notebook 05 (or 03) first", where=str(run), field=ROUND_MODEL_FILE)


def find_run_file(run: str | Path, error: type[InputError] = RunFileError) -> Path:
    """The run file of ``run``: ``run`` itself when it is a file, else :data:`RUN_FILE` in the run
    folder or its ``figures/``; refused in one line naming the file and how to make it."""
    run = Path(run)
    if run.is_file():
        return run
    if not run.is_dir():
        raise error(f"run folder {run} does not exist or is not a folder", where=str(run))
    for folder in (run, run / "figures"):
        if (folder / RUN_FILE).is_file():
            return folder / RUN_FILE
    raise error(f"{run}: no run file {RUN_FILE} (looked in {run} and {run / 'figures'}); "
                + MAKE_IT.format(run=run), where=str(run), field=RUN_FILE)


# --- building ----------------------------------------------------------------------------------------
def _source(part: str, files) -> dict:
    names = [Path(f).name for f in files]
    numbers = sorted({name.split("_", 1)[0] for name in names})
    by = f"notebook {numbers[0]}" if len(numbers) == 1 else f"notebooks {', '.join(numbers)}"
    return {"by": by, "files": names, "what": SOURCE_FILES[part][1]}


def _number(x):
    """A cell as JSON: None for NaN, a Python int or float otherwise."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    if isinstance(x, (np.integer, int)) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return None if math.isnan(float(x)) else float(x)
    return x


def _records(df: pd.DataFrame, columns) -> list[dict]:
    keep = [c for c in columns if c in df.columns]
    return [{c: _number(v) for c, v in zip(keep, row)} for row in df[keep].itertuples(index=False)]


def _manifest_part(run: Path, folder: Path, allow_incomplete: bool, error) -> tuple[dict, dict | None]:
    path = runs.find_manifest(run) or runs.find_manifest(folder)
    man = runs.read_manifest(path, error) if path is not None else {}
    status = runs.status_from(man, path) if path is not None else runs.RunStatus(None, "unknown")
    if not (status.complete or status.own or allow_incomplete):
        runs.refuse_incomplete(status, "moespec run-file", error)
    run_dir = man.get("run_dir")
    part = {"id": Path(run_dir).name if run_dir else run.resolve().name, "status": status.status,
            "complete": bool(status.complete or status.own), "described": status.describe(),
            "finished_notebooks": list(status.finished), "manifest": path.name if path is not None else None,
            "started": man.get("started"), "git_commit": man.get("git_commit"), "profile": man.get("profile")}
    if path is None:
        return part, None
    hw = man.get("hardware") or {}
    cpu, gpus = hw.get("cpu") or {}, hw.get("gpus") or []
    text = ", ".join(filter(None, [cpu.get("cpu_model"),
                                   f"{cpu.get('logical_cpus')} CPUs" if cpu.get("logical_cpus") else "",
                                   "; ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in gpus)]))
    return part, {"text": text or "unknown"}


def _round_models(folder: Path, error) -> dict:
    """``05_round_model.json`` as written (its numbers unchanged), each model checked by
    :meth:`RoundModel.from_dict`."""
    path = folder / ROUND_MODEL_FILE
    doc = jsonfile.load(path, "round-model file", error)
    if not isinstance(doc, dict) or doc.get("schema") != ROUND_MODEL_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise error(f"{path}: field schema: expected {ROUND_MODEL_SCHEMA!r}; found {found!r}", where=str(path),
                    field="schema", expected=ROUND_MODEL_SCHEMA, found=found)
    _parse_models(doc, str(path), error)
    return {"schema": doc["schema"], "order": dict(doc.get("order") or {}), "models": doc.get("models")}


def _parse_models(part: dict, where: str, error) -> RoundModels:
    models = part.get("models")
    if not isinstance(models, list) or not models:
        raise error(f"{where}: field models: expected a list of at least 1 round model; found {models!r:.60}",
                    where=where, field="models")
    jsonfile.check({"models": models}, {"type": "object", "properties": {"models": {"type": "array",
                                                                                 "items": ROUND_MODEL_ITEM}}},
                   where, error)   # every field named where it is not what RoundModel reads
    out = []
    for i, m in enumerate(models):
        try:
            out.append(RoundModel.from_dict(m))
        except (RoundModelError, KeyError, TypeError, ValueError) as err:
            raise error(f"{where}: field models[{i}]: expected a round model; found one that does not read ({err})",
                        where=where, field=f"models[{i}]") from None
        gbps = out[-1].read_GBps   # the machine state's read bandwidth, in the file's unit
        if gbps is not None and not (isinstance(gbps, (int, float)) and math.isfinite(gbps) and gbps > 0):
            raise error(f"{where}: field models[{i}].read_GBps: expected a read bandwidth > 0 GB/s (or null); found "
                        f"{gbps!r} GB/s", where=where, field=f"models[{i}].read_GBps", expected="> 0", found=gbps)
    return RoundModels(out, dict(part.get("order") or {}))


def default_round(models: RoundModels, state: str | None = None, context: str | None = None,
                  draft: str | None = None) -> tuple[str, str, str]:
    """The (state, context, draft) advise decides on unless told otherwise: the quiet machine, the
    real draft's prompts (``chat``, else the shallowest depth) and the draft as trained (else the
    oracle draft)."""
    states = models.states
    state = state or ("quiet" if "quiet" in states else states[0])
    contexts = list(dict.fromkeys(m.context for m in models.select(state=state)))
    if context is None and contexts:
        context = "chat" if "chat" in contexts else min((c for c in contexts if c.startswith("d=")),
                                                         key=lambda c: int(c[2:]), default=contexts[0])
    if draft is None:
        names = [m.draft.name for m in models.select(state=state, context=context)]
        draft = draft_name(0.0) if draft_name(0.0) in names else (ORACLE_DRAFT if ORACLE_DRAFT in names or not names
                                                                    else names[0])
    return state, context, draft


def _eps_path(folder: Path, state: str) -> Path:
    return folder / ("06_epsilon.csv" if state == "quiet" else f"06_epsilon_{state}.csv")


def _first(path: Path, columns, what: str, error, column: str):
    return read_csv(path, columns, what, error)[column].iloc[0]


def _subject(folder: Path, error) -> tuple[dict, list]:
    """Model and engine from notebook 06's Table 3; the storage format from its fits, else from
    notebook 05's round terms (the kernels' format notebook 05 ran, where notebook 06 did not run)."""
    t3, fits, terms = (folder / f for f in SOURCE_FILES["subject"][0])
    subject, used = {"model": None, "engine": None, "format": None}, []
    if fits.is_file():
        subject["format"] = str(_first(fits, (Column("fmt", "str"),), "notebook 06's fits", error, "fmt"))
        used.append(fits)
    elif terms.is_file():
        rows = read_csv(terms, (Column("fmt", "str", required=False, missing_ok=True),), "notebook 05's round terms",
                        error)
        fmts = [v for v in rows.get("fmt", []) if isinstance(v, str) and v]
        if fmts:
            subject["format"] = fmts[0]
            used.append(terms)
    if t3.is_file():
        rows = read_csv(t3, (Column("model", "str", missing_ok=True), Column("engine", "str", missing_ok=True),
                             Column("source", "str")), "notebook 06's Table 3", error)
        ours = rows[rows["source"] == "this run"]
        if not ours.empty:
            subject["model"], subject["engine"] = str(ours["model"].iloc[0]), str(ours["engine"].iloc[0])
        used.append(t3)
    return subject, used


def _profile(state: str, table: pd.DataFrame | None, measured: list, where: str) -> dict | None:
    """The per-position profile of ``state``: the runs' counts (notebook 05's profile table), else
    the measured tokens per step of the draft as trained at each k (a run that predates the table)."""
    if table is not None:
        return acceptance_runs.to_doc(rows=acceptance_runs.rows_of_table(table, state, where))
    own = [r for r in measured if r["state"] == state and r.get("tokens_per_step") is not None]
    if not own:
        return None
    cost = min(r["draft_cost"] for r in own)
    tokens = {r["k"]: r["tokens_per_step"] for r in own if r["draft_cost"] == cost}
    source = (f"{acceptance_runs.SOURCE}: the median prompt's measured tokens per step at each draft length k "
              f"({SOURCE_FILES['measured'][0][0]}); no per-position counts in this run")
    return acceptance_runs.to_doc(tokens=tokens, source=source)


def _acceptance(folder: Path, measured: list, error) -> tuple[list, list]:
    path, by_path, profile_path = (folder / f for f in SOURCE_FILES["acceptance"][0])
    if not path.is_file():
        return [], []
    table = read_csv(path, _ACCEPTANCE, "the real-draft runs' acceptance", error)
    prompts = (read_csv(by_path, _BY_PROMPT, "the real-draft runs' acceptance per prompt", error, dtype={"prompt": str})
               if by_path.is_file() else None)
    profiles = acceptance_runs.read_table(profile_path, error) if profile_path.is_file() else None
    out = []
    for row in _records(table, [c.name for c in _ACCEPTANCE]):
        mine = prompts[prompts["state"] == row["state"]] if prompts is not None else prompts
        row["by_prompt"] = [] if mine is None else _records(mine, ["prompt", "accepted", "rejections", "a"])
        row["profile"] = _profile(row["state"], profiles, measured, str(profile_path))
        out.append(row)
    return out, [path] + [p for p, t in ((by_path, prompts), (profile_path, profiles)) if t is not None]


def _measured(folder: Path, error) -> tuple[list, list]:
    path = folder / SOURCE_FILES["measured"][0][0]
    if not path.is_file():
        return [], []
    table = read_csv(path, _MEASURED, "the real-draft runs' measured speedups", error)
    reps = sorted((c for c in table.columns if c.startswith("rep") and c[3:].isdigit()), key=lambda c: int(c[3:]))
    rows = _records(table, ["state", "draft_cost", "k", "measured", "tokens_per_step", "measured_q25", "measured_q75",
                            *reps])
    return [{"state": r["state"], "draft": draft_name(r["draft_cost"]), "draft_cost": r["draft_cost"], "k": r["k"],
             "speedup": r["measured"], "tokens_per_step": r.get("tokens_per_step"),
             "speedup_q25": r.get("measured_q25"), "speedup_q75": r.get("measured_q75"),
             "speedup_by_rep": [r[c] for c in reps if r[c] is not None]} for r in rows], [path]


def _expert_op_fits(folder: Path, error) -> dict:
    fits_path, eps_path, bw_path = (folder / f for f in SOURCE_FILES["expert_op_fits"][0])
    fits = read_csv(fits_path, _FITS, "notebook 03's fits", error)
    eps = float(_first(eps_path, _EPS, "notebook 03's eps", error, "eps_engine"))
    bw = read_csv(bw_path, _BANDWIDTH, "notebook 03's bandwidths", error)
    invariants.check_byte_share_rows(bw, bw_path, "n", "ubar", error=error)
    model = str(fits["model"].iloc[0])
    main = bw[bw["model"] == model].sort_values("n")
    if main.empty:
        raise error(f"{bw_path}: column 'model': expected rows of {model!r} (the model of {fits_path.name}); "
                    f"found {sorted(set(bw['model']))}", where=str(bw_path), field="model")
    first = fits.iloc[0]
    # the benchmarked model's routing shape, where the table carries it (the model is never looked up by name)
    shape = {c: int(main[c].iloc[0]) for c in ("N", "m", "L")} if {"N", "m", "L"} <= set(main.columns) else None
    return {"model": model, "backend": str(first["backend"]) if "backend" in fits else None,
            "fmt": str(first["fmt"]) if "fmt" in fits else None, "eps": eps,
            "fits": _records(fits, ["layer", "kernel", "t_op", "c_u", "c_g", "c_t", "c_re", "n_passes"]),
            "bandwidth": _records(main, ["n", "ubar", "expert_bytes", "read_GBps"]),
            **({"shape": shape} if shape else {})}


def build_run_file(run: str | Path, allow_incomplete: bool = False, error: type[InputError] = RunFileError) -> dict:
    """The run file of ``run`` (a run folder, its ``figures/`` or the committed ``figures/``),
    assembled from the tables the run wrote (:data:`SOURCE_FILES`) and its manifest. A run that did
    not finish is refused unless ``allow_incomplete`` (the file then says so) or the caller is the
    run's own notebook. Checked against :data:`RUN_FILE_SCHEMA`."""
    run = Path(run)
    folder = outputs_folder(run, error)
    run_part, hardware = _manifest_part(run, folder, allow_incomplete, error)
    sources, states = {}, []
    round_models = fits = None
    if (folder / ROUND_MODEL_FILE).is_file():
        round_models = _round_models(folder, error)
        sources["round_models"] = _source("round_models", [ROUND_MODEL_FILE])
        models = _parse_models(round_models, str(folder / ROUND_MODEL_FILE), error)
        eps_files = []
        for state in models.states:
            rm = models.get(*default_round(models, state))
            eps = None
            if _eps_path(folder, state).is_file():
                eps = float(_first(_eps_path(folder, state), _EPS, "the engine's eps", error, "eps_engine"))
                eps_files.append(_eps_path(folder, state))
            states.append({"state": state, "read_GBps": rm.read_GBps, "regime": rm.regime, "eps": eps})
        if eps_files:
            sources["eps"] = _source("eps", eps_files)
    else:
        fits = _expert_op_fits(folder, error)
        sources["expert_op_fits"] = _source("expert_op_fits", SOURCE_FILES["expert_op_fits"][0])
    subject, used = _subject(folder, error)
    measured, meas_files = _measured(folder, error)
    acceptance, acc_files = _acceptance(folder, measured, error)
    for part, files in (("subject", used), ("acceptance", acc_files), ("measured", meas_files)):
        if files:
            sources[part] = _source(part, files)
    if run_part["manifest"]:
        sources["run"] = {"by": "moespec reproduce", "files": [run_part["manifest"]],
                          "what": "the run's id, status and hardware"}
    read = [folder / f for part, s in sources.items() if part != "run" for f in s["files"]]
    run_identity.check_run_folder(read, runs.find_manifest(run) or runs.find_manifest(folder), error,
                                  states={_eps_path(folder, s["state"]): s["state"] for s in states})
    doc = {"schema": SCHEMA_ID, "schema_version": SCHEMA_VERSION, "run": run_part, "hardware": hardware,
           "subject": subject, "sources": sources, "round_models": round_models, "expert_op_fits": fits,
           "machine_states": states, "acceptance": acceptance, "measured": measured}
    return check_run_file(doc, str(folder / RUN_FILE), error)


def write_run_file(run: str | Path, allow_incomplete: bool = False, error: type[InputError] = RunFileError) -> Path:
    """Build the run file of ``run`` and write it (atomically) beside the tables it was built from."""
    doc = build_run_file(run, allow_incomplete, error)
    return io.write_json(outputs_folder(run, error) / RUN_FILE, doc)


def ensure_run_file(run: str | Path, rebuild: bool = False, error: type[InputError] = RunFileError) -> Path:
    """The run file of ``run``: the one there, or (when there is none, or ``rebuild``) built from the
    run's tables and written beside them."""
    if not rebuild:
        try:
            return find_run_file(run, error)
        except InputError:
            pass
    return write_run_file(run, error=error)


# --- reading -----------------------------------------------------------------------------------------
def check_run_file(doc, where: str, error: type[InputError] = RunFileError) -> dict:
    """``doc`` checked: its schema and version first (an older file is refused naming the version
    this package reads), then :data:`RUN_FILE_SCHEMA`, then every round model."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA_ID:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise error(f"{where}: field schema: expected {SCHEMA_ID!r} (a moespec run file); found {found!r}",
                    where=where, field="schema", expected=SCHEMA_ID, found=found)
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise error(f"{where}: field schema_version: expected {SCHEMA_VERSION} (the version this moespec reads); "
                    f"found {version!r}; rebuild it from the run's tables with `moespec run-file RUN`",
                    where=where, field="schema_version", expected=SCHEMA_VERSION, found=version)
    jsonfile.check(doc, RUN_FILE_SCHEMA, where, error)
    if doc["round_models"] is not None:
        _parse_models(doc["round_models"], f"{where}: round_models", error)
    return doc


@dataclass
class RunFile:
    """A run file as read: ``path`` and the checked document ``doc``, with typed views of its parts."""

    path: Path
    doc: dict

    @property
    def round_models(self) -> RoundModels | None:
        part = self.doc["round_models"]
        return None if part is None else _parse_models(part, str(self.path), RunFileError)

    @property
    def states(self) -> list[str]:
        return [s["state"] for s in self.doc["machine_states"]]

    def eps(self, state: str) -> float | None:
        """The engine's bandwidth error eps in machine ``state`` (None where the run has none)."""
        return next((s["eps"] for s in self.doc["machine_states"] if s["state"] == state), None)

    def source_line(self, part: str) -> str:
        """``notebook 05 (05_round_model.json)``: where ``part`` came from, in a few words."""
        s = self.doc["sources"].get(part)
        return f"{s['by']} ({', '.join(s['files'])})" if s else "not in this run"

    def acceptance(self) -> pd.DataFrame:
        """Per machine state, the measured acceptance ``a`` (median prompt's) and its label."""
        rows = [{k: v for k, v in part.items() if k != "by_prompt"} for part in self.doc["acceptance"]]
        return pd.DataFrame(rows, columns=None if rows else ["state", "a", "label"])

    def acceptance_profile(self, state: str) -> AcceptanceProfile | None:
        """The per-position acceptance profile of the real-draft runs in machine ``state`` (None
        where the run file holds none)."""
        part = next((a for a in self.doc["acceptance"] if a["state"] == state), None)
        if part is None or not part.get("profile"):
            return None
        return acceptance_runs.from_doc(part["profile"], f"{self.path}: acceptance.{state}.profile", state)

    def measured(self) -> pd.DataFrame:
        """Per state, draft and k: the measured median speedup and tokens per step."""
        rows = self.doc["measured"]
        return pd.DataFrame(rows, columns=None if rows else ["state", "draft", "draft_cost", "k", "speedup"])


def read_run_file(run: str | Path, error: type[InputError] = RunFileError) -> RunFile:
    """The run file of ``run`` (:func:`find_run_file`), checked (:func:`check_run_file`)."""
    path = find_run_file(run, error)
    doc = check_run_file(jsonfile.load(path, "run file", error), str(path), error)
    manifest = runs.find_manifest(path.parent)
    if manifest is not None and doc["run"]["manifest"] is not None:   # not a run file copied from another run
        mine = run_identity.of_manifest(runs.read_manifest(manifest, error), manifest)
        stamp = run_identity.FileIdentity(path, {"run_id": doc["run"]["id"]}, {"run_id": "field run.id"})
        run_identity.check_one_run([stamp], mine, error)
    return RunFile(path, doc)
