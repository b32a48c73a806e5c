"""What a long measurement is doing, shown outside its notebook: ``moespec reproduce`` prints, beside
the notebook and its cell, the sweep a cell is running (its name, how far it is, the time left at
its rate so far).

A bar made with :class:`tqdm` here is tqdm.auto's (a widget in a notebook, text elsewhere) that also
appends its line to the file the environment variable :data:`ENV` names, at most every
:data:`INTERVAL` seconds and when it closes. The runner sets the variable for each notebook's kernel
(``<run>/logs/<notebook>.progress``, which stays as the log of what was measured when) and shows the
file's last line. Without the variable a bar is tqdm.auto's alone.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tqdm.auto import tqdm as _tqdm

ENV = "MOESPEC_PROGRESS"
INTERVAL = 2.0


def publish(text: str) -> None:
    """Append ``text`` as one line to the progress file (:data:`ENV`), if one is set."""
    path = os.environ.get(ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(" ".join(str(text).split()) + "\n")
    except OSError:   # progress is a courtesy: a full disk or a removed folder never stops a measurement
        pass


def last_line(path: str | Path) -> str:
    """The last line of a progress file ("" when there is none yet)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 4096))
            lines = fh.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


class tqdm(_tqdm):  # noqa: N801 (tqdm's own name: a drop-in for ``from tqdm.auto import tqdm``)
    """tqdm.auto's bar that also publishes its line (:func:`publish`): description, count of total,
    elapsed and estimated time left."""

    def __init__(self, *args, **kwargs):
        self._published = 0.0
        super().__init__(*args, **kwargs)
        self._publish(force=True)

    def update(self, n=1):
        shown = super().update(n)
        self._publish()
        return shown

    def close(self):
        if not getattr(self, "disable", True):
            self._publish(force=True)
        super().close()

    def _publish(self, force: bool = False) -> None:
        if self.disable or not os.environ.get(ENV):
            return
        now = time.monotonic()
        if force or now - self._published >= INTERVAL:
            self._published = now
            publish(self.format_meter(**{**self.format_dict, "ncols": 0}))
