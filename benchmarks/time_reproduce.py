"""``make reproduce`` on a fresh clone, timed end to end (issue 16, item 5: at most 90 minutes on
this machine, installation and training included).

Clones the repository at ``--commit`` (default: HEAD) into ``--into`` (a new folder), runs
``make reproduce`` there with the wall clock around the whole command (creating ``.venv``,
installing, building the extension, training or loading the models, every notebook on the full
profile), and writes ``benchmarks/results/reproduce/<stamp>_reproduce.json``: the total, the exit
status, the part spent before the first notebook started (installation and build, from the run's
manifest), each notebook's wall time, the machine and versions. The clone's ``figures/`` is what
that run published; copy it into the repository to commit it.

A run already made by hand (``date -u +%s`` before and after ``make reproduce`` in a fresh clone)
is recorded with ``--record DIR --started S --ended S --rc N``; the file says so.

Run: ``.venv/bin/python benchmarks/time_reproduce.py --into /tmp/moespec-clone``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import time
from pathlib import Path

from moespec import io, paths, provenance
from moespec.measure import protocols


def _iso_epoch(text: str) -> float:
    """A manifest's local ISO time (the run's clock, UTC on these machines) as seconds since the epoch."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp()


def record(clone: Path, started: float, ended: float, rc: int, how: str) -> dict:
    """The timing record of a ``make reproduce`` in ``clone`` that ran from ``started`` to ``ended``
    (seconds since the epoch) and exited with ``rc``."""
    manifest_path = clone / "figures" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if rc == 0 and manifest_path.exists() else {}
    notebooks = [{"name": nb["name"], "wall_s": nb.get("wall_s")} for nb in manifest.get("notebooks", [])]
    before = _iso_epoch(manifest["started"]) - started if manifest.get("started") else None
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    return {"commit": commit, "rc": rc, "how": how,
            "started_utc": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
            "total_s": round(ended - started, 1), "before_notebooks_s": None if before is None else round(before, 1),
            "notebooks": notebooks, "run_started": manifest.get("started"), "run_finished": manifest.get("finished"),
            "provenance": provenance.full_record()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", type=Path, help="a new folder for the clone (timed run)")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--record", type=Path, help="a clone where make reproduce already ran (with --started/--ended/--rc)")
    ap.add_argument("--started", type=float)
    ap.add_argument("--ended", type=float)
    ap.add_argument("--rc", type=int)
    ap.add_argument("--out", type=Path, default=paths.ROOT / "benchmarks" / "results" / "reproduce")
    args = ap.parse_args(argv)
    if args.record is not None:
        if None in (args.started, args.ended, args.rc):
            ap.error("--record needs --started, --ended and --rc")
        rec = record(args.record, args.started, args.ended, args.rc,
                     "timed by hand: date -u +%s before and after `make reproduce` in a fresh clone")
    elif args.into is not None:
        if args.into.exists():
            ap.error(f"--into {args.into} exists; the clone must be fresh")
        subprocess.run(["git", "clone", "-q", str(paths.ROOT), str(args.into)], check=True)
        subprocess.run(["git", "-C", str(args.into), "checkout", "-q", args.commit], check=True)
        started = time.time()
        rc = subprocess.run(["make", "reproduce"], cwd=args.into).returncode
        rec = record(args.into, started, time.time(), rc, "timed by benchmarks/time_reproduce.py")
    else:
        ap.error("give --into (time a fresh clone) or --record (a run made by hand)")
    path = io.write_json(paths.ensure(args.out) / f"{protocols.stamp()}_reproduce.json", rec)
    print(f"make reproduce: exit {rec['rc']}, {rec['total_s'] / 60:.1f} min end to end "
          f"(commit {rec['commit'][:7]}); {path}")
    return rec


if __name__ == "__main__":
    main()
