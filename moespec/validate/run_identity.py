"""A run is one identity: the stamp a run writes into its files, and the check that files read
together are of one run.

**The stamp.** Every table a notebook writes into the run's figures carries three columns, every
JSON file there a ``run`` object with the same fields (:func:`stamp_frame`, :func:`stamp_doc`):

* ``stamp_run_id`` (``run.id``): the run folder's name (``moespec reproduce``'s ``runs/<time>-<profile>``, its
  ``--out``, a sweep's job folder), the folder ``MOESPEC_RUN_DIR`` names while the notebooks run;
  the same name the run's manifest gives it (``run_dir``);
* ``stamp_machine`` (``run.machine``): the host the run ran on (the manifest's ``host``);
* ``stamp_schema`` (``run.schema``): the version of this stamp (:data:`SCHEMA_VERSION`).

The subject and the machine state are the tables' own ``subject`` and ``state`` columns (the
round models' ``subject`` and ``state`` fields): a machine state's tables carry their state.

**The check.** A reader of several files of one run (the run file's builder, a notebook reading
notebook 05's round models, ``moespec report``) reads each file's :class:`FileIdentity`
(:func:`of_table`, :func:`of_round_models`) and calls :func:`check_one_run`: two files whose
stamps, subjects or states differ, or a file whose stamp differs from the run's manifest, are
refused in one line naming both files, the field and both values.

**Files without a stamp** (the committed ``figures/`` and every run written before the stamps) are
read as files of the run their folder's manifest describes (``MANIFEST.json`` /
``manifest.json``), with the fields they hold: their subject and state are still compared, their
run and machine are the manifest's. A folder without a manifest has no run identity beyond the
stamps its files carry.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from moespec import paths

from .errors import InputError

#: Version of the stamp (the ``stamp_schema`` column, ``run.schema`` of a JSON file).
SCHEMA_VERSION = 1
#: The stamp's columns in a table, in order.
COLUMNS = ("stamp_run_id", "stamp_machine", "stamp_schema")
#: A table's stamp column of each compared field (``run_id``: the run, ``run_machine``: its host).
_COLUMN = {"run_id": "stamp_run_id", "run_machine": "stamp_machine"}
_FIELD = {"run_id": "run id", "run_machine": "machine", "subject": "subject", "state": "machine state"}


@dataclass(frozen=True)
class RunIdentity:
    """Who wrote a file: the run's id (its folder's name) and the machine it ran on."""

    run_id: str
    machine: str

    def columns(self) -> dict:
        return dict(zip(COLUMNS, (self.run_id, self.machine, SCHEMA_VERSION)))

    def record(self) -> dict:
        return {"id": self.run_id, "machine": self.machine, "schema": SCHEMA_VERSION}


def current(run_dir: str | os.PathLike | None = None) -> RunIdentity:
    """The identity of the run this process writes for: the folder ``run_dir`` (default
    :func:`moespec.paths.run_dir`: the one ``MOESPEC_RUN_DIR`` names, else the scratch run folder)
    and this host."""
    return RunIdentity(Path(run_dir or paths.run_dir()).name, socket.gethostname())


def stamp_frame(df: pd.DataFrame, identity: RunIdentity | None = None) -> pd.DataFrame:
    """``df`` with the stamp's columns (:data:`COLUMNS`) set to ``identity`` (default :func:`current`)."""
    return df.assign(**(identity or current()).columns())


def stamp_doc(doc: dict, identity: RunIdentity | None = None) -> dict:
    """``doc`` with the stamp as its ``run`` object."""
    return {**doc, "run": (identity or current()).record()}


# --- reading a file's identity -------------------------------------------------------------------
@dataclass
class FileIdentity:
    """What one file says about the run that wrote it: ``fields`` maps ``run_id``, ``run_machine``,
    ``subject``, ``state`` to the one value the file holds (absent where it holds none), ``names``
    each of them to the file's own field (a column, ``run.id``, ...), for messages."""

    path: Path
    fields: dict = field(default_factory=dict)
    names: dict = field(default_factory=dict)

    def set(self, key: str, value, name: str) -> None:
        self.fields[key], self.names[key] = value, name

    def name(self, key: str) -> str:
        return self.names.get(key, key)

    @property
    def stamped(self) -> bool:
        return "run_id" in self.fields


def _one(values, path: Path, column: str, error) -> str | None:
    """The one value of ``column`` in a file (None where it has none); two values are refused."""
    seen = list(dict.fromkeys(str(v) for v in values if v is not None and not (isinstance(v, float) and v != v)))
    if len(seen) > 1:
        raise error(f"{path}: column {column!r}: expected one {_FIELD.get(column, column)} in the file (a file is of "
                    f"one run); found {seen[:4]}", where=str(path), field=column, expected="one value", found=seen)
    return seen[0] if seen else None


def of_table(df: pd.DataFrame, path: str | os.PathLike, error: type[InputError] = InputError,
             subject_column: str | None = "subject", state: bool = True) -> FileIdentity:
    """The identity a table read from ``path`` holds: its stamp columns, its ``subject`` column
    (``subject_column``; None: the table has rows of several subjects; a table with ``source`` and
    ``model`` columns, Table 3, the ``model`` of its ``this run`` rows) and its ``state`` column
    (``state=False``: a table whose rows span machine states)."""
    path = Path(path)
    out = FileIdentity(path)
    wanted = [(key, column) for key, column in _COLUMN.items() if column in df.columns]
    if subject_column and subject_column in df.columns:
        wanted.append(("subject", subject_column))
    if state and "state" in df.columns:
        wanted.append(("state", "state"))
    for key, column in wanted:
        value = _one(df[column].tolist(), path, column, error)
        if value is not None:
            out.set(key, value, f"column {column!r}")
    if subject_column == "subject" and "subject" not in df.columns and {"source", "model"} <= set(df.columns):
        ours = df.loc[df["source"] == "this run", "model"].tolist()   # a table of this run's rows beside published ones
        value = _one(ours, path, "model", error)
        if value is not None:
            out.set("subject", value, "column 'model' of the rows of this run")
    if "stamp_schema" in df.columns:
        _check_schema(_one(df["stamp_schema"].tolist(), path, "stamp_schema", error), path, "column 'stamp_schema'",
                      error)
    return out


def of_doc(doc: dict, path: str | os.PathLike, error: type[InputError] = InputError) -> FileIdentity:
    """The identity of a JSON file: its ``run`` stamp and its ``subject``."""
    path = Path(path)
    out = FileIdentity(path)
    run = doc.get("run") if isinstance(doc, dict) else None
    if isinstance(run, dict):
        _check_schema(run.get("schema"), path, "field run.schema", error)
        for key, name in (("id", "run_id"), ("machine", "run_machine")):
            if run.get(key) is not None:
                out.set(name, str(run[key]), f"field run.{key}")
    if isinstance(doc, dict) and isinstance(doc.get("subject"), str):
        out.set("subject", doc["subject"], "field subject")
    return out


def of_round_models(doc: dict, path: str | os.PathLike, error: type[InputError] = InputError) -> FileIdentity:
    """The identity of notebook 05's round-model file: its stamp and the one subject of its models
    (every model is of the run's subject; the file holds every machine state, so no state)."""
    out = of_doc(doc, path, error)
    models = doc.get("models") if isinstance(doc, dict) else None
    subjects = [m.get("subject") for m in models if isinstance(m, dict)] if isinstance(models, list) else []
    subject = _one(subjects, Path(path), "subject", error)
    if subject is not None:
        out.set("subject", subject, "field models[].subject")
    return out


def _check_schema(found, path: Path, field_name: str, error) -> None:
    if found is not None and str(found) != str(SCHEMA_VERSION):
        raise error(f"{path}: {field_name}: expected the run stamp of version {SCHEMA_VERSION} (the version this "
                    f"moespec reads); found {found!r}", where=str(path), field=field_name, expected=SCHEMA_VERSION,
                    found=found)


def of_manifest(manifest: dict, path: str | os.PathLike) -> FileIdentity:
    """The run a manifest describes: its folder's name (``run_dir``, else the manifest's own
    folder, its parent for a ``figures/`` folder) and its host."""
    path = Path(path)
    out = FileIdentity(path)
    run_dir = manifest.get("run_dir")
    folder = path.parent.parent if path.parent.name == "figures" and path.name == "manifest.json" else path.parent
    out.set("run_id", Path(run_dir).name if run_dir else folder.name, "the run folder's name (run_dir)")
    host = manifest.get("host") or (manifest.get("hardware") or {}).get("host")
    if host:
        out.set("run_machine", str(host), "field host")
    return out


# --- the check -----------------------------------------------------------------------------------------
def check_one_run(files, manifest: FileIdentity | None = None, error: type[InputError] = InputError,
                  states: bool = True) -> None:
    """Refuse ``files`` (:class:`FileIdentity`) that are not of one run: two stamped files of
    different runs or machines, a stamped file of another run than ``manifest`` (the run folder's
    manifest), two files of different subjects, and (``states``) two files of different machine
    states. A file that lacks a field is not compared on it (files without a stamp are read as
    the manifest's run, module docstring). One line names both files, the field and both values."""
    files = [f for f in files if f is not None]
    for key in ["run_id", "run_machine", "subject"] + (["state"] if states else []):
        holders = [f for f in files if key in f.fields]
        if key in ("run_id", "run_machine") and holders and manifest is not None and key in manifest.fields:
            holders = [manifest] + holders   # a stamped file is of the run its folder's manifest describes
        first = holders[0] if holders else None
        for other in holders[1:]:
            if other.fields[key] != first.fields[key]:
                kind = {"state": "two machine states", "subject": "two subjects"}.get(key, "two runs")
                raise error(f"{other.path}: {other.name(key)}: expected {first.fields[key]!r} (the {_FIELD[key]} of "
                            f"{first.path}, {first.name(key)}); found {other.fields[key]!r}: {first.path.name} and "
                            f"{other.path.name} are of {kind}, not read as one", where=str(other.path), field=key,
                            expected=first.fields[key], found=other.fields[key])


def check_state(identity: FileIdentity, state: str, error: type[InputError] = InputError) -> None:
    """Refuse a table of machine state ``state`` (by its name, e.g. ``06_epsilon_loaded.csv``)
    whose own ``state`` column says another."""
    found = identity.fields.get("state")
    if found is not None and found != state:
        raise error(f"{identity.path}: column 'state': expected {state!r} (the machine state the file's name gives "
                    f"it); found {found!r}: a table of another machine state under this name", where=str(identity.path),
                    field="state", expected=state, found=found)


def of_file(path: str | os.PathLike, error: type[InputError] = InputError, state: bool = True) -> FileIdentity:
    """The identity of a run's file by its kind: a CSV table (:func:`of_table`), the round-model
    file (:func:`of_round_models`) or another JSON document (:func:`of_doc`)."""
    import json

    path = Path(path)
    if path.suffix == ".csv":
        from .tables import parse_csv

        return of_table(parse_csv(path, "a run's table", error), path, error, state=state)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise error(f"{path}: not a readable JSON file ({exc})", where=str(path)) from None
    return of_round_models(doc, path, error) if isinstance(doc, dict) and "models" in doc else of_doc(doc, path, error)


def check_of_this_run(files, error: type[InputError] = InputError, run_dir: str | os.PathLike | None = None) -> None:
    """Refuse files stamped by another run or machine than the one this process writes for
    (:func:`current`): what a notebook reads of its run's earlier notebooks."""
    me = current(run_dir)
    run = FileIdentity(Path(run_dir or paths.run_dir()), {"run_id": me.run_id, "run_machine": me.machine},
                       {"run_id": "the run folder this process writes for", "run_machine": "this host"})
    check_one_run(files, run, error, states=False)


def check_run_folder(files, manifest_path: str | os.PathLike | None = None, error: type[InputError] = InputError,
                     states: dict | None = None) -> None:
    """Refuse ``files`` (paths of one run's tables and JSON files, read together) that are not of
    one run, or not of the run ``manifest_path`` describes (:func:`check_one_run`); ``states``
    maps a file of one machine state to that state (:func:`check_state`). Tables whose rows span
    machine states are compared on run, machine and subject only."""
    import json

    states = {Path(k): v for k, v in (states or {}).items()}
    identities = []
    for path in map(Path, files):
        identity = of_file(path, error, state=path in states)
        if path in states:
            check_state(identity, states[path], error)
        identities.append(identity)
    manifest = None
    if manifest_path is not None:
        try:
            manifest = of_manifest(json.loads(Path(manifest_path).read_text()), manifest_path)
        except (OSError, ValueError) as exc:
            raise error(f"{manifest_path}: not a readable run manifest ({exc})", where=str(manifest_path)) from None
    check_one_run(identities, manifest, error, states=False)


#: Tables written once per machine state: ``<family>.csv`` is the quiet machine's,
#: ``<family>_<state>.csv`` another state's (notebook 06).
STATE_FAMILIES = ("06_curves", "06_epsilon", "06_fits")


def state_of_name(name: str) -> str | None:
    """The machine state a per-state table's file name gives it (:data:`STATE_FAMILIES`), else None."""
    stem = Path(name).stem
    for family in STATE_FAMILIES:
        if stem == family:
            return "quiet"
        if stem.startswith(family + "_"):
            return stem[len(family) + 1:]
    return None


def check_table_of_run(df: pd.DataFrame, path: str | os.PathLike, manifest_path: str | os.PathLike | None,
                       error: type[InputError] = InputError) -> None:
    """One table of a run folder read on its own (``moespec report``): its stamp must be the run's
    that ``manifest_path`` describes, and a per-state table must hold the state its name gives."""
    import json

    path = Path(path)
    state = state_of_name(path.name)
    identity = of_table(df, path, error, subject_column=None, state=state is not None)
    if state is not None:
        check_state(identity, state, error)
    manifest = None
    if manifest_path is not None and identity.stamped:
        manifest = of_manifest(json.loads(Path(manifest_path).read_text()), manifest_path)
    check_one_run([identity], manifest, error, states=False)
