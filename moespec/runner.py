"""Run the notebooks through papermill: the engine behind ``moespec reproduce``.

Every notebook in ``notebooks/`` named ``NN_name.ipynb`` runs in order of ``NN``. Each has a
cell tagged ``parameters`` holding literal values, among them ``profile`` ("quick" or "full") and
``device``. Parameters the notebook does not declare, one given twice with different values, and a
value of the wrong type or outside its range (:mod:`moespec.validate.parameters`: the type of the
notebook's default, the range declared beside it) are an error before anything runs; relative paths
in parameters are made absolute against the caller's working directory.

A run writes only into its run folder (default ``runs/<time>-<profile>/``, ``--out`` moves it):
the executed notebooks, ``manifest.json`` (provenance, the parameters each notebook ran with, its
status), and, through :func:`moespec.paths.figures_dir` / :func:`moespec.paths.run_data_dir`,
which this module points at the run folder for every notebook, the figures, tables and
measurements. The folder is held by the run (a lock file, released when the process ends,
however it ends): a second run into a folder a live run holds is refused. The publishing run
(``make reproduce``: full profile, every notebook, ``publish=True``) alone keeps its measurements
in the shared ``data/`` caches and, once every notebook has run, copies its figures into the
committed ``figures/``.

SIGINT (Ctrl-C) or SIGTERM during a run stops it cleanly: the notebook's kernel is shut down, the
partial executed notebook is marked interrupted (its metadata, the interrupted cell, a banner
cell), the manifest says ``"status": "interrupted"`` with the notebook and cell, and
:class:`RunInterrupted` carries the exit status (130, 143) to the command line.
"""

from __future__ import annotations

import ast
import datetime as _dt
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from tqdm.auto import tqdm

from . import io, paths, provenance
from . import progress as progress_env
from .validate import InputError
from .validate.parameters import check_values
from .validate.runs import LOCK_NAME

PROFILES = ("quick", "full")
#: Tags of cells that papermill or this module add to an executed notebook (not the author's cells).
ADDED_CELL_TAGS = {"injected-parameters", "papermill-error-cell-tag", "moespec-interrupted"}


class NotebookError(RuntimeError):
    """A notebook could not run: unknown parameters, missing file, a failing cell, a bad run folder."""


class UnknownParameterError(NotebookError):
    pass


class ParameterError(InputError, NotebookError):
    """A parameter value of the wrong type or outside its range; names the notebook and parameter."""


class RunFolderBusy(NotebookError):
    """The run folder is held by another live run."""


class RunInterrupted(Exception):
    """The run was stopped by a signal; the manifest and the partial notebook say where.
    ``exit_status`` is 128 + the signal number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signal_name: str, exit_status: int, notebook: str | None, where: str | None,
                 manifest: Path):
        self.signal_name, self.exit_status = signal_name, exit_status
        self.notebook, self.where, self.manifest = notebook, where, manifest
        at = f" in {notebook}" + (f", {where}" if where else "") if notebook else ""
        super().__init__(f"interrupted by {signal_name}{at}; manifest {manifest} (status: interrupted)")


class _Stop(KeyboardInterrupt):
    """Raised in the main thread by the run's SIGINT/SIGTERM handler."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@dataclass
class NotebookRun:
    name: str
    parameters: dict
    wall_s: float
    output: Path


def discover(folder: Path | None = None) -> list[Path]:
    """The notebooks of ``folder`` (default ``notebooks/``), in run order (by file name)."""
    folder = folder or paths.notebooks_dir()
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise NotebookError(f"no notebooks named NN_name.ipynb in {folder}")
    return found


def select(notebooks: list[Path], only: Iterable[str] | None) -> list[Path]:
    """Keep the notebooks whose stem or number matches one of ``only`` (e.g. "01" or "01_routing_reuse")."""
    if not only:
        return notebooks
    wanted = list(only)
    chosen = [nb for nb in notebooks
              if any(nb.stem == w or nb.stem.split("_", 1)[0] == w or nb.name == w for w in wanted)]
    missing = [w for w in wanted
               if not any(nb.stem == w or nb.stem.split("_", 1)[0] == w or nb.name == w for nb in notebooks)]
    if missing:
        raise NotebookError(f"--only names no notebook: {missing}; notebooks: {[nb.stem for nb in notebooks]}")
    return chosen


def _literal(value):
    """A parameter value as papermill reports it (source text) read as a Python literal."""
    try:
        return ast.literal_eval(value) if isinstance(value, str) else value
    except (ValueError, SyntaxError):
        return value


def declared_parameters(notebook: Path) -> dict[str, Any]:
    """The parameters (name -> default) of the notebook's cell tagged ``parameters``."""
    import papermill as pm

    declared = pm.inspect_notebook(str(notebook))
    if not declared:
        raise NotebookError(f"{notebook.name} has no cell tagged 'parameters'")
    return {name: _literal(info.get("default")) for name, info in declared.items()}


def parameter_help(notebook: Path) -> dict[str, str]:
    """The comment beside each parameter of the notebook's ``parameters`` cell ("" where none)."""
    import papermill as pm

    return {name: info.get("help", "") for name, info in pm.inspect_notebook(str(notebook)).items()}


def check_parameters(notebook: Path, parameters: dict[str, Any], base: Path | None = None,
                     local: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(declared defaults, checked values): :class:`UnknownParameterError` for a parameter the
    notebook does not declare, :class:`ParameterError` for a value of the wrong type or range
    (:func:`moespec.validate.parameters.check_values`; relative paths resolved against ``base``,
    default the working directory; ``local``: input paths must exist on this machine)."""
    declared = declared_parameters(notebook)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise UnknownParameterError(
            f"{notebook.name}: unknown parameter(s) {unknown}; it declares {sorted(declared)}")
    values = check_values(notebook, parameters, declared, base, ParameterError, local)
    check_models(notebook, values, ParameterError, local)
    return declared, values


def _model_fields(number: str, values: dict[str, Any]) -> list[tuple[str, Any, tuple, str]]:
    """(field, value, names the notebook knows, what a path must hold) of every model a notebook's
    parameters name: ``model`` (01: also "synthetic", "none"), each of ``transfer_models``, and the
    subject's ``model``, ``like`` and ``draft`` (05-07)."""
    from .model_shapes import PRESETS

    presets, config = tuple(PRESETS), "a config.json or a folder holding one"
    weights = "a checkpoint folder (its config.json and weights)"
    out = [("model", values["model"], {"01": ("synthetic", "none") + presets}.get(number, presets),
            config)] if "model" in values else []
    out += [(f"transfer_models[{i}]", m, presets, config) for i, m in enumerate(values.get("transfer_models") or [])]
    subject = values.get("subject") or {}
    if subject:
        from .engine.subject import KINDS, QUICK_LIKE   # transformers: only where a subject is given

        out += [(f"subject.{key}", subject[key], names, what) for key, names, what in (
            ("model", KINDS, weights), ("like", presets + (QUICK_LIKE.name,), config), ("draft", (), weights))
            if subject.get(key)]
    return out


def check_models(notebook: Path, values: dict[str, Any], error: type[InputError] = ParameterError,
                 local: bool = True) -> None:
    """Every model a notebook's parameters name (:func:`_model_fields`) is a name the notebook knows
    (a preset of :data:`moespec.model_shapes.PRESETS`, a subject kind) or a path to a model's
    ``config.json`` (:func:`moespec.model_shapes.config_path`; a checkpoint to load or record must be
    a folder; a hub name whose config is in the local Hugging Face cache counts as its folder); a
    routing trace given with a model has its shape (:func:`_check_trace_of_model`). Refused in one
    line before the notebook starts. ``local``: paths are checked only where the notebook runs here."""
    from .model_shapes import config_path

    number = notebook.stem.split("_", 1)[0]
    for field, value, names, what in _model_fields(number, values):
        if not isinstance(value, str) or value.lower() in names:
            continue
        path = config_path(value)
        folder_needed = what.startswith("a checkpoint folder")
        given = Path(value).expanduser()
        if not local or (path is not None and (given.is_dir() or not given.exists() or not folder_needed)):
            continue
        expected = f"one of {list(names)} or {what}" if names else what
        raise error(f"{notebook.name}: parameter {field!r}: expected {expected}; found {value!r}"
                    + (" (a folder without a config.json)" if Path(value).is_dir() else
                       "" if Path(value).exists() else " (no such file or folder)"),
                    where=notebook.name, field=field, expected=expected, found=value)
    if local:
        _check_trace_of_model(notebook, values, error)
        _check_expert_function(notebook, values, error)


def _check_expert_function(notebook: Path, values: dict[str, Any], error: type[InputError]) -> None:
    """The subject checkpoint of a whole-model notebook (05-07) has experts moespec's kernels compute
    (:func:`moespec.model_shapes.expert_function_difference`), checked before the notebook starts."""
    from .model_shapes import config_path, expert_function_difference

    model = (values.get("subject") or {}).get("model")
    path = config_path(model) if isinstance(model, str) else None
    differs = expert_function_difference(path) if path is not None else None
    if differs:
        expected = "a checkpoint whose experts compute down(silu(gate x) * up x) without biases"
        raise error(f"{notebook.name}: parameter 'subject.model': expected {expected}; found {model!r}, whose "
                    f"experts have {differs}: the kernels do not run it (notebooks 01, 02, 03 take it; advise "
                    "then takes -a or --acceptance-from and --draft-fit)", where=notebook.name,
                    field="subject.model", expected=expected, found=str(model))


def _check_trace_of_model(notebook: Path, values: dict[str, Any], error: type[InputError]) -> None:
    """A routing trace given with a model (``trace_file`` with ``model``; the subject's ``trace_file``
    with its ``like``) has that model's shape (L, N, m), checked before the notebook starts: routing
    is never applied to another model's shape. (Notebook 01 shows a trace beside a preset's
    synthetic routing, not at its shape: there only a model of your own is checked.)"""
    from .model_shapes import PRESETS, get_spec
    from .routing import RoutingTrace
    from .validate.invariants import check_trace_shape

    subject = values.get("subject") or {}
    pairs = [("trace_file", values.get("trace_file"), "model", values.get("model")),
             ("subject.trace_file", subject.get("trace_file"), "subject.like", subject.get("like"))]
    for trace_field, trace, model_field, model in pairs:
        if not (trace and model and Path(str(trace)).is_file()) or model in ("synthetic", "none") or (
                notebook.stem.startswith("01") and str(model).lower() in PRESETS):
            continue
        try:
            spec = get_spec(model)
        except KeyError:
            continue
        try:
            check_trace_shape(RoutingTrace.load(trace), spec, f"{model_field} {spec.name}")
        except (ValueError, OSError) as exc:
            raise error(f"{notebook.name}: parameter {trace_field!r}: {exc}", where=notebook.name,
                        field=trace_field, expected=f"a trace of {spec.name}'s shape", found=str(trace)) from None


def _kernel_manager_logging_to(log) -> type:
    """A kernel manager class whose kernels write their own stdout/stderr (start-up warnings, the
    noise of a shutdown in the middle of a cell) into the open file ``log`` instead of the
    terminal of ``moespec reproduce``."""
    from jupyter_client.manager import AsyncKernelManager

    class LoggedKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw):
            kw.setdefault("stdout", log)
            kw.setdefault("stderr", log)
            return await super().start_kernel(**kw)

    return LoggedKernelManager


@contextmanager
def _progress_of(notebook: Path, out_dir: Path, show) -> Iterator[None]:
    """The notebook's kernel publishes its sweeps' progress (:mod:`moespec.progress`) into
    ``out_dir/logs/<notebook>.progress``; while it runs, ``show`` (if given) gets the file's last
    line each second."""
    path = paths.ensure(Path(out_dir) / "logs") / f"{notebook.stem}.progress"
    saved = os.environ.get(progress_env.ENV)
    os.environ[progress_env.ENV] = str(path)
    done = threading.Event()

    def watch():
        shown = None
        while not done.wait(1.0):
            line = progress_env.last_line(path)
            if line and line != shown:
                shown = line
                show(line)

    watcher = threading.Thread(target=watch, daemon=True) if show else None
    if watcher:
        watcher.start()
    try:
        yield
    finally:
        done.set()
        if watcher:
            watcher.join()
        os.environ.pop(progress_env.ENV) if saved is None else os.environ.__setitem__(progress_env.ENV, saved)


def run_notebook(notebook: Path, out_dir: Path, parameters: dict[str, Any], progress: bool = False,
                 show=None) -> NotebookRun:
    """Execute one notebook with papermill into ``out_dir``; raise :class:`NotebookError` naming
    the notebook and the failing cell. ``NotebookRun.parameters`` are the values the notebook ran
    with: its declared defaults overridden by what papermill injected. The kernel's own output
    goes to ``out_dir/logs/<notebook>.kernel.log``. ``progress``: a bar (stderr) naming the
    notebook and the cell it is executing (papermill's, e.g. ``00_default_models: 7/25 cells``);
    ``show``: a function that gets what the notebook is measuring as it goes (the last line of
    ``out_dir/logs/<notebook>.progress``, :mod:`moespec.progress`), e.g. ``expert op olmoe cpp f32:
    1/2 [00:10<00:10]``."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    declared, parameters = check_parameters(notebook, parameters)
    out = paths.ensure(Path(out_dir)) / notebook.name
    start = time.perf_counter()
    try:
        with open(paths.ensure(Path(out_dir) / "logs") / f"{notebook.stem}.kernel.log", "ab") as log, \
                _progress_of(notebook, out_dir, show):
            bar = {"desc": notebook.stem, "unit": "cell", "position": 1, "leave": False} if progress else False
            pm.execute_notebook(str(notebook), str(out), parameters=parameters, progress_bar=bar,
                                cwd=str(notebook.parent), kernel_name="python3",
                                kernel_manager_class=_kernel_manager_logging_to(log))
    except PapermillExecutionError as exc:
        if exc.ename == "KeyboardInterrupt":   # the kernel itself was interrupted (SIGINT to it)
            raise _Stop(signal.SIGINT) from None
        where = _describe_cell(out)
        raise NotebookError(
            f"{notebook.name} failed in {where or f'cell index {exc.cell_index}'}: {exc.ename}: {exc.evalue}. "
            f"Executed notebook with the traceback: {out}") from None
    return NotebookRun(notebook.stem, {**declared, **_injected(out)}, time.perf_counter() - start, out)


def _injected(executed: Path) -> dict[str, Any]:
    """The parameters papermill injected into an executed notebook (its metadata)."""
    try:
        injected = json.loads(executed.read_text())["metadata"]["papermill"].get("parameters") or {}
    except (OSError, ValueError, KeyError):
        return {}
    return dict(injected)


def _own_cells(cells: list[dict]) -> list[dict]:
    """The author's cells of an executed notebook (without the cells papermill or moespec add)."""
    return [c for c in cells if not ADDED_CELL_TAGS & set(c.get("metadata", {}).get("tags", []))]


def _cell_label(number: int, cell: dict) -> str:
    """How a cell is named to the user: its 1-based number among the author's cells, first line."""
    first = next((line.strip() for line in "".join(cell.get("source", "")).splitlines() if line.strip()), "")
    return f"cell {number} ({first[:60]!r})"


def _describe_cell(executed: Path) -> str | None:
    """Name the failing cell as the author sees it (see :func:`_cell_label`); None if unknown."""
    try:
        own = _own_cells(json.loads(executed.read_text())["cells"])
        number, cell = next((i + 1, c) for i, c in enumerate(own)
                            if c.get("metadata", {}).get("papermill", {}).get("exception"))
        return _cell_label(number, cell)
    except (OSError, ValueError, KeyError, StopIteration):
        return None


def mark_interrupted(executed: Path, signal_name: str) -> str | None:
    """Mark a partially executed notebook as interrupted, so that it cannot pass for a finished
    run: papermill, stopped by a signal, records ``exception: None`` and marks its unrun cells
    completed. The last cell that started is marked ``interrupted``, the cells after it
    ``pending`` (never run), the notebook's metadata gets ``exception: true`` and
    ``moespec: {"status": "interrupted", ...}``, and a banner cell on top says so. Returns the
    interrupted cell's label, or None when the notebook was not written yet or no cell had started."""
    try:
        nb = json.loads(executed.read_text())
    except (OSError, ValueError):
        return None
    cells = nb.get("cells", [])
    started = [i for i, c in enumerate(cells) if c.get("metadata", {}).get("papermill", {}).get("start_time")]
    where = None
    if started:
        k = started[-1]
        own = _own_cells(cells)
        number = next((i + 1 for i, c in enumerate(own) if c is cells[k]), None)
        where = _cell_label(number, cells[k]) if number else "the injected parameters"
        cells[k]["metadata"]["papermill"].update(status="interrupted", exception=True)
        for c in cells[k + 1:]:
            c.setdefault("metadata", {})["papermill"] = dict(exception=None, start_time=None, end_time=None,
                                                             duration=None, status="pending")
    meta = nb.setdefault("metadata", {})
    meta.setdefault("papermill", {})["exception"] = True
    meta["moespec"] = {"status": "interrupted", "signal": signal_name, "cell": where,
                       "at": _dt.datetime.now().isoformat(timespec="seconds")}
    text = (f"**moespec: this run was interrupted by {signal_name}"
            + (f" in {where}" if where else " before its first cell") + "; the cells after it did not run.**")
    cells.insert(0, {"cell_type": "markdown", "id": "moespec-interrupted", "source": text,
                     "metadata": {"tags": ["moespec-interrupted"]}})
    io.write_json(executed, nb)
    return where


# --- the run folder ------------------------------------------------------------------------------
@contextmanager
def hold_folder(folder: Path, what: str = "--out") -> Iterator[Path]:
    """Create ``folder`` if needed and hold it for this process: a lock file ``.moespec-run.lock``
    with an exclusive ``flock``, which the kernel releases when the process ends however it ends
    (no stale lock after a crash). Raises :class:`NotebookError` naming ``folder`` when it is a
    file, cannot be created or is not writable, and :class:`RunFolderBusy` naming the live run
    that holds it."""
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise NotebookError(f"{what} {folder}: exists and is not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise NotebookError(f"{what} {folder}: cannot create or write the run folder ({exc.strerror or exc})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            try:
                info = json.loads(holder)
                who = f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: {info.get('command')}"
            except ValueError:
                who = "another process"
            raise RunFolderBusy(f"{what} {folder} is held by a live run ({who}); wait for it to finish or "
                                "choose another folder") from None
        record = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                             "started": _dt.datetime.now().isoformat(timespec="seconds"),
                             "command": " ".join(sys.argv)}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        yield folder
    finally:
        os.close(fd)   # releases the lock (the file stays, naming the last holder)


@contextmanager
def _hold_new_run_folder(profile: str) -> Iterator[Path]:
    """Create and hold ``runs/<time>-<profile>``, with a suffix ``-2``, ``-3``, ... when a run of
    the same second made (or holds) it already: a default run folder is never shared."""
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    base = paths.runs_dir() / f"{stamp}-{profile}"
    with ExitStack() as stack:
        for k in range(1, 1000):
            folder = base if k == 1 else base.with_name(f"{base.name}-{k}")
            if folder.exists():
                continue
            try:
                held = stack.enter_context(hold_folder(folder, "run folder"))
            except RunFolderBusy:   # another run made it between the check and the lock
                continue
            yield held
            return
    raise NotebookError(f"no free run folder named {base.name}[-k] in {paths.runs_dir()}")


@contextmanager
def _notebook_environment(run_dir: Path, publish: bool) -> Iterator[None]:
    """Point the notebooks' :mod:`moespec.paths` at the run folder (the kernel inherits the
    environment); the publishing run keeps its measurements in ``data/``."""
    def apply(values: dict) -> None:   # a value None removes the variable
        for k, v in values.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)

    wanted = {paths.RUN_DIR_ENV: str(run_dir), paths.RUN_DATA_ENV: str(paths.data_dir()) if publish else None}
    saved = {k: os.environ.get(k) for k in wanted}
    try:
        apply(wanted)
        yield
    finally:
        apply(saved)


@contextmanager
def _on_signals(handler) -> Iterator[None]:
    """SIGINT and SIGTERM go to ``handler`` (a function, or ``signal.SIG_IGN``) inside the block,
    in the main thread (elsewhere nothing changes); the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def _raise_stop(signum, frame):
    """While notebooks run: stop the run (papermill then shuts the kernel down on the way out)."""
    raise _Stop(signum)


def publish_figures(run_dir: Path, manifest: Path) -> list[str]:
    """Copy the run's figures into the committed ``figures/`` (each file atomically), remove the
    committed files the run did not produce (``README.md`` stays) and copy ``manifest`` as
    ``figures/MANIFEST.json``. Returns the names removed."""
    source, target = run_dir / "figures", paths.committed_figures_dir()
    produced = sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else []
    if not produced:
        raise NotebookError(f"the publishing run wrote no figures into {source}; figures/ left as it was")
    target.mkdir(parents=True, exist_ok=True)
    for p in produced:
        with io.atomic_path(target / p.name) as tmp:
            shutil.copyfile(p, tmp)
    keep = {p.name for p in produced} | {"README.md", "MANIFEST.json"}
    removed = sorted(p.name for p in target.iterdir() if p.is_file() and p.name not in keep and not p.name.startswith("."))
    for name in removed:
        (target / name).unlink()
    with io.atomic_path(target / "MANIFEST.json") as tmp:
        shutil.copyfile(manifest, tmp)
    return removed


def _resolve_parameters(profile: str | None, device: str | None, extra: dict[str, Any]) -> tuple[str, dict]:
    """The profile and the parameters for every notebook; a parameter given both as an option and
    as ``-p`` with different values is refused."""
    extra = dict(extra)
    for name, option in (("profile", profile), ("device", device)):
        if option is not None and name in extra and extra[name] != option:
            raise NotebookError(f"{name} given twice with different values: --{name} {option} and "
                                f"-p {name}={extra[name]!r}; give it once")
    profile = profile if profile is not None else extra.pop("profile", "full")
    extra.pop("profile", None)
    if profile not in PROFILES:
        raise NotebookError(f"unknown profile {profile!r}; choose one of {PROFILES}")
    if device is not None:
        extra["device"] = device
    return profile, extra


def with_own_model(declared: dict[str, Any], params: dict[str, Any], model: str | None,
                   draft: str | None) -> dict[str, Any]:
    """``params`` of a notebook that declares ``declared``, with the user's model (``--model``): as
    ``model`` where the notebook declares it (01-03), as the subject's ``model`` and ``draft``
    (``--draft``) where it declares ``subject`` (05-07). The same given twice with another value
    (``-p``) is refused."""
    if draft and not model:
        raise NotebookError("--draft names the draft of --model; give --model too")
    out = dict(params)
    if not model:
        return out
    given = {"model": model} if "model" in declared else {}
    if "subject" in declared:
        subject = dict(out.get("subject") or {})
        for key, value in (("model", model), ("draft", draft)):
            if value and subject.get(key) not in (None, "", value):
                raise NotebookError(f"subject {key} given twice: --{key} {value} and -p subject={{{key!r}: "
                                    f"{subject[key]!r}}}; give it once")
            if value:
                subject[key] = value
        given["subject"] = subject
    if given.get("model") and out.get("model") not in (None, model):
        raise NotebookError(f"model given twice: --model {model} and -p model={out['model']!r}; give it once")
    return {**out, **given}


def reproduce(profile: str | None = None, only: Iterable[str] | None = None, out: Path | None = None,
              extra: dict[str, Any] | None = None, device: str | None = None,
              progress: bool = True, notebooks_folder: Path | None = None, publish: bool = False,
              model: str | None = None, draft: str | None = None) -> Path:
    """Run the notebooks in order into one run folder; return the path of its ``manifest.json``.

    ``profile``: "quick" or "full" (default full, or ``extra["profile"]``). ``extra`` parameters
    go to every notebook that declares them; a name that no selected notebook declares, or one
    that contradicts ``profile``/``device``, is an error before anything runs. ``out``: the run
    folder (default ``runs/<time>-<profile>``); it must be creatable and writable, and no live run
    may hold it. ``publish``: the ``make reproduce`` run (full profile, every notebook, no
    overrides): measurements into the shared ``data/``, figures copied into the committed
    ``figures/`` at the end. ``model``/``draft``: your checkpoint (and its draft) for every notebook
    that takes a model (:func:`with_own_model`). Raises :class:`NotebookError` (bad input, a failing
    cell: the manifest says ``failed``) or :class:`RunInterrupted` (SIGINT/SIGTERM: ``interrupted``).
    """
    profile, extra = _resolve_parameters(profile, device, dict(extra or {}))
    if publish and (profile != "full" or only or extra or model):
        raise NotebookError("--publish refreshes the committed figures/ from the full run of every notebook with "
                            "its default parameters; it takes no --only, -p or --device and only the full profile")
    notebooks = select(discover(notebooks_folder), only)
    declared = {nb: declared_parameters(nb) for nb in notebooks}
    orphan = sorted(k for k in extra if not any(k in d for d in declared.values()))
    if orphan:
        raise UnknownParameterError(
            f"unknown parameter(s) {orphan}: no selected notebook declares them")
    if model and not any({"model", "subject"} & set(d) for d in declared.values()):
        raise UnknownParameterError(f"--model {model}: no selected notebook takes a model (01-03, 05-07)")
    params_of = {}
    for nb in notebooks:
        params = with_own_model(declared[nb], {"profile": profile, **{k: v for k, v in extra.items()
                                                                       if k in declared[nb]}}, model, draft)
        missing = [k for k in params if k not in declared[nb]]
        if missing:
            raise UnknownParameterError(f"{nb.name} does not declare the parameter(s) {missing}")
        params_of[nb] = check_values(nb, params, declared[nb], Path.cwd(), ParameterError)
        check_models(nb, params_of[nb])
    with ExitStack() as held:
        # absolute: the kernels run in the notebooks' folder, where a relative --out would name another place
        run_dir = held.enter_context(hold_folder(Path(out).absolute(), "--out") if out
                                     else _hold_new_run_folder(profile))
        if publish:  # one publishing run at a time: it writes data/ and figures/
            held.enter_context(hold_folder(paths.runs_dir(), "the publishing runs' folder"))
        return _run(notebooks, params_of, run_dir, profile, publish, progress)


def _run(notebooks, params_of, run_dir: Path, profile: str, publish: bool, progress: bool) -> Path:
    manifest_path = run_dir / "manifest.json"
    manifest = {"status": "running", "started": _dt.datetime.now().isoformat(timespec="seconds"),
                "pid": os.getpid(), "host": socket.gethostname(), "planned": [nb.stem for nb in notebooks],
                "current": None, "profile": profile, "publish": publish, "run_dir": str(run_dir),
                "figures_dir": str(run_dir / "figures"),
                "data_dir": str(paths.data_dir() if publish else run_dir / "data"),
                "command": " ".join(sys.argv), **provenance.full_record(), "notebooks": []}
    io.write_json(manifest_path, manifest)

    bar = tqdm(notebooks, desc=f"moespec reproduce ({profile})", unit="notebook", disable=not progress)
    current = None
    try:
        with _on_signals(_raise_stop), _notebook_environment(run_dir, publish):
            for nb in bar:
                current = nb
                manifest["current"] = nb.stem   # a killed run's stale manifest names where it was
                io.write_json(manifest_path, manifest)
                bar.set_postfix_str(nb.stem)
                try:
                    result = run_notebook(nb, run_dir, params_of[nb], progress=progress,
                                          show=(lambda line, nb=nb: bar.set_postfix_str(f"{nb.stem} | {line}"))
                                          if progress else None)
                except NotebookError:
                    with _on_signals(signal.SIG_IGN):   # a moment to write down where it stopped
                        manifest.update(status="failed", failed=nb.stem,
                                        finished=_dt.datetime.now().isoformat(timespec="seconds"))
                        io.write_json(manifest_path, manifest)
                    raise
                current = None   # finished: an interrupt from here on falls between notebooks
                manifest["notebooks"].append({"name": result.name, "parameters": result.parameters,
                                              "seed": result.parameters.get("seed"),
                                              "wall_s": round(result.wall_s, 2), "output": str(result.output)})
                io.write_json(manifest_path, manifest)
    except KeyboardInterrupt as exc:
        signum = getattr(exc, "signum", signal.SIGINT)
        name = signal.Signals(signum).name
        with _on_signals(signal.SIG_IGN):   # a moment to write down where it stopped
            where = mark_interrupted(run_dir / current.name, name) if current is not None else None
            manifest.update(status="interrupted", finished=_dt.datetime.now().isoformat(timespec="seconds"),
                            interrupted={"signal": name, "notebook": current.stem if current else None,
                                         "cell": where, "output": str(run_dir / current.name) if current else None})
            io.write_json(manifest_path, manifest)
        raise RunInterrupted(name, 128 + int(signum), current.stem if current else None, where,
                             manifest_path) from None
    finally:
        bar.close()
    manifest.update(status="complete", current=None, finished=_dt.datetime.now().isoformat(timespec="seconds"))
    if publish:
        manifest["published"] = {"figures": str(paths.committed_figures_dir())}
    io.write_json(manifest_path, manifest)
    from moespec.report import write_run_report   # the run's REPORT.md, beside its figures (published with them)
    write_run_report(run_dir)
    if publish:
        with _on_signals(signal.SIG_IGN):   # figures/ is never left half-refreshed
            removed = publish_figures(run_dir, manifest_path)
        if removed:
            print(f"moespec reproduce: removed from figures/ (not produced by this run): {removed}", file=sys.stderr)
    return manifest_path


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` strings; values are read as Python literals where possible. A key given
    twice with different values is refused (the same value twice is fine)."""
    out = {}
    for item in items:
        if "=" not in item:
            raise NotebookError(f"parameter {item!r} is not KEY=VALUE")
        key, value = item.split("=", 1)
        key = key.strip()
        value = _literal(value)
        if key in out and out[key] != value:
            raise NotebookError(f"parameter {key!r} given twice with different values: {out[key]!r} and {value!r}")
        out[key] = value
    return out


os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet the kernel's debugger warning
