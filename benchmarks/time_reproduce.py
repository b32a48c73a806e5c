"""``make reproduce`` (or ``make test``) on a fresh clone, timed end to end (issue 16, item 5: at
most 90 minutes on this machine, installation and training included).

Clones the repository at ``--commit`` (default: HEAD) into ``--into`` (a new folder), runs
``make reproduce`` there with the wall clock around the whole command (creating ``.venv``,
installing, building the extension, training or loading the models, every notebook on the full
profile), and writes ``benchmarks/results/reproduce/<stamp>_reproduce.json``: the total, the exit
status, the part spent before the first notebook started (installation and build, from the run's
manifest), each notebook's wall time, the machine and versions. The clone's ``figures/`` is what
that run published; copy it into the repository to commit it.

A run already made by hand (``date -u +%s`` before and after ``make reproduce`` in a fresh clone)
is recorded with ``--record DIR --started S --ended S --rc N``; the file says so.

With ``--target test`` it times ``make test`` instead (installation, the builds and the whole
suite, as CI's ``.ci/run`` starts), keeps pytest's summary (passed, skipped, failed, its own
seconds) from the output, and writes ``benchmarks/results/reproduce/<stamp>_test.json``.

Run: ``.venv/bin/python benchmarks/time_reproduce.py --into /tmp/moespec-clone [--target test]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
import time
from pathlib import Path

from moespec import io, paths, provenance
from moespec.measure import protocols


def _iso_epoch(text: str) -> float:
    """A manifest's local ISO time (the run's clock, UTC on these machines) as seconds since the epoch."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp()


def _timed(clone: Path, started: float, ended: float, rc: int, how: str) -> dict:
    """What every timing record holds: the clone's commit, exit status, how it was timed, start (UTC)
    and total seconds."""
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                            check=True).stdout.strip()
    return {"commit": commit, "rc": rc, "how": how,
            "started_utc": dt.datetime.fromtimestamp(started, dt.timezone.utc).isoformat(timespec="seconds"),
            "total_s": round(ended - started, 1)}


def record(clone: Path, started: float, ended: float, rc: int, how: str) -> dict:
    """The timing record of a ``make reproduce`` in ``clone`` that ran from ``started`` to ``ended``
    (seconds since the epoch) and exited with ``rc``."""
    manifest_path = clone / "figures" / "MANIFEST.json"
    manifest = json.loads(manifest_path.read_text()) if rc == 0 and manifest_path.exists() else {}
    notebooks = [{"name": nb["name"], "wall_s": nb.get("wall_s")} for nb in manifest.get("notebooks", [])]
    before = _iso_epoch(manifest["started"]) - started if manifest.get("started") else None
    return {**_timed(clone, started, ended, rc, how), "before_notebooks_s": None if before is None else round(before, 1),
            "notebooks": notebooks, "run_started": manifest.get("started"), "run_finished": manifest.get("finished"),
            "provenance": provenance.full_record()}


def pytest_summary(output: str) -> dict | None:
    """pytest's last summary line in ``output`` ("== 12 passed, 3 skipped in 61.20s (0:01:01) ==")
    as {outcome: count, ..., "seconds": s}; None when there is none."""
    lines = [ln for ln in output.splitlines() if re.search(r"\b(passed|failed|error|errors)\b.* in [\d.]+s", ln)]
    if not lines:
        return None
    last = lines[-1]
    out = {word.rstrip("s") if word in ("errors", "warnings") else word: int(n)
           for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|warnings?|xfailed|xpassed|deselected)", last)}
    out["seconds"] = float(re.search(r" in ([\d.]+)s", last).group(1))
    return out


def record_test(clone: Path, started: float, ended: float, rc: int, output: str, how: str) -> dict:
    """The timing record of a ``make test`` in ``clone`` from ``started`` to ``ended`` with exit
    status ``rc``, pytest's summary taken from its ``output``."""
    return {"target": "test", **_timed(clone, started, ended, rc, how), "pytest": pytest_summary(output),
            "provenance": provenance.full_record()}


def _run_teed(cmd: list, cwd: Path) -> tuple[int, str]:
    """Run ``cmd`` in ``cwd``, its output passed through to ours as it comes and kept."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kept = []
    for line in proc.stdout:
        sys.stdout.write(line)
        kept.append(line)
    return proc.wait(), "".join(kept)


def _fresh_clone(ap: argparse.ArgumentParser, into: Path, commit: str) -> None:
    """Clone this repository into the new folder ``into`` at ``commit`` (refused where it exists)."""
    if into.exists():
        ap.error(f"--into {into} exists; the clone must be fresh")
    subprocess.run(["git", "clone", "-q", str(paths.ROOT), str(into)], check=True)
    subprocess.run(["git", "-C", str(into), "checkout", "-q", commit], check=True)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--into", type=Path, help="a new folder for the clone (timed run)")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--record", type=Path, help="a clone where make reproduce already ran (with --started/--ended/--rc)")
    ap.add_argument("--started", type=float)
    ap.add_argument("--ended", type=float)
    ap.add_argument("--rc", type=int)
    ap.add_argument("--out", type=Path, default=paths.ROOT / "benchmarks" / "results" / "reproduce")
    ap.add_argument("--target", choices=("reproduce", "test"), default="reproduce",
                    help="the make target to time in the fresh clone (default reproduce)")
    args = ap.parse_args(argv)
    if args.target == "test":
        if args.into is None or args.record is not None:
            ap.error("--target test times a fresh clone: give --into (and no --record)")
        _fresh_clone(ap, args.into, args.commit)
        started = time.time()
        rc, output = _run_teed(["make", "test"], args.into)
        rec = record_test(args.into, started, time.time(), rc, output, "timed by benchmarks/time_reproduce.py --target test")
        path = io.write_json(paths.ensure(args.out) / f"{protocols.stamp()}_test.json", rec)
        print(f"make test: exit {rec['rc']}, {rec['total_s'] / 60:.1f} min end to end (commit {rec['commit'][:7]}); "
              f"pytest {rec['pytest']}; {path}")
        return rec
    if args.record is not None:
        if None in (args.started, args.ended, args.rc):
            ap.error("--record needs --started, --ended and --rc")
        rec = record(args.record, args.started, args.ended, args.rc,
                     "timed by hand: date -u +%s before and after `make reproduce` in a fresh clone")
    elif args.into is not None:
        _fresh_clone(ap, args.into, args.commit)
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
