"""Read an acceptance profile from files, the format detected from their content
(:func:`detect`): vLLM, SGLang and llama.cpp metrics, logs and responses, and moespec's own runs.
Several files of one kind are pooled; two Prometheus scrapes of one server are differenced."""

from __future__ import annotations

import json
from pathlib import Path

from .engines import llamacpp_log, sglang_requests, sglang_scalar, vllm_log, vllm_requests
from .profile import AcceptanceError, AcceptanceProfile, pool
from .prometheus import counters_profile
from .records import json_records
from .runs import PROFILE_FILE, from_doc, from_rows, read_table, rows_of_table

ENGINES = ("auto", "vllm", "sglang", "llamacpp", "moespec")
RUN_FILE = "moespec_run.json"
#: format -> engine, and whether its reader was checked against the engine's own source or docs
#: (docs/advise.md, "Acceptance from your engine").
FORMATS = {
    "vllm-prometheus": ("vllm", True), "vllm-log": ("vllm", True), "vllm-requests": ("vllm", True),
    "sglang-requests": ("sglang", True), "sglang-scalar": ("sglang", True),
    "llamacpp-prometheus": ("llamacpp", False), "llamacpp-log": ("llamacpp", False),
    "moespec-table": ("moespec", True), "moespec-run": ("moespec", True),
}
#: Where each format marked unverified in :data:`FORMATS` was read (docs/advise.md, "Acceptance from your engine").
PROVENANCE = {
    "llamacpp-prometheus": "llama.cpp /metrics: the counters and what they count read from "
                           "tools/server/server-context.cpp as stored under ggml-org/llama.cpp @ 001d906a6d86 (a commit not confirmed on upstream "
                           "master); the exposition's text from public copies of tools/server/server-task.cpp "
                           "(to_metrics), which is not stored under ggml-org at that commit",
    "llamacpp-log": "llama.cpp log: the 'mean len' / 'acc per pos' lines read from tools/server/server-context.cpp as "
                    "stored under ggml-org/llama.cpp @ 001d906a6d86 (a commit not confirmed on upstream master), the "
                    "older 'draft acceptance rate' line @ fb4026604c67; the one-line form ('mean acceptance length = "
                    "..., acceptance rate per position = ...') not verified against llama.cpp's own source (read from "
                    "a fork's source and a parser's tests)",
}


def _run_path(path: Path) -> Path:
    for folder in (path, path / "figures"):
        for name in (RUN_FILE, PROFILE_FILE):
            if (folder / name).is_file():
                return folder / name
    raise AcceptanceError(f"{path}: expected a run folder with {RUN_FILE} or {PROFILE_FILE} (in it or its figures/); "
                          "found neither", where=str(path), field=RUN_FILE)


def detect(path: Path) -> str:
    """The format of ``path`` from its content (:data:`FORMATS`), refused in one line when none fits."""
    if path.is_dir():
        path = _run_path(path)
    if not path.is_file():
        raise AcceptanceError(f"{path}: expected an acceptance file; found no such file", where=str(path))
    text = path.read_text(errors="replace")
    head = text.lstrip()[:1]
    first = text.splitlines()[0] if text.strip() else ""
    if path.suffix == ".csv" or "accepted_at_least" in first:
        return "moespec-table"
    if head in "{[":
        try:
            doc = json.loads(text)
            if isinstance(doc, dict) and doc.get("schema") == "moespec.run_file":
                return "moespec-run"
        except json.JSONDecodeError:
            pass
        try:
            records = json_records(path)[:50]
        except AcceptanceError:     # text that begins with a bracket (a log line): not JSON
            records = []
        for _, obj in records:
            if isinstance(obj, dict):
                if "metrics" in obj or any(isinstance(c, dict) and "speculative_decoding_stats" in c
                                           for c in obj.get("choices") or []):
                    return "vllm-requests"
                if "meta_info" in obj or "sglext" in obj:
                    return "sglang-requests"
    for marker, fmt in (("SpecDecoding metrics:", "vllm-log"), ("vllm:spec_decode_num", "vllm-prometheus"),
                        ("llamacpp:spec_decode_num", "llamacpp-prometheus"),
                        ("acceptance rate per position", "llamacpp-log"), ("acc per pos =", "llamacpp-log"),
                        ("), mean len =", "llamacpp-log"), ("draft acceptance rate =", "llamacpp-log"),
                        ("sglang:spec_accept_length", "sglang-scalar"), ("accept len:", "sglang-scalar")):
        if marker in text:
            return fmt
    raise AcceptanceError(f"{path}: expected an acceptance source (vLLM/llama.cpp /metrics, vLLM 'SpecDecoding "
                          "metrics' or llama.cpp 'draft acceptance' log lines, vLLM/SGLang responses with acceptance "
                          f"histograms, SGLang 'accept len', moespec's {PROFILE_FILE} or run file); found none of "
                          "their markers", where=str(path), field="format")


def _moespec(paths: list[Path], fmt: str, state: str | None) -> AcceptanceProfile:
    if len(paths) != 1:
        raise AcceptanceError(f"{paths[1]}: expected one moespec run (its table or run file); found {len(paths)} "
                              "files", where=str(paths[1]))
    path = paths[0]
    if fmt == "moespec-table":
        table = read_table(path)
        states = list(dict.fromkeys(table["state"]))
    else:
        doc = json.loads(path.read_text())
        parts = {a["state"]: a for a in doc.get("acceptance") or [] if a.get("profile")}
        states = list(parts)
    if not states:
        raise AcceptanceError(f"{path}: expected the real-draft runs' acceptance profile (notebook 05); found none "
                              f"(field acceptance[].profile)", where=str(path), field="acceptance")
    state = state or ("quiet" if "quiet" in states else states[0])
    if state not in states:
        raise AcceptanceError(f"{path}: --state: expected one of the run's machine states {states}; found {state!r}",
                              where=str(path), field="state", found=state)
    if fmt == "moespec-table":
        return from_rows(rows_of_table(table, state, str(path)), str(path), state)
    return from_doc(parts[state]["profile"], str(path), state)


def load(files, engine: str = "auto", state: str | None = None) -> AcceptanceProfile:
    """The acceptance profile of ``files`` (one or two paths; a run folder for moespec's own runs),
    their format detected from the content; ``engine`` (:data:`ENGINES`) refuses a file of another
    engine; ``state``: the machine state of a moespec run (default quiet)."""
    paths = [Path(f) for f in files]
    if not paths:
        raise AcceptanceError("expected an acceptance file; found none")
    if engine not in ENGINES:
        raise AcceptanceError(f"--engine: expected one of {list(ENGINES)}; found {engine!r}", where="--engine",
                              found=engine)
    paths = [_run_path(p) if p.is_dir() else p for p in paths]
    formats = [detect(p) for p in paths]
    if len(set(formats)) > 1:
        raise AcceptanceError(f"{paths[1]}: expected the format of {paths[0]} ({formats[0]}); found {formats[1]}",
                              where=str(paths[1]), field="format", expected=formats[0], found=formats[1])
    fmt = formats[0]
    owner, verified = FORMATS[fmt]
    if engine not in ("auto", owner):
        raise AcceptanceError(f"{paths[0]}: --engine {engine}: expected a {engine} file; found the {fmt} format",
                              where=str(paths[0]), field="--engine", expected=engine, found=fmt)
    if fmt.startswith("moespec"):
        prof = _moespec(paths, fmt, state)
    elif fmt.endswith("prometheus"):
        prefix, name = ("vllm:", "vLLM") if owner == "vllm" else ("llamacpp:", "llama.cpp")
        prof = counters_profile(paths, prefix, owner, f"{name} /metrics counters")
    else:
        reader = {"vllm-log": vllm_log, "vllm-requests": vllm_requests, "sglang-requests": sglang_requests,
                  "sglang-scalar": sglang_scalar, "llamacpp-log": llamacpp_log}[fmt]
        prof = reader(paths)
    if state is not None and owner != "moespec":
        raise AcceptanceError(f"--state {state!r}: names a machine state of a moespec run; {paths[0]} is {fmt}",
                              where="--state", found=state)
    if not verified:
        prof.notes.append(PROVENANCE[fmt])
    return prof


__all__ = ["load", "detect", "pool", "ENGINES", "FORMATS"]
