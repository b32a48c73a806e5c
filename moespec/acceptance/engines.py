"""The engines' own formats, one reader each (the source each was read from: docs/advise.md,
"Acceptance from your engine").

* vLLM: the log line "SpecDecoding metrics: ... Accepted: A tokens, Drafted: D tokens,
  Per-position acceptance rate: r_1, r_2, ..." (several lines pooled by their counts: the steps of
  a line are D / K); per-request ``metrics.speculative_decoding`` (``acceptance_histogram``,
  ``acceptance_histogram_by_draft_length``) or, in builds that attach it per choice,
  ``choices[i].speculative_decoding_stats``;
* SGLang: per-request ``meta_info`` (``spec_accept_histogram`` or ``spec_correct_drafts_histogram``,
  ``spec_verify_ct``) or ``sglext.spec_tokens_details``; the ``accept len`` log field and the
  ``sglang:spec_accept_length`` gauge as a scalar fallback;
* llama.cpp: per request, the line "draft acceptance = ... (A accepted / D generated), mean len =
  L" followed by the trace-level line "acc per pos = (r_1, ...)" of the same slot and task, or the
  one-line form "..., mean acceptance length = L, acceptance rate per position = (r_1, ...)"; the
  "mean len" lines alone, and the older line "draft acceptance rate = ... (A accepted / D
  generated)", as scalar fallbacks.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from .profile import AcceptanceError, AcceptanceProfile, Counts, check_counts
from .records import count_list, histogram_counts, json_records, pooled_requests

_NUM = r"([0-9]+(?:\.[0-9]*)?)"
VLLM_LOG = re.compile(r"SpecDecoding metrics:.*?Accepted: (\d+) tokens, Drafted: (\d+) tokens, "
                      r"Per-position acceptance rate: ([0-9., ]*?)(?:, Avg Draft| *$)")
_LLAMA_COUNTS = rf"{_NUM} \(\s*(\d+) accepted /\s*(\d+) generated\)"    # ratio (A accepted / D generated)
LLAMA_LOG = re.compile(rf"draft acceptance = {_LLAMA_COUNTS}, mean acceptance length =\s*{_NUM}, acceptance rate "
                       rf"per position = \(([^)]*)\)")
LLAMA_OLD = re.compile(rf"draft acceptance rate = {_LLAMA_COUNTS}")
LLAMA_MEAN_LEN = re.compile(rf"draft acceptance = {_LLAMA_COUNTS}, mean len =\s*{_NUM}")
LLAMA_PER_POS = re.compile(r"acc per pos = \(([^)]*)\)")
LLAMA_SLOT = re.compile(r"id\s+(\d+) \| task (\d+) \|")
SGLANG_LOG = re.compile(rf"accept len: {_NUM}")
SCALAR_NOTE = ("scalar fallback: the source gives a mean acceptance length, not a profile; geometric acceptance "
               "assumed at a = 1 - 1/L, a lower bound of the geometric rate at any finite K")


def _rates(text: str, where: str, lineno: int) -> np.ndarray:
    try:
        rates = np.array([float(x) for x in text.replace(" ", "").split(",") if x != ""])
    except ValueError:
        raise AcceptanceError(f"{where}: line {lineno}: per-position rates: expected numbers; found {text!r}",
                              where=where, field=f"line {lineno}") from None
    if rates.size == 0:
        raise AcceptanceError(f"{where}: line {lineno}: per-position rates: expected at least one; found none",
                              where=where, field=f"line {lineno}")
    return rates


def _lines(path: Path, pattern: re.Pattern) -> list[tuple[int, re.Match]]:
    return [(n, m) for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
            if (m := pattern.search(line))]


# --- vLLM -------------------------------------------------------------------------------------------
def vllm_log(files: list[Path]) -> AcceptanceProfile:
    """Every "SpecDecoding metrics" line of ``files``, pooled by its counts: a line's verify steps
    are its drafted tokens over the K positions it prints, its steps accepting at least i drafts
    its rate r_i times those steps."""
    total = None
    for path in files:
        for lineno, m in _lines(path, VLLM_LOG):
            where = f"{path}: line {lineno}"
            accepted, drafted, rates = int(m.group(1)), int(m.group(2)), _rates(m.group(3), str(path), lineno)
            K = rates.size
            if drafted % K:
                raise AcceptanceError(f"{where}: Drafted: expected a multiple of the {K} positions (every step "
                                      f"drafting K tokens); found {drafted} (steps drafted fewer: use the "
                                      "Prometheus counters vllm:spec_decode_num_drafts)", where=str(path),
                                      field=f"line {lineno}", found=drafted)
            counts = check_counts(drafted // K, rates * (drafted // K), str(path), f"line {lineno}")
            if abs(counts.at_least.sum() - accepted) > 0.0005 * K * counts.steps + 1:
                raise AcceptanceError(f"{where}: Accepted: expected the rates times the {counts.steps:g} steps, "
                                      f"{counts.at_least.sum():.0f}; found {accepted}", where=str(path),
                                      field=f"line {lineno}", expected=float(counts.at_least.sum()), found=accepted)
            if total is not None and total.K != K:
                raise AcceptanceError(f"{where}: expected the {total.K} positions of the lines before; found {K}",
                                      where=str(path), field=f"line {lineno}", found=K)
            total = counts if total is None else total + counts
    if total is None:
        raise AcceptanceError(f"{', '.join(map(str, files))}: expected vLLM 'SpecDecoding metrics: ... Per-position "
                              "acceptance rate: ...' lines; found none", where=str(files[0]))
    return AcceptanceProfile(total, "vllm", "vLLM log lines 'SpecDecoding metrics', pooled by their counts",
                             [str(f) for f in files])


def _vllm_stats(obj) -> list[tuple[str, object]]:
    if not isinstance(obj, dict):
        return []
    out = []
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and "speculative_decoding" in metrics:
        out.append(("", metrics["speculative_decoding"]))
    for i, choice in enumerate(obj.get("choices") or []):
        if isinstance(choice, dict) and "speculative_decoding_stats" in choice:
            out.append((f" choice {i}", choice["speculative_decoding_stats"]))
    return out


def vllm_requests(files: list[Path]) -> AcceptanceProfile:
    """vLLM responses with per-request acceptance (``--per-request-spec-decode-metrics``): each
    request's histogram h[j] (steps that accepted exactly j drafts), one prompt per request."""
    requests, notes = [], []
    for path in files:
        for label, obj in json_records(path):
            name = obj.get("id", label) if isinstance(obj, dict) else label
            for suffix, stats in _vllm_stats(obj):
                where, field = f"{path}", f"{label}{suffix}: speculative decoding"
                if stats is None:
                    continue
                if not isinstance(stats, dict):
                    raise AcceptanceError(f"{where}: {field}: expected an object; found {stats!r:.60}", where=where,
                                          field=field)
                hist = stats.get("acceptance_histogram")
                by_len = stats.get("acceptance_histogram_by_draft_length")
                K = stats.get("num_spec_tokens")
                rows = {}
                if by_len is not None:
                    if not isinstance(by_len, dict):
                        raise AcceptanceError(f"{where}: {field}.acceptance_histogram_by_draft_length: expected an "
                                              f"object {{k: counts}}; found {by_len!r:.60}", where=where, field=field)
                    rows = {k: count_list(v, where, f"{field}.acceptance_histogram_by_draft_length[{k}]")
                            for k, v in by_len.items()}
                    if len([k for k, r in rows.items() if r.sum() > 0]) > 1:
                        notes.append("drafts of several lengths (acceptance_histogram_by_draft_length): a step of a "
                                     "shorter draft counts in every position's denominator, as vLLM's counters do")
                if hist is None and not rows:
                    raise AcceptanceError(f"{where}: {field}: expected acceptance_histogram (or "
                                          "acceptance_histogram_by_draft_length); found neither", where=where,
                                          field=field)
                h = count_list(hist, where, f"{field}.acceptance_histogram") if hist is not None else None
                if rows:
                    width = max([r.size for r in rows.values()] + ([h.size] if h is not None else []))
                    summed = sum(np.concatenate([r, np.zeros(width - r.size)]) for r in rows.values())
                    if h is not None and not np.array_equal(np.concatenate([h, np.zeros(width - h.size)]), summed):
                        raise AcceptanceError(f"{where}: {field}.acceptance_histogram: expected the sum of the rows "
                                              f"by draft length {summed.astype(int).tolist()}; found "
                                              f"{h.astype(int).tolist()}", where=where, field=field)
                    h = summed if h is None else h
                K = int(K) if isinstance(K, (int, float)) and K > 0 else h.size - 1
                c = histogram_counts(h, K, where, f"{field}.acceptance_histogram", stats.get("num_spec_steps"),
                                     stats.get("num_accepted_draft_tokens"))
                if c is not None:
                    requests.append((f"{name}{suffix}", c))
    return pooled_requests(requests, "vllm", "vLLM per-request acceptance histograms", files, notes)


# --- SGLang -----------------------------------------------------------------------------------------
def _sglang_meta(obj) -> list[tuple[str, dict]]:
    if not isinstance(obj, dict):
        return []
    out = [("", obj["meta_info"])] if isinstance(obj.get("meta_info"), dict) else []
    ext = obj.get("sglext")
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    if isinstance(details, dict):
        out.append((" sglext", details))
    elif isinstance(details, list):
        out += [(f" sglext[{i}]", d) for i, d in enumerate(details) if isinstance(d, dict)]
    return out


def sglang_requests(files: list[Path]) -> AcceptanceProfile:
    """SGLang responses: per request the histogram of accepted drafts per verify step
    (``spec_correct_drafts_histogram``, or its older name ``spec_accept_histogram``) and
    ``spec_verify_ct``; K from the proposed drafts per step where the response gives them
    (``spec_num_proposed_drafts`` / ``spec_verify_ct``), else the longest run of accepted drafts
    seen (said in the notes)."""
    requests, notes = [], []
    for path in files:
        for label, obj in json_records(path):
            name = obj.get("meta_info", {}).get("id", label) if isinstance(obj, dict) else label
            for suffix, meta in _sglang_meta(obj):
                where, field = str(path), f"{label}{suffix}"
                new, old = meta.get("spec_correct_drafts_histogram"), meta.get("spec_accept_histogram")
                if new is not None and old is not None and list(new) != list(old):
                    raise AcceptanceError(f"{where}: {field}.spec_accept_histogram: expected the same counts as "
                                          f"spec_correct_drafts_histogram {new}; found {old}", where=where, field=field)
                hist = new if new is not None else old
                if hist is None:
                    continue
                h = count_list(hist, where, f"{field}.spec_correct_drafts_histogram")
                verify = meta.get("spec_verify_ct")
                proposed = meta.get("spec_num_proposed_drafts", meta.get("spec_proposed_drafts"))
                if verify and proposed and proposed % verify == 0:
                    K = int(proposed // verify)
                else:
                    K = h.size - 1
                    notes.append("K taken as the longest run of accepted drafts seen (the response gives no proposed "
                                 "drafts per step)")
                accepted = meta.get("spec_num_correct_drafts", meta.get("spec_accepted_drafts"))
                c = histogram_counts(h, K, where, f"{field}.spec_correct_drafts_histogram", verify, accepted)
                if c is not None:
                    requests.append((f"{name}{suffix.replace(' sglext', '')}", c))
    return pooled_requests(requests, "sglang", "SGLang per-request acceptance histograms (meta_info / sglext)",
                           files, list(dict.fromkeys(notes)))


def scalar_profile(lengths: list[float], engine: str, source: str, files: list[Path]) -> AcceptanceProfile:
    """A scalar fallback: the mean of the mean acceptance lengths read (no counts to weight them)."""
    where = ", ".join(map(str, files))
    L = float(np.mean(lengths))
    if not L > 1:
        raise AcceptanceError(f"{where}: mean acceptance length: expected > 1 (some draft accepted); found {L:g}",
                              where=where, field="accept length", found=L)
    return AcceptanceProfile(None, engine, f"{source} ({len(lengths)} value(s) averaged)", [str(f) for f in files],
                             scalar=1 - 1 / L, notes=[SCALAR_NOTE + f"; L = {L:.3f}"], scalar_length=L)


def sglang_scalar(files: list[Path]) -> AcceptanceProfile:
    """SGLang's ``accept len`` log field or ``sglang:spec_accept_length`` gauge (tokens per verify
    step, the bonus token included): a scalar fallback."""
    from .prometheus import samples

    lengths = [float(m.group(1)) for path in files for _, m in _lines(path, SGLANG_LOG)]
    if not lengths:
        lengths = [v for path in files for _, name, _, v, _ in samples(path.read_text(errors="replace"), str(path),
                                                                     "sglang:spec_accept_length")]
    if not lengths:
        raise AcceptanceError(f"{files[0]}: expected 'accept len:' log fields or the sglang:spec_accept_length gauge; "
                              "found neither", where=str(files[0]))
    return scalar_profile(lengths, "sglang", "SGLang accept len (log field or gauge)", files)


# --- llama.cpp --------------------------------------------------------------------------------------
def _llama_request(accepted: int, generated: int, L: float, rates: np.ndarray, where: str, lineno: int) -> Counts:
    """One request's counts from its printed rates (accepted-at-least-i steps over verify steps):
    its verify steps are its accepted drafts over the sum of its rates."""
    if rates.sum() > 0:
        steps = accepted / rates.sum()
    elif L > 1:
        steps = accepted / (L - 1)
    else:
        steps = generated / rates.size
    return check_counts(steps, rates * steps, where, f"line {lineno}")


def _llama_split_form(path: Path) -> tuple[list, list, int]:
    """The two-line form: each "mean len" line paired with the next "acc per pos" line of the same
    slot and task. (requests with both, (accepted, L) of "mean len" lines left without rates, the
    requests with no verify step: "acc per pos = ()")."""
    requests, alone, empty, open_lines = [], [], 0, {}
    for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        slot = LLAMA_SLOT.search(line)
        key = slot.groups() if slot else None
        if m := LLAMA_MEAN_LEN.search(line):
            if key in open_lines:
                alone.append(open_lines.pop(key)[:2])
            open_lines[key] = (int(m.group(2)), float(m.group(4)), int(m.group(3)), lineno)
        elif (m := LLAMA_PER_POS.search(line)) and key in open_lines:
            accepted, L, generated, first = open_lines.pop(key)
            if not m.group(1).strip():
                empty += 1
                continue
            rates = _rates(m.group(1), str(path), lineno)
            requests.append((f"line {first}", _llama_request(accepted, generated, L, rates, str(path), lineno)))
    alone += [v[:2] for v in open_lines.values()]
    return requests, alone, empty


def llamacpp_log(files: list[Path]) -> AcceptanceProfile:
    """llama-server's per-request statistics, one prompt per request: the "mean len" line and its
    "acc per pos" line, or the one-line form "... mean acceptance length = L, acceptance rate per
    position = (r_1, ...)". A request's verify steps are its accepted drafts over the sum of its
    rates (each rate is the request's steps accepting at least i drafts over its steps); a request
    with no verify step prints "()" and adds nothing. "mean len" lines without their rates (llama.cpp
    prints the rates at trace verbosity) are left out beside requests that have them, or, alone, a
    scalar fallback pooled by their counts (steps = A / (L - 1)); only older "draft acceptance rate"
    lines: a scalar fallback (accepted / generated drafts, a lower bound of the geometric rate)."""
    requests, alone, empty = [], [], 0
    for path in files:
        for lineno, m in _lines(path, LLAMA_LOG):
            if not m.group(5).strip():
                empty += 1
                continue
            rates = _rates(m.group(5), str(path), lineno)
            requests.append((f"line {lineno}", _llama_request(int(m.group(2)), int(m.group(3)), float(m.group(4)),
                                                               rates, str(path), lineno)))
        split, left, none = _llama_split_form(path)
        requests += split
        alone += left
        empty += none
    notes = [f"{empty} request(s) with no verify step ('()') add nothing"] if empty else []
    if requests:
        if alone:
            notes.append(f"{len(alone)} 'mean len' line(s) without their 'acc per pos' line left out (llama.cpp "
                         "prints the rates at trace verbosity)")
        return pooled_requests(requests, "llamacpp", "llama.cpp log lines with per-position rates", files, notes)
    if alone:
        with_draft = [(a, L) for a, L in alone if L > 1]
        if not with_draft:
            raise AcceptanceError(f"{files[0]}: mean len: expected > 1 on some line (some draft accepted); found "
                                  f"{max(L for _, L in alone):g}", where=str(files[0]), field="mean len")
        accepted = sum(a for a, _ in with_draft)
        L = 1 + accepted / sum(a / (L - 1) for a, L in with_draft)
        return AcceptanceProfile(None, "llamacpp", f"llama.cpp 'mean len' log lines ({len(alone)} pooled by their "
                                 "verify steps A / (L - 1); no 'acc per pos' lines)", [str(f) for f in files],
                                 scalar=1 - 1 / L, notes=[SCALAR_NOTE + f"; L = {L:.3f}", *notes], scalar_length=L)
    old = [(int(m.group(2)), int(m.group(3))) for path in files for _, m in _lines(path, LLAMA_OLD)]
    if not old:
        raise AcceptanceError(f"{files[0]}: expected llama.cpp 'draft acceptance' lines; found none",
                              where=str(files[0]))
    acc, gen = map(sum, zip(*old))
    if gen == 0:
        raise AcceptanceError(f"{files[0]}: generated drafts: expected > 0; found 0", where=str(files[0]))
    prof = AcceptanceProfile(None, "llamacpp", f"llama.cpp log lines 'draft acceptance rate' ({len(old)} pooled)",
                             [str(f) for f in files], scalar=acc / gen, scalar_length=1 / (1 - acc / gen))
    prof.notes.append("scalar fallback: the older line gives accepted / generated drafts, not a profile; geometric "
                      f"acceptance assumed at a = {acc / gen:.3f}, a lower bound of the geometric rate (the mean "
                      "acceptance length shown is 1 / (1 - a), its K -> infinity value)")
    return prof


__all__ = ["vllm_log", "vllm_requests", "sglang_requests", "sglang_scalar", "llamacpp_log", "Counts"]
