"""Prometheus text exposition (what a server's ``/metrics`` answers): the speculative-decoding
counters of vLLM (``vllm:``) and llama.cpp (``llamacpp:``), and SGLang's gauges.

Counters are cumulative since the server started: one scrape gives the whole life of the server,
two scrapes of one server (before and after a workload) give the workload, as their difference.
vLLM labels every series with ``model_name`` and ``engine`` (one per engine core of a
data-parallel server); the engines are summed. Per-position counts carry a zero-based
``position`` label: position 0 counts the verify steps that accepted at least one draft.
llama.cpp prints its totals as doubles to six significant digits (``1.23457e+06``): every value
carries the half unit of its last printed digit, and the checks between counters allow it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from .profile import AcceptanceError, AcceptanceProfile, check_counts

_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
SUMMED = ("engine",)
#: The largest share of a rounded verify-step count (six printed digits) a profile is read from.
STEPS_ROUNDING_LIMIT = 0.01


def resolution(raw: str) -> float:
    """Half a unit of the last digit ``raw`` prints, at least 0.5 (the counters count whole events):
    ``1.23457e+06`` -> 5, ``1234567`` -> 0.5."""
    mantissa, _, exponent = raw.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return max(0.5, 0.5 * 10.0 ** ((int(exponent) if exponent else 0) - decimals))


def samples(text: str, where: str, prefix: str) -> list[tuple[int, str, dict, float, float]]:
    """(line, name, labels, value, resolution) of every sample whose name starts with ``prefix``
    (:func:`resolution`); a malformed one is refused naming its line."""
    out = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line.startswith(prefix):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise AcceptanceError(f"{where}: line {lineno}: expected a sample 'name{{labels}} value'; found "
                                  f"{line[:80]!r}", where=where, field=f"line {lineno}", found=line[:80])
        name, body, raw = m.groups()
        labels, rest = {}, body or ""
        while rest.strip():
            lm = _LABEL.match(rest)
            if lm is None:
                raise AcceptanceError(f"{where}: line {lineno}: expected labels name=\"value\"; found {{{body}}}",
                                      where=where, field=f"line {lineno}", found=body)
            labels[lm.group(1)] = lm.group(2)
            rest = rest[lm.end():]
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise AcceptanceError(f"{where}: line {lineno}: {name}: expected a finite number; found {raw!r}",
                                  where=where, field=f"line {lineno}", found=raw)
        out.append((lineno, name, labels, value, resolution(raw)))
    return out


def _series(path: Path, prefix: str) -> tuple[dict, dict]:
    """{(name, labels without the summed ones, position): value} summed over the ``engine`` label,
    and the same keys' rounding (the resolutions of the values printed rounded, summed; 0 where
    every value is a whole count printed exactly); ``_created`` samples (the counters' start times)
    left out."""
    out, res = {}, {}
    for _, name, labels, value, half_unit in samples(path.read_text(errors="replace"), str(path), prefix):
        if name.endswith("_created"):
            continue
        key = (name, tuple(sorted((k, v) for k, v in labels.items() if k not in SUMMED + ("position",))),
               labels.get("position"))
        out[key] = out.get(key, 0.0) + value
        res[key] = res.get(key, 0.0) + (half_unit if half_unit > 0.5 else 0.0)   # whole counts printed exactly: 0
    return out, res


def _difference(before: dict, after: dict, where: str) -> dict:
    out = {}
    for key, value in after.items():
        change = value - before.get(key, 0.0)
        if change < 0:
            name, labels, pos = key
            shown = name + (f"{{position=\"{pos}\"}}" if pos is not None else "")
            raise AcceptanceError(f"{where}: {shown}: expected the second scrape's counter >= the first's (one "
                                  f"server, scraped before and after); found {before[key]:g} then {value:g} (the "
                                  "server restarted, or the files are in the wrong order)", where=where, field=shown,
                                  found=change)
        out[key] = change
    return out


def counters_profile(files: list[Path], prefix: str, engine: str, source: str) -> AcceptanceProfile:
    """The per-position profile of ``{prefix}spec_decode_num_drafts_total`` and
    ``{prefix}spec_decode_num_accepted_tokens_per_pos_total{position}`` in one scrape or the
    difference of two (the second minus the first), checked against
    ``{prefix}spec_decode_num_accepted_tokens_total`` where present."""
    where = " minus ".join(str(f) for f in reversed(files))
    series, res = _series(files[0], prefix)
    if len(files) == 2:
        after, res_after = _series(files[1], prefix)
        series = _difference(series, after, where)
        res = {key: res.get(key, 0.0) + r for key, r in res_after.items()}
    elif len(files) > 2:
        raise AcceptanceError(f"{where}: expected one scrape or two (before and after); found {len(files)} files",
                              where=where, found=len(files))
    drafts_name = f"{prefix}spec_decode_num_drafts_total"
    pos_name = f"{prefix}spec_decode_num_accepted_tokens_per_pos_total"
    models = sorted({labels for (name, labels, _) in series if name in (drafts_name, pos_name)})
    if len(models) > 1:
        raise AcceptanceError(f"{where}: {drafts_name}: expected the series of one model (the engine label is summed); "
                              f"found {len(models)} label sets {models}", where=where, field=drafts_name)
    drafts = sum(v for (name, _, _), v in series.items() if name == drafts_name)
    drafts_res = sum(r for (name, _, _), r in res.items() if name == drafts_name)
    if not any(name == drafts_name for (name, _, _) in series):
        raise AcceptanceError(f"{where}: expected the counter {drafts_name} (speculative decoding on, metrics "
                              "exposed); found none", where=where, field=drafts_name)
    per_pos = {}
    for (name, _, pos), v in series.items():
        if name == pos_name:
            if pos is None or not pos.isdigit():
                raise AcceptanceError(f"{where}: {pos_name}: expected a label position=\"0\", \"1\", ...; found "
                                      f"{pos!r}", where=where, field=pos_name, found=pos)
            per_pos[int(pos)] = per_pos.get(int(pos), 0.0) + v
    if not per_pos:
        raise AcceptanceError(f"{where}: expected the counters {pos_name}{{position}}; found none", where=where,
                              field=pos_name)
    missing = sorted(set(range(max(per_pos) + 1)) - set(per_pos))
    if missing:
        raise AcceptanceError(f"{where}: {pos_name}: expected positions 0..{max(per_pos)}; positions {missing} "
                              "missing", where=where, field=pos_name, found=sorted(per_pos))
    at_least = np.array([per_pos[i] for i in range(len(per_pos))])
    notes = []
    if drafts_res > 0:      # a rounded total: its uncertainty beside the count
        share = drafts_res / drafts if drafts > 0 else np.inf
        if share > STEPS_ROUNDING_LIMIT:
            raise AcceptanceError(f"{where}: {drafts_name}: expected a step count known to {STEPS_ROUNDING_LIMIT:.0%}; "
                                  f"found {drafts:g} +- {drafts_res:g} (printed to six significant digits): difference "
                                  "scrapes further apart", where=where, field=drafts_name, found=drafts)
        notes.append(f"{drafts_name} printed rounded: {drafts:g} +- {drafts_res:g} verify steps ({share:.2%})")
        drafts = max(drafts, float(at_least[0])) if at_least[0] - drafts <= drafts_res else drafts
    counts = check_counts(drafts, at_least, where, "")
    acc_name = f"{prefix}spec_decode_num_accepted_tokens_total"
    accepted = [v for (name, _, _), v in series.items() if name == acc_name]
    acc_res = sum(r for (name, _, _), r in res.items() if name == acc_name)
    if accepted and abs(sum(accepted) - at_least.sum()) > max(0.5, acc_res):
        raise AcceptanceError(f"{where}: {acc_name}: expected the sum of the per-position counts, "
                              f"{at_least.sum():g}; found {sum(accepted):g}", where=where, field=acc_name,
                              expected=float(at_least.sum()), found=float(sum(accepted)))
    what = f"{source}, difference of two scrapes" if len(files) == 2 else f"{source}, one scrape (the server's life)"
    return AcceptanceProfile(counts, engine, what, [str(f) for f in files], notes=notes)
