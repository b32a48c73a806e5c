"""Grids of notebook runs on an existing scheduler: the engine behind ``moespec sweep GRID``.

A grid names notebooks and parameter values; every (notebook, parameters) pair is one job,
executed by :func:`moespec.runner.run_notebook` (papermill) on a Dask cluster (a
``LocalCluster`` on this machine by default, or the scheduler at an address) or on Slurm through
submitit (its local executor runs the same jobs as subprocesses here). Each job has its own
folder ``<sweep>/jobs/<job id>/`` holding the executed notebook, the figures and tables it wrote
(``MOESPEC_RUN_DIR`` points at the job folder while it runs, so ``paths.figures_dir()`` and
``paths.run_data_dir()`` are inside it), a folder for a notebook's ``out_dir``
parameter when it declares one, and ``manifest.json`` (parameters, status, wall time, the
worker's hardware and package versions). A rerun skips the jobs whose manifest says finished
with the same parameters; a failing job is reported with its notebook and cell while the others
go on. At the end the CSV tables of the finished jobs are merged, one table per notebook output,
into ``<sweep>/tables/`` with a column per job parameter, and ``<sweep>/sweep.json`` lists every
job.

Grid file (TOML or JSON)::

    [parameters]             # every job whose notebook declares them
    profile = "quick"

    [[jobs]]
    notebook = "01"          # a name as in ``moespec reproduce --only``, or a list of them
    parameters = { model = "none" }

    [[jobs]]
    notebook = ["02", "03"]
    grid = { fmt = ["f32", "bf16"] }    # one job per combination (cartesian product)

Before anything runs, the grid is checked against :data:`GRID_SCHEMA` (JSON Schema) and every
job's parameters as ``moespec reproduce`` checks them (:mod:`moespec.validate.parameters`: types
from the notebooks' defaults, ranges); relative paths in the grid file resolve against the grid
file's folder, those of ``-p`` against the working directory. A remote scheduler is reached over
TLS (``tls://``, certificates from the Dask configuration, :func:`scheduler_security`); a plain
``tcp://`` scheduler on an address other than this machine's loopback is refused unless
``insecure`` (whoever reaches it runs code on its workers, and the results this machine
unpickles come from them). submitit's job and result pickles sit in ``<sweep>/submitit/``, which
must be writable by this user alone.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import ipaddress
import itertools
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import pandas as pd
from tqdm.auto import tqdm

from . import io, paths, provenance, runner
from .validate import InputError, jsonfile
from .validate.outputs import private_folder, writable_folder
from .validate.parameters import check_values

EXECUTORS = ("dask", "slurm", "submitit-local")
#: Notebook parameters that name an output folder: a job that leaves one empty gets a folder
#: inside its own job folder, so that no job writes outside it.
OUTPUT_FOLDER_PARAMETERS = ("out_dir",)


class SweepError(InputError):
    """A grid that cannot run: unreadable file, unknown notebook or parameter, bad values."""


_NAME = {"type": "string", "minLength": 1}
#: JSON Schema of a grid (the TOML or JSON document).
GRID_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "required": ["jobs"], "additionalProperties": False,
    "properties": {
        "parameters": {"type": "object"},
        "jobs": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["notebook"], "additionalProperties": False,
            "properties": {
                "notebook": {"oneOf": [_NAME, {"type": "array", "minItems": 1, "items": _NAME}]},
                "parameters": {"type": "object"},
                "grid": {"type": "object", "additionalProperties": {"type": "array", "minItems": 1}}}}}},
}


@dataclass(frozen=True)
class Job:
    """One notebook run of a grid: ``parameters`` are those the grid sets (the notebook's own
    defaults fill the rest)."""

    notebook: Path
    parameters: dict = field(hash=False)

    @property
    def name(self) -> str:
        return self.notebook.stem

    @property
    def id(self) -> str:
        """``<notebook stem>-<8 hex digits>``: the same notebook and parameters give the same id."""
        blob = json.dumps({"notebook": self.name, "parameters": self.parameters}, sort_keys=True, default=str)
        return f"{self.name}-{hashlib.sha256(blob.encode()).hexdigest()[:8]}"

    def label(self, varying: Iterable[str] = ()) -> str:
        """The parameters in ``varying`` (those that differ between jobs of this notebook)."""
        return " ".join(f"{k}={self.parameters[k]}" for k in varying if k in self.parameters)


# --- grid files ---------------------------------------------------------------------------------
def read_grid(path: str | os.PathLike) -> dict:
    """The grid in a ``.toml`` or ``.json`` file, as a dict; errors name the file."""
    path = Path(path)
    if not path.is_file():
        raise SweepError(f"{path}: no such grid file")
    try:
        if path.suffix == ".json":
            grid = json.loads(path.read_text())
        elif path.suffix == ".toml":
            try:
                import tomllib
            except ModuleNotFoundError:  # Python 3.10
                import tomli as tomllib
            grid = tomllib.loads(path.read_text())
        else:
            raise SweepError(f"{path}: a grid is a .toml or .json file")
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, SweepError):
            raise
        raise SweepError(f"{path}: unreadable grid ({type(exc).__name__}: {exc})") from None
    if not isinstance(grid, dict):
        raise SweepError(f"{path}: a grid is a table (TOML) or an object (JSON)")
    return grid


def _as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def expand(grid: Mapping, notebooks_folder: Path | None = None,
           overrides: Mapping[str, Any] | None = None, where: str = "grid", base: Path | None = None,
           local: bool = True) -> list[Job]:
    """The jobs of a grid, in grid order, without repeats.

    Top-level ``parameters`` and ``overrides`` (``moespec sweep -p``) go to every job whose
    notebook declares them (a name that no notebook of the grid declares is an error); a job's own
    ``parameters`` and ``grid`` must be declared by its notebook (else :class:`SweepError` naming
    both). ``overrides`` win over the grid file. The grid must match :data:`GRID_SCHEMA` and every
    value its notebook's type and range (:func:`moespec.validate.parameters.check_values`); relative
    paths of the grid resolve against ``base`` (the grid file's folder), those of ``overrides``
    against the working directory; ``local``: input paths must exist on this machine. ``where``
    names the grid in errors.
    """
    jsonfile.check(grid, GRID_SCHEMA, where, SweepError)
    entries = grid["jobs"]
    common = dict(grid.get("parameters") or {})
    overrides = dict(overrides or {})
    available = runner.discover(notebooks_folder)
    declared: dict[Path, dict] = {}
    jobs: list[Job] = []
    grid_base = Path(base) if base else Path.cwd()
    for i, entry in enumerate(entries):
        at = f"{where}: jobs[{i}]"
        fixed = dict(entry.get("parameters") or {})
        axes = dict(entry.get("grid") or {})
        try:
            chosen = runner.select(available, [str(n) for n in _as_list(entry["notebook"])])
        except runner.NotebookError as exc:
            raise SweepError(f"{at}: {exc}") from None
        for nb in chosen:
            if nb not in declared:
                declared[nb] = runner.declared_parameters(nb)
            own = sorted((set(fixed) | set(axes)) - set(declared[nb]))
            if own:
                raise SweepError(f"{at}: {nb.name} does not declare parameter(s) {own}; "
                                 f"it declares {sorted(declared[nb])}")
            for combo in itertools.product(*axes.values()):
                params = {k: v for k, v in common.items() if k in declared[nb]}
                params.update(fixed)
                params.update(dict(zip(axes, combo)))
                given = {k: v for k, v in overrides.items() if k in declared[nb]}
                try:
                    params = check_values(nb, params, declared[nb], grid_base, SweepError, local)
                    params.update(check_values(nb, given, declared[nb], Path.cwd(), SweepError, local))
                    runner.check_models(nb, params, SweepError, local)
                except SweepError as exc:
                    origin = "-p" if exc.field in given else "the grid"
                    raise SweepError(f"{at} ({origin}): {exc}", where=where, field=exc.field, expected=exc.expected,
                                     found=exc.found) from None
                job = Job(nb, params)
                if job.id not in {j.id for j in jobs}:
                    jobs.append(job)
    for given, source in ((common, f"{where}: 'parameters'"), (overrides, "-p")):
        orphan = sorted(k for k in given if not any(k in d for d in declared.values()))
        if orphan:
            raise SweepError(f"{source}: no notebook of the grid declares {orphan}")
    return jobs


# --- one job (runs on a worker) -----------------------------------------------------------------
_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _environment(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set environment variables for the notebook kernel this process starts, then restore them.
    The kernel inherits the environment when it starts, so one job at a time per process
    (:data:`_ENV_LOCK`)."""
    saved = {k: os.environ.get(k) for k in values}
    for k, v in values.items():  # None: unset (e.g. the publishing run's data folder)
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def job_record(job: Job, folder: Path) -> dict:
    """What the driver sends to a worker: plain data, so any executor can pickle it."""
    return {"id": job.id, "notebook": str(job.notebook), "parameters": job.parameters, "folder": str(folder)}


def run_job(record: Mapping) -> dict:
    """Execute one job on this worker through :func:`moespec.runner.run_notebook`; write and return
    its manifest. A failing notebook is a manifest with ``status: failed`` and the runner's message
    (notebook and cell), never an exception, so the other jobs go on."""
    folder = paths.ensure(Path(record["folder"]))
    notebook = Path(record["notebook"])
    params = dict(record["parameters"])
    declared = runner.declared_parameters(notebook)
    for key in OUTPUT_FOLDER_PARAMETERS:
        if key in declared and not params.get(key):
            params[key] = str(folder / key)
    manifest = {"job": record["id"], "notebook": notebook.stem, "parameters": dict(record["parameters"]),
                "effective_parameters": {**declared, **params}, "status": "running",
                "pid": os.getpid(), "host": socket.gethostname(),   # a killed job's manifest: stale, and says so
                "started": _dt.datetime.now().isoformat(timespec="seconds"),
                "figures_dir": str(folder / "figures"), **provenance.full_record()}
    io.write_json(folder / "manifest.json", manifest)
    start = time.perf_counter()
    try:
        with _ENV_LOCK, _environment({paths.RUN_DIR_ENV: str(folder), paths.RUN_DATA_ENV: None}):
            result = runner.run_notebook(notebook, folder, params)
        manifest.update(status="finished", output=str(result.output))
    except runner.NotebookError as exc:
        manifest.update(status="failed", error=str(exc))
    except Exception as exc:  # a worker-side problem (kernel died, disk full): reported, not raised
        manifest.update(status="failed", error=f"{notebook.name}: {type(exc).__name__}: {exc}")
    manifest.update(wall_s=round(time.perf_counter() - start, 2),
                    finished=_dt.datetime.now().isoformat(timespec="seconds"))
    io.write_json(folder / "manifest.json", manifest)
    return manifest


def finished_before(job: Job, folder: Path) -> dict | None:
    """The manifest of an earlier run of ``job`` in ``folder`` if it finished with the same
    parameters and its executed notebook is there; else None."""
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    if (manifest.get("status") == "finished" and manifest.get("parameters") == job.parameters
            and Path(manifest.get("output", "")).is_file()):
        return manifest
    return None


# --- executors ----------------------------------------------------------------------------------
#: Schemes of Dask addresses whose connections are encrypted and authenticated (TLS).
SECURE_SCHEMES = ("tls", "wss")


def _address_host(address: str) -> tuple[str, str]:
    """(scheme, host) of a Dask address (``tcp://`` when no scheme is given)."""
    scheme, rest = address.split("://", 1) if "://" in address else ("tcp", address)
    if rest.startswith("["):
        return scheme, rest[1:rest.find("]")]
    return scheme, rest.rsplit(":", 1)[0] if ":" in rest else rest


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine's loopback (every address it resolves to)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def scheduler_security(scheduler: str, insecure: bool = False):
    """The ``distributed.Security`` to reach ``scheduler`` with, or None for a plain connection.

    ``tls://`` (and ``wss://``): TLS with the certificates of the user's Dask configuration
    (``distributed.comm.tls.ca-file``, ``distributed.comm.tls.client.cert`` and ``.key``; a YAML
    file in ``~/.config/dask/`` or ``DASK_DISTRIBUTED__COMM__TLS__*`` variables), refused when
    they are missing. A plain scheme (``tcp://``, ``ws://``, ``ucx://``) is accepted on a loopback
    address and otherwise refused unless ``insecure``: a scheduler runs whatever its clients
    submit on its workers, and the results that come back are unpickled here."""
    from distributed import Security

    scheme, host = _address_host(scheduler)
    if scheme in SECURE_SCHEMES:
        security = Security(require_encryption=True)
        missing = [key for key, value in (("distributed.comm.tls.ca-file", security.tls_ca_file),
                                          ("distributed.comm.tls.client.cert", security.tls_client_cert))
                   if not value]
        if missing:
            raise SweepError(f"--scheduler {scheduler}: expected TLS certificates in the Dask configuration "
                             f"({', '.join(missing)}, and distributed.comm.tls.client.key unless the cert holds it); "
                             "found none: put them in ~/.config/dask/distributed.yaml or DASK_DISTRIBUTED__COMM__TLS__* "
                             "variables (docs/sweep.md)", where="--scheduler", field=missing[0],
                             expected="a certificate file", found=None)
        return security
    if scheme == "inproc" or _is_loopback(host) or insecure:
        return None
    raise SweepError(f"--scheduler {scheduler}: expected tls:// (certificates from the Dask configuration) or a "
                     f"loopback address; found a plain {scheme}:// connection to {host}: whoever can reach that "
                     "scheduler can run code on its workers and send this machine results it unpickles. Use a "
                     "tls:// scheduler, or --insecure on a network where only you can reach it (docs/sweep.md)",
                     where="--scheduler", field="scheme", expected="tls", found=scheme)


def _failure(record: Mapping, message: str) -> dict:
    """The manifest of a job whose worker never reported (killed, lost, cancelled)."""
    manifest = {"job": record["id"], "notebook": Path(record["notebook"]).stem,
                "parameters": record["parameters"], "status": "failed", "error": message}
    io.write_json(Path(record["folder"]) / "manifest.json", manifest)
    return manifest


def _run_dask(records: list[dict], scheduler: str | None, workers: int, bar, security=None) -> list[dict]:
    from dask.distributed import Client, LocalCluster, as_completed

    with contextlib.ExitStack() as stack:
        if scheduler:
            client = stack.enter_context(Client(scheduler, security=security))
        else:
            cluster = stack.enter_context(LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                                       dashboard_address=None, silence_logs=40))
            client = stack.enter_context(Client(cluster))
        futures = {client.submit(run_job, r, key=f"moespec-{r['id']}", pure=False): r for r in records}
        out = []
        for fut in as_completed(futures):
            try:
                out.append(fut.result())
            except Exception as exc:  # the worker died or the task was lost
                out.append(_failure(futures[fut], f"dask: {type(exc).__name__}: {exc}"))
            bar.update()
        return out


def _run_submitit(records: list[dict], cluster: str, folder: Path, options: Mapping[str, Any], bar) -> list[dict]:
    import submitit

    # submitit unpickles what it finds there (jobs on the nodes, results here): this user's alone
    executor = submitit.AutoExecutor(folder=private_folder(folder / "submitit", "submitit folder", SweepError),
                                     cluster=cluster)
    executor.update_parameters(**{"timeout_min": 24 * 60, "name": "moespec-sweep", **options})
    with executor.batch():  # one Slurm job array
        submitted = [(executor.submit(run_job, r), r) for r in records]
    out = []
    pending = list(submitted)
    while pending:
        still = []
        for job, r in pending:
            if not job.done():
                still.append((job, r))
                continue
            try:
                out.append(job.result())
            except Exception as exc:  # submitit.core.utils.FailedJobError, UncompletedJobError
                out.append(_failure(r, f"submitit job {job.job_id}: {type(exc).__name__}: "
                                       f"{str(exc).splitlines()[0] if str(exc) else ''}"))
            bar.update()
        pending = still
        if pending:
            time.sleep(0.5)
    return out


# --- the sweep ----------------------------------------------------------------------------------
def _varying(jobs: list[Job]) -> list[str]:
    """Parameter names whose values differ between ``jobs``."""
    keys = sorted({k for j in jobs for k in j.parameters})
    return [k for k in keys
            if len({json.dumps(j.parameters.get(k), sort_keys=True, default=str) for j in jobs}) > 1]


@dataclass
class SweepResult:
    folder: Path
    jobs: list[dict]
    tables: list[Path]

    @property
    def failed(self) -> list[dict]:
        return [j for j in self.jobs if j["status"] == "failed"]


def merge_tables(folder: Path, manifests: list[dict]) -> list[Path]:
    """One CSV per notebook output: the rows of every finished job's ``figures/*.csv`` with the
    job id and each job parameter as leading columns; written atomically to ``<folder>/tables/``."""

    frames: dict[str, list] = {}
    for m in manifests:
        if m["status"] not in ("finished", "skipped"):
            continue
        for csv in sorted((folder / "jobs" / m["job"] / "figures").glob("*.csv")):
            df = pd.read_csv(csv)
            lead = {"job": m["job"], "notebook": m["notebook"],
                    **{f"param_{k}": v if isinstance(v, (str, int, float, bool)) else json.dumps(v)
                       for k, v in m["parameters"].items()}}
            for i, (k, v) in enumerate(lead.items()):
                df.insert(i, k, v)
            frames.setdefault(csv.name, []).append(df)
    out = []
    for name, dfs in sorted(frames.items()):
        out.append(io.write_dataframe(folder / "tables" / name, pd.concat(dfs, ignore_index=True)))
    return out


def run_sweep(grid, out: Path | None = None, executor: str = "dask", scheduler: str | None = None,
              workers: int | None = None, executor_options: Mapping[str, Any] | None = None,
              overrides: Mapping[str, Any] | None = None, force: bool = False, progress: bool = True,
              notebooks_folder: Path | None = None, insecure: bool = False) -> SweepResult:
    """Run every job of ``grid`` (a grid file or its dict) and merge the tables.

    ``out``: the sweep folder (default ``runs/sweep-<grid file stem>``, the same on every rerun,
    so that finished jobs are skipped; ``force`` runs them again). ``executor``: ``"dask"``
    (``scheduler``: a Dask scheduler address; default a LocalCluster of ``workers`` one-thread
    worker processes), ``"slurm"`` or ``"submitit-local"`` (``executor_options`` go to submitit's
    ``update_parameters``, e.g. ``slurm_partition``, ``gpus_per_node``, ``timeout_min``).
    ``insecure``: allow a plain ``tcp://`` scheduler on a non-loopback address
    (:func:`scheduler_security`). Everything is checked before the first job is sent: the grid,
    every job's parameters, the scheduler's security and the sweep folder. The sweep folder is
    held for the whole sweep (:func:`moespec.runner.hold_folder`): a second sweep into it is refused
    naming the one that holds it.
    """

    if executor not in EXECUTORS:
        raise SweepError(f"unknown executor {executor!r}; choose one of {EXECUTORS}")
    if scheduler and executor != "dask":
        raise SweepError("--scheduler is the address of a Dask scheduler; it needs --executor dask")
    # an option that selects nothing under the chosen executor is refused by name
    if workers is not None and (scheduler or executor != "dask"):
        other = "--scheduler (the scheduler brings its own workers)" if scheduler else f"--executor {executor}"
        raise SweepError(f"--workers {workers}: sizes the LocalCluster this sweep starts; it has no effect with "
                         f"{other}", where="--workers", found=workers)
    if executor_options and executor == "dask":
        raise SweepError(f"--executor-option {sorted(executor_options)}: submitit's parameters; they have no effect "
                         "with --executor dask (give --executor slurm or submitit-local)", where="--executor-option",
                         found=sorted(executor_options))
    if insecure and not scheduler:
        raise SweepError("--insecure allows a plain tcp:// --scheduler off this machine; without --scheduler it has "
                         "no effect", where="--insecure")
    workers = 2 if workers is None else workers
    if workers < 1:
        raise SweepError(f"--workers: expected >= 1; found {workers}", where="--workers", found=workers)
    security = scheduler_security(scheduler, insecure) if scheduler else None
    from_file = not isinstance(grid, Mapping)
    grid_name = Path(grid).stem if from_file else "grid"
    spec = read_grid(grid) if from_file else dict(grid)
    jobs = expand(spec, notebooks_folder, overrides, where=str(grid) if from_file else "grid",
                  base=Path(grid).resolve().parent if from_file else None, local=not scheduler)
    folder = Path(out).expanduser().absolute() if out else paths.runs_dir() / f"sweep-{grid_name}"
    folder = paths.ensure(writable_folder(folder, "--out", SweepError))
    with runner.hold_folder(folder, "sweep folder --out"):   # one sweep writes a folder at a time
        return _sweep_in(folder, jobs, grid, spec, executor, scheduler, workers, executor_options, security, force,
                         progress)


def _sweep_in(folder: Path, jobs: list[Job], grid, spec: dict, executor: str, scheduler: str | None, workers: int,
              executor_options, security, force: bool, progress: bool) -> SweepResult:
    """The jobs of a checked grid, run into ``folder`` (held by this process), and their merged tables."""
    done, todo = [], []
    for job in jobs:
        before = None if force else finished_before(job, folder / "jobs" / job.id)
        if before is not None:
            done.append({**before, "status": "skipped", "skipped_reason": "finished in an earlier run"})
        else:
            todo.append(job_record(job, folder / "jobs" / job.id))
    bar = tqdm(total=len(todo), desc=f"moespec sweep ({executor}, {len(done)} done before)", unit="job",
               disable=not progress)
    try:
        if not todo:
            ran = []
        elif executor == "dask":
            ran = _run_dask(todo, scheduler, workers, bar, security)
        else:
            ran = _run_submitit(todo, "slurm" if executor == "slurm" else "local", folder,
                                dict(executor_options or {}), bar)
    finally:
        bar.close()
    by_id = {m["job"]: m for m in done + ran}
    manifests = [by_id[j.id] for j in jobs]
    for j, m in zip(jobs, manifests):
        m["label"] = j.label(_varying([o for o in jobs if o.notebook == j.notebook]))
    tables = merge_tables(folder, manifests)
    summary = {"grid": str(grid) if not isinstance(grid, Mapping) else spec, "executor": executor,
               "scheduler": scheduler, "workers": workers if executor == "dask" and not scheduler else None,
               "finished": _dt.datetime.now().isoformat(timespec="seconds"),
               "jobs": [{k: m.get(k) for k in ("job", "notebook", "label", "parameters", "status", "wall_s", "error")}
                        for m in manifests],
               "tables": [str(t) for t in tables], "driver": provenance.full_record()}
    io.write_json(folder / "sweep.json", summary)
    return SweepResult(folder, manifests, tables)
