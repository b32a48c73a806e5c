"""Per-request acceptance histograms (vLLM's and SGLang's responses): reading JSON, JSONL or a
JSON list of responses, and pooling the requests' histograms into one profile with one prompt
per request."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .profile import AcceptanceError, AcceptanceProfile, check_counts


def json_records(path: Path) -> list[tuple[str, object]]:
    """(label, object) per response: a JSON document (one response, or a list of them) or JSONL
    (one per line); a line that is not JSON is refused naming it."""
    text = path.read_text(errors="replace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        out = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    out.append((f"line {lineno}", json.loads(line)))
                except json.JSONDecodeError as exc:
                    raise AcceptanceError(f"{path}: line {lineno}: expected one JSON object per line (JSONL); found "
                                          f"{line.strip()[:60]!r} ({exc.msg})", where=str(path),
                                          field=f"line {lineno}") from None
        return out
    if isinstance(doc, list):
        return [(f"item {i}", x) for i, x in enumerate(doc)]
    return [("document", doc)]


def count_list(value, where: str, field: str) -> np.ndarray:
    """A histogram as counts per accepted-draft count j = 0..: a dense list or a sparse map
    {"j": count}; counts must be non-negative integers."""
    if isinstance(value, dict):
        try:
            keys = {int(k): v for k, v in value.items()}
        except (TypeError, ValueError):
            raise AcceptanceError(f"{where}: {field}: expected keys 0, 1, 2, ... (accepted drafts); found "
                                  f"{list(value)[:6]}", where=where, field=field) from None
        if any(k < 0 for k in keys):
            raise AcceptanceError(f"{where}: {field}: expected keys >= 0; found {sorted(keys)[:6]}", where=where,
                                  field=field)
        dense = [keys.get(j, 0) for j in range(max(keys, default=-1) + 1)]
    elif isinstance(value, list):
        dense = value
    else:
        raise AcceptanceError(f"{where}: {field}: expected a list of counts; found {type(value).__name__}",
                              where=where, field=field, found=value)
    for j, c in enumerate(dense):
        if isinstance(c, bool) or not isinstance(c, (int, float)) or c < 0 or c != int(c):
            raise AcceptanceError(f"{where}: {field}[{j}]: expected a count >= 0; found {c!r}", where=where,
                                  field=f"{field}[{j}]", expected=">= 0", found=c)
    return np.asarray(dense, dtype=float)


def histogram_counts(hist: np.ndarray, K: int, where: str, field: str, steps=None, accepted=None):
    """Counts (verify steps, steps accepting at least i = 1..K) of a histogram h[j] = steps that
    accepted exactly j drafts, checked against the step and accepted-draft totals where given."""
    if hist.size > K + 1:
        raise AcceptanceError(f"{where}: {field}: expected at most K + 1 = {K + 1} entries (0..{K} accepted); found "
                              f"{hist.size}", where=where, field=field, found=int(hist.size))
    h = np.concatenate([hist, np.zeros(K + 1 - hist.size)])
    total = h.sum()
    if steps is not None and int(steps) != int(total):
        raise AcceptanceError(f"{where}: {field}: expected its counts to sum to the {int(steps)} verify steps; found "
                              f"{int(total)}", where=where, field=field, expected=int(steps), found=int(total))
    if accepted is not None and int(accepted) != int((np.arange(K + 1) * h).sum()):
        raise AcceptanceError(f"{where}: {field}: expected sum of j x count = the {int(accepted)} accepted drafts; "
                              f"found {int((np.arange(K + 1) * h).sum())}", where=where, field=field,
                              expected=int(accepted), found=int((np.arange(K + 1) * h).sum()))
    if total == 0:
        return None
    at_least = np.cumsum(h[::-1])[::-1][1:]
    return check_counts(total, at_least, where, field)


def pooled_requests(requests: list, engine: str, source: str, files: list, notes: list) -> AcceptanceProfile:
    """One profile of requests' counts ``[(prompt, Counts)]``: K the longest (shorter ones padded
    with zeros: a step cannot accept a draft that was not proposed), pooled over every verify
    step, one prompt per request."""
    where = ", ".join(map(str, files))
    if not requests:
        raise AcceptanceError(f"{where}: expected at least one request with speculative decoding counts; found none",
                              where=where)
    K = max(c.K for _, c in requests)
    prompts, steps, at_least = {}, 0.0, np.zeros(K)
    for name, c in requests:
        padded = check_counts(c.steps, np.concatenate([c.at_least, np.zeros(K - c.K)]), where, "")
        label, n = name, 2
        while label in prompts:
            label, n = f"{name} ({n})", n + 1
        prompts[label] = padded
        steps += padded.steps
        at_least += padded.at_least
    return AcceptanceProfile(check_counts(steps, at_least, where, ""), engine, source, [str(f) for f in files],
                             prompts, notes=list(notes))
