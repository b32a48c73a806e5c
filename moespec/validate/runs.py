"""Run manifests and run status: whether the tables of a run folder are those of a finished run.

``moespec reproduce`` writes ``manifest.json`` with ``status`` ``running`` while it runs, then
``complete``, ``failed`` (the notebook that failed) or ``interrupted`` (the notebook and cell); a
sweep job's manifest says ``running``, ``finished`` or ``failed``; the committed ``figures/`` carry
the publishing run's manifest as ``MANIFEST.json``. A run killed without a chance to write (SIGKILL,
a lost machine) stays ``running`` for ever: :func:`run_status` tells such a stale manifest from a
live run by the run folder's lock (``.moespec-run.lock``, held by the live process,
:func:`moespec.runner.hold_folder`), else by the process id and host the manifest records.

:func:`require_complete` is what ``moespec advise`` and ``moespec report`` call before reading a
run's tables: an unfinished run is refused, naming its status and notebook, unless the caller
allows it (``--allow-incomplete``); the notebooks of the run that is calling (a notebook reading
the tables its own run's earlier notebooks wrote) are allowed.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from . import jsonfile
from .errors import InputError

MANIFEST_NAMES = ("manifest.json", "MANIFEST.json")
LOCK_NAME = ".moespec-run.lock"
#: Statuses of a run that finished (``moespec reproduce``: complete; a sweep job: finished).
FINISHED = ("complete", "finished")
STATUSES = ("running", "complete", "finished", "failed", "interrupted")

_NOTEBOOK = {"type": "object", "required": ["name"],
             "properties": {"name": {"type": "string", "minLength": 1},
                            "wall_s": {"type": ["number", "null"]},
                            "parameters": {"type": "object"},
                            "output": {"type": "string"}}}
#: JSON Schema of a manifest as far as moespec reads it (runs of every version, sweep jobs).
MANIFEST_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "properties": {
        "status": {"enum": list(STATUSES)},
        "failed": {"type": ["string", "null"]},
        "notebook": {"type": "string"},
        "current": {"type": ["string", "null"]},
        "planned": {"type": "array", "items": {"type": "string"}},
        "notebooks": {"type": "array", "items": _NOTEBOOK},
        "interrupted": {"type": ["object", "null"], "properties": {"notebook": {"type": ["string", "null"]},
                                                                   "cell": {"type": ["string", "null"]}}},
        "started": {"type": ["string", "null"]},
        "finished": {"type": ["string", "null"]},
        "git_commit": {"type": ["string", "null"]},
        "profile": {"type": "string"},
        "publish": {"type": "boolean"},
        "run_dir": {"type": "string"},
        "figures_dir": {"type": "string"},
        "pid": {"type": "integer"},
        "host": {"type": "string"},
        "hardware": {"type": "object", "properties": {"cpu": {"type": "object"}, "gpus": {"type": "array"},
                                                      "host": {"type": "string"}}},
        "versions": {"type": "object"},
    },
}


def read_manifest(path: str | Path, error: type[InputError] = InputError) -> dict:
    """A manifest, checked against :data:`MANIFEST_SCHEMA` (errors name the file and field)."""
    return jsonfile.read(path, MANIFEST_SCHEMA, "run manifest", error)


def find_manifest(folder: str | Path) -> Path | None:
    """The manifest that describes ``folder``: its own ``manifest.json`` / ``MANIFEST.json``, or,
    for the ``figures/`` folder of a run, the run folder's ``manifest.json``."""
    folder = Path(folder)
    for name in MANIFEST_NAMES:
        if (folder / name).is_file():
            return folder / name
    if folder.name == "figures" and (folder.parent / "manifest.json").is_file():
        return folder.parent / "manifest.json"
    return None


@dataclass
class RunStatus:
    """What a manifest says about its run. ``status``: one of :data:`STATUSES`, or ``unknown``
    (no manifest: a folder of tables written by hand). ``notebook``: the notebook that failed, was
    interrupted or (while running) was running, where the manifest says. ``finished``: the
    notebooks that finished. ``stale``: for a ``running`` manifest, True when the process that
    ran it is gone, False when it lives, None when that cannot be told from here. ``own``: the run
    is the one this process belongs to (``MOESPEC_RUN_DIR``)."""

    manifest: Path | None
    status: str
    notebook: str | None = None
    finished: list = field(default_factory=list)
    stale: bool | None = None
    holder: str = ""
    own: bool = False

    @property
    def complete(self) -> bool:
        return self.status in FINISHED or self.status == "unknown"

    def describe(self) -> str:
        """The status in words, e.g. ``status 'running', but its process (pid 4242 on host a) is gone``."""
        if self.status == "unknown":
            return "no manifest (tables written outside moespec reproduce)"
        text = f"status {self.status!r}"
        if self.notebook:
            text += f" in notebook {self.notebook}"
        if self.status == "running":
            if self.stale:
                text += (f", but the process that ran it{f' ({self.holder})' if self.holder else ''} is gone: "
                         "the run was killed before it could record how it ended (a stale manifest)")
            elif self.stale is False:
                text += f", still running ({self.holder})" if self.holder else ", still running"
            else:
                text += f"; whether it still runs cannot be told from here ({self.holder or 'no process recorded'})"
        done = ", ".join(self.finished) if self.finished else "none"
        return f"{text}; notebooks finished: {done}"


def _lock_state(folder: Path) -> tuple[bool | None, str]:
    """(held, who) from the run folder's lock file: held True/False, None without a lock file."""
    path = folder / LOCK_NAME
    if not path.is_file():
        return None, ""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None, ""
    try:
        who = ""
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode(errors="replace") or "{}")
            if isinstance(info, dict) and info.get("pid"):
                who = f"pid {info.get('pid')} on host {info.get('host')}"
        except ValueError:
            pass
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True, who
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False, who
    finally:
        os.close(fd)


def _process_alive(pid: int, host: str | None) -> bool | None:
    """Whether process ``pid`` lives; None when it ran on another host."""
    if host and host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _own_run(run_dir: Path) -> bool:
    own = os.environ.get("MOESPEC_RUN_DIR")
    try:
        return bool(own) and Path(own).resolve() == run_dir.resolve()
    except OSError:
        return False


def status_from(man: dict, path: Path | None) -> RunStatus:
    """The :class:`RunStatus` a manifest ``man`` (read from ``path``, None if unknown) describes."""
    status = man.get("status")
    if status is None:  # manifests of early versions: only 'failed' on failure
        status = "failed" if man.get("failed") else "complete"
    finished = [nb["name"] for nb in man.get("notebooks", [])]
    notebook = None
    if status not in FINISHED:
        notebook = (man.get("failed") or (man.get("interrupted") or {}).get("notebook") or man.get("current")
                    or man.get("notebook"))
    out = RunStatus(path, status, notebook, finished)
    run_dir = path.parent if path is not None else Path(man.get("run_dir") or ".")
    out.own = path is not None and _own_run(run_dir)
    if status == "running":
        held, who = _lock_state(run_dir) if path is not None else (None, "")
        if held is not None:
            out.stale, out.holder = not held, who
        elif isinstance(man.get("pid"), int):
            host = man.get("host") or (man.get("hardware") or {}).get("host")
            alive = _process_alive(man["pid"], host)
            out.stale = None if alive is None else not alive
            out.holder = f"pid {man['pid']} on host {host}"
    return out


def run_status(folder: str | Path, error: type[InputError] = InputError) -> RunStatus:
    """The status of the run that wrote ``folder`` (a run folder, its ``figures/``, the committed
    ``figures/``, a sweep job folder); see :class:`RunStatus`."""
    path = find_manifest(folder)
    return RunStatus(None, "unknown") if path is None else status_from(read_manifest(path, error), path)


def refuse_incomplete(status: RunStatus, what: str, error: type[InputError] = InputError):
    """Raise ``error`` for an unfinished run, naming its manifest, status and notebook."""
    raise error(f"{status.manifest or 'the run manifest'}: field status: the run did not finish: expected "
                f"{' or '.join(FINISHED)}; found {status.describe()}. Its tables may be partial or missing; {what} "
                "refuses them (--allow-incomplete uses them anyway and says which notebooks' tables it used)",
                where=str(status.manifest), field="status", expected=" or ".join(FINISHED), found=status.status)


def require_complete(folder: str | Path, allow_incomplete: bool = False, what: str = "this command",
                     error: type[InputError] = InputError) -> RunStatus:
    """The run's :class:`RunStatus`; refuses (``error``) a run that did not finish (running,
    failed, interrupted, a stale ``running``), naming the manifest, its status and notebook,
    unless ``allow_incomplete`` or the run is the caller's own (:attr:`RunStatus.own`)."""
    status = run_status(folder, error)
    if not (status.complete or allow_incomplete or status.own):
        refuse_incomplete(status, what, error)
    return status
