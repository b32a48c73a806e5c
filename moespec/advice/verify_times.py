"""``moespec advise --verify-times``: verify costs from an engine's own kernel benchmark, read in
its own output format (detected from the content; docs/advise.md cites each tool's source):

* llama.cpp ``test-backend-ops perf -o MUL_MAT_ID`` (console lines ``MUL_MAT_ID(type_a=..,n_mats=..,
  n_used=..,b=..,m=..,n=..,k=..): R runs - T us/run - ...``): one MoE expert matrix per line;
* llama.cpp ``llama-bench`` at several ``-p``/``-ub`` values (CSV, JSON, JSONL or markdown): the
  whole model's pass of n tokens;
* vLLM ``benchmarks/kernels/benchmark_moe.py`` (``Batch size: n, config: ...`` / ``Kernel time: T us``):
  one MoE layer on the Triton fused_moe kernel; its tuned-config JSON gives the tuned batch sizes;
* moespec's own expert-operation benchmark: notebook 02's rows (:mod:`moespec.fit`'s columns) or its
  per-n table ``02_bandwidth_by_n.csv``.

A kernel benchmark becomes effective bandwidths per kernel path and pass size (Table 1's
definition, requested bytes over time, as :func:`moespec.fit.bandwidth_table`), and these with the
user's routing (a trace, the source's own routing windows, or the model preset's published byte
share) give tau(n) by paper 1's eq. (5) with the bandwidths of the benchmark. Where the source
times uniform random expert ids (test-backend-ops, benchmark_moe.py), its requested bytes are the
expected union of those ids, N (1 - (1 - m/N)^n) experts, and the user's union bytes go through the
fitted bandwidths as paper 1 does. A file holds one kernel path per pass size unless labelled:
``slot=FILE`` / ``dedup=FILE`` say which path a file timed; moespec's own rows hold both.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import fit
from moespec import theory as th
from moespec.model_shapes import FORMATS, PRESETS, format_bytes, get_spec, preset_name
from moespec.paper_reference import table1
from moespec.routing import byte_share
from moespec.validate.errors import refuse

from .validate import check_trace, read_bandwidth_table
from .curves import N_MAX, VerifyCurves, draft_assumption, draft_or_refuse, predicted_round
from .errors import AdviceInputError
from .settings import MMVQ_MAX_BATCH_SIZE

KERNELS = ("slot", "dedup")
UNNAMED = "not named (--format)"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: test-backend-ops' console perf line of MUL_MAT_ID (print_perf_console; VERSIONS "llama.cpp-test-backend-ops")
MMID_LINE = re.compile(r"^\s*MUL_MAT_ID\((?P<vars>[^()]*)\):\s*(?P<runs>\d+) runs -\s*(?P<us>[0-9.]+) us/run")
BACKEND_LINE = re.compile(r"^Backend \d+/\d+: (?P<name>\S+)")
#: benchmark_moe.py's lines (VERSIONS "vllm-benchmark-moe")
BATCH_LINE = re.compile(r"^Batch size: (?P<n>\d+), config: ")
TIME_LINE = re.compile(r"^Kernel time: (?P<us>[0-9.]+) us\s*$")
ARGS_LINE = re.compile(r"^Namespace\((?P<args>.*)\)\s*$")
#: llama-bench's fields (test::get_fields; VERSIONS "llama.cpp-bench") that advise reads
BENCH_FIELDS = ("model_type", "n_batch", "n_ubatch", "n_prompt", "n_gen", "n_depth", "avg_ns")
BENCH_DEFAULTS = {"n_batch": 2048, "n_ubatch": 512}
#: benchmark_moe.py --dtype -> bytes per expert weight (auto: the checkpoint's 16-bit dtype)
VLLM_DTYPE_BYTES = {"auto": 2, "fp8_w8a8": 1, "int8_w8a16": 1}


@dataclass
class Timed:
    """The passes one file timed: ``rows`` (n, kernel path, t_s, and for a kernel benchmark the
    bytes that pass requested under the timed routing), ``scope`` (``"expert"``: one MoE layer's
    expert operation; ``"model"``: the whole verify pass), what routing it timed, and what the file
    says of the model (``model``, ``fmt``, ``bytes_per_weight``, ``N``, ``m``)."""

    path: Path
    source: str
    scope: str
    routing: str
    rows: pd.DataFrame
    model: str | None = None
    fmt: str | None = None
    bytes_per_weight: float | None = None
    notes: list = field(default_factory=list)
    own: pd.DataFrame | None = None      # moespec's per-n table (ubar, read_GBps) where the source is ours


def uniform_union(n, N: int, m: int) -> np.ndarray:
    """Expected distinct experts of n tokens that each take m distinct experts of N uniformly at
    random (test-backend-ops' shuffled ids, benchmark_moe.py's top-m of Gaussian gating)."""
    return N * (1.0 - (1.0 - m / N) ** np.asarray(n, float))


# --- detection ----------------------------------------------------------------------------------
def _text(path: Path) -> str:
    if not path.is_file():
        raise AdviceInputError(f"--verify-times {path}: no such file", where=str(path))
    try:
        return ANSI.sub("", path.read_text())
    except UnicodeDecodeError:
        raise AdviceInputError(f"--verify-times {path}: not UTF-8 text (a benchmark's output is text)",
                               where=str(path)) from None


def read(path: str | Path, kernel: str | None = None, model: str | None = None) -> Timed | list[int]:
    """The passes timed in ``path`` (format detected from the content), or, for vLLM's tuned-config
    JSON, its tuned batch sizes. ``kernel``: the path the file timed (``slot=``/``dedup=``);
    ``model``: the rows of that model where a moespec table holds several."""
    path = Path(path)
    text = _text(path)
    head = text.lstrip()[:1]
    if head in "[{":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError:
            doc = None
        if isinstance(doc, dict):
            return _tuned_sizes(doc, path)
        if isinstance(doc, list) or (doc is None and head == "{"):
            return _llama_bench(_json_records(doc, text, path), path, "JSON" if doc is not None else "JSONL", kernel)
    lines = text.splitlines()
    first = lines[0] if lines else ""
    if "avg_ns" in first and "n_ubatch" in first:
        return _llama_bench(_csv_records(path), path, "CSV", kernel)
    if "beta_slot_GBps" in first or "t_median_s" in first:
        return _own(path, first, kernel, model)
    if any(MMID_LINE.match(line) for line in lines):
        return _test_backend_ops(lines, path, kernel)
    if any(TIME_LINE.match(line) for line in lines):
        return _benchmark_moe(lines, path, kernel)
    if any(line.startswith("|") and " test " in line and "t/s" in line for line in lines):
        return _llama_bench(_markdown_records(lines, path), path, "markdown", kernel)
    raise AdviceInputError(f"--verify-times {path}: not a format advise reads: expected test-backend-ops perf "
                           "(MUL_MAT_ID lines), llama-bench (CSV, JSON, JSONL, markdown), benchmark_moe.py output or "
                           "its tuned-config JSON, or moespec's expert-operation rows or 02_bandwidth_by_n.csv",
                           where=str(path))


# --- llama.cpp test-backend-ops ------------------------------------------------------------------
def _ints(vars_text: str, where: str) -> dict:
    pairs = dict(p.split("=", 1) for p in vars_text.split(",") if "=" in p)
    out = {"type_a": pairs.get("type_a")}
    for key in ("n_mats", "n_used", "m", "n", "k"):
        if not str(pairs.get(key, "")).isdigit():
            refuse(where, key, "a whole number in MUL_MAT_ID(...)", pairs.get(key), error=AdviceInputError)
        out[key] = int(pairs[key])
    return out


def _ggml_format(type_name: str, where: str) -> str:
    fmt = str(type_name).lower()
    if fmt not in FORMATS:
        refuse(where, "type_a", f"a ggml type whose block bytes moespec knows ({', '.join(sorted(FORMATS))})",
               type_name, error=AdviceInputError)
    return fmt


def _test_backend_ops(lines: list[str], path: Path, kernel: str | None) -> Timed:
    rows, backends, seen = [], set(), {}
    backend = None
    for i, line in enumerate(lines, 1):
        found = BACKEND_LINE.match(line)
        if found:
            backend = found["name"]
        found = MMID_LINE.match(line)
        if not found:
            continue
        where = f"{path}:{i}"
        v = _ints(found["vars"], where)
        if found["vars"] in seen:
            refuse(where, "MUL_MAT_ID(...)", "each case once", f"a repeat of line {seen[found['vars']]}",
                   found_is_text=True, error=AdviceInputError)
        seen[found["vars"]] = i
        backends.add(backend)
        fmt = _ggml_format(v["type_a"], where)
        rows.append({"n": v["n"], "t_s": float(found["us"]) * 1e-6, "fmt": fmt, "N": v["n_mats"], "m": v["n_used"],
                     "matrix_bytes": format_bytes(v["m"] * v["k"], fmt), "line": i})
    df = pd.DataFrame(rows)
    if len(backends) > 1:
        refuse(path, "Backend", "the lines of one backend (test-backend-ops -b NAME)", sorted(map(str, backends)),
               error=AdviceInputError)
    for col in ("N", "m", "fmt"):
        if df[col].nunique() > 1:
            line = int(df.loc[df[col] != df[col].iloc[0], "line"].iloc[0])
            refuse(f"{path}:{line}", {"N": "n_mats", "m": "n_used", "fmt": "type_a"}[col],
                   f"{df[col].iloc[0]} as on line {int(df['line'].iloc[0])} (one model's experts)",
                   df.loc[df["line"] == line, col].iloc[0], found_is_text=True, error=AdviceInputError)
    N, m, fmt = int(df["N"].iloc[0]), int(df["m"].iloc[0]), str(df["fmt"].iloc[0])
    notes = []
    if kernel is None:
        if fmt in ("f32", "f16", "bf16"):
            refuse(path, "type_a", "a quantized type, or a label slot=/dedup= saying which path the build ran",
                   fmt, error=AdviceInputError)
        df["kernel"] = np.where(df["n"] <= MMVQ_MAX_BATCH_SIZE, "slot", "dedup")
        notes.append(f"test-backend-ops times one path per n: read as upstream CUDA dispatches it, MMVQ (per-slot) up "
                     f"to MMVQ_MAX_BATCH_SIZE = {MMVQ_MAX_BATCH_SIZE} tokens, MMQ (deduplicating) above; label the "
                     "file slot= or dedup= for another build")
    else:
        df["kernel"] = kernel
    union = uniform_union(df["n"], N, m)
    df["bytes"] = np.where(df["kernel"] == "slot", df["n"] * m, union) * df["matrix_bytes"]
    return Timed(path, "llama.cpp test-backend-ops perf (MUL_MAT_ID)", "expert",
                 f"uniform random expert ids (N = {N}, m = {m})", df[["n", "kernel", "t_s", "bytes"]], fmt=fmt,
                 notes=notes)


# --- llama.cpp llama-bench ---------------------------------------------------------------------------
def _csv_records(path: Path) -> list[tuple[int, dict]]:
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    return [(i + 2, row) for i, row in enumerate(df.to_dict("records"))]


def _json_records(doc, text: str, path: Path) -> list[tuple[int, dict]]:
    if doc is not None:
        return [(i + 1, r) for i, r in enumerate(doc)]
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                out.append((i, json.loads(line)))
            except json.JSONDecodeError as exc:
                refuse(f"{path}:{i}", None, "one JSON object per line (llama-bench -o jsonl)", exc.msg,
                       found_is_text=True, error=AdviceInputError)
    return out


def _markdown_records(lines: list[str], path: Path) -> list[tuple[int, dict]]:
    """llama-bench's markdown table: the test column (ppN, tgN, ' @ dD') and t/s ('mean ± sd')."""
    cells = [(i, [c.strip() for c in line.strip().strip("|").split("|")]) for i, line in enumerate(lines, 1)
             if line.startswith("|")]
    header = cells[0][1]
    out = []
    for i, row in cells[2:]:
        rec = dict(zip(header, row))
        test = re.fullmatch(r"(?:pp(\d+))?(?:\+?tg(\d+))?(?: @ d(\d+))?", rec.get("test", ""))
        ts = re.fullmatch(r"([0-9.]+) ± [0-9.]+", rec.get("t/s", ""))
        if not (test and ts and (test[1] or test[2])):
            refuse(f"{path}:{i}", "test, t/s", "ppN / tgN (' @ dD') and 'mean ± sd'",
                   f"{rec.get('test')!r}, {rec.get('t/s')!r}", found_is_text=True, error=AdviceInputError)
        out.append((i, {"model_type": rec.get("model", ""), "n_prompt": test[1] or 0, "n_gen": test[2] or 0,
                        "n_depth": test[3] or 0, "n_batch": rec.get("n_batch", BENCH_DEFAULTS["n_batch"]),
                        "n_ubatch": rec.get("n_ubatch", BENCH_DEFAULTS["n_ubatch"]), "avg_ts": ts[1]}))
    return out


def _whole(rec: dict, where: str, key: str) -> int:
    value = str(rec.get(key, "")).strip()
    if not value.isdigit():
        refuse(where, key, "a whole number >= 0", rec.get(key), error=AdviceInputError)
    return int(value)


def _llama_bench(records: list[tuple[int, dict]], path: Path, form: str, kernel: str | None) -> Timed:
    rows, first, skipped = [], None, 0
    for i, rec in records:
        where = f"{path}:{i}" if form != "JSON" else f"{path}: test {i}"
        missing = [f for f in BENCH_FIELDS if f not in rec and not (f == "avg_ns" and "avg_ts" in rec)]
        if missing:
            refuse(where, ", ".join(missing), f"llama-bench's fields {', '.join(BENCH_FIELDS)}", sorted(rec),
                   error=AdviceInputError)
        p, g, batch, ubatch = (_whole(rec, where, k) for k in ("n_prompt", "n_gen", "n_batch", "n_ubatch"))
        same = (str(rec["model_type"]), _whole(rec, where, "n_depth"))
        first = first or (same, i)
        if same != first[0]:
            refuse(where, "model_type, n_depth", f"{first[0]} as in test {first[1]} (one model, one depth)", same,
                   error=AdviceInputError)
        if "avg_ns" in rec:
            seconds = float(rec["avg_ns"]) * 1e-9
        else:
            seconds = (p + g) / float(rec["avg_ts"])
        if p > 0 and g == 0:
            n = min(p, batch, ubatch)
            if p % n:
                refuse(where, "n_prompt", f"a multiple of the pass size min(n_prompt, n_batch, n_ubatch) = {n}", p,
                       error=AdviceInputError)
            rows.append({"n": n, "t_s": seconds / (p // n)})
        elif g > 0 and p == 0:
            rows.append({"n": 1, "t_s": seconds / g})
        else:
            skipped += 1
    df = pd.DataFrame(rows)
    df = df[df["n"] <= N_MAX].groupby("n", as_index=False)["t_s"].mean()
    df["kernel"] = kernel or "as built"
    notes = [f"llama-bench ({form}): the whole model's pass of n tokens, n = min(n_prompt, n_batch, n_ubatch), "
             "time = the test's mean time over its passes (tg: per token); several tests at one n averaged"]
    notes += [f"{skipped} pp+tg test(s) skipped (their passes are of two sizes)"] if skipped else []
    notes += ["markdown holds only t/s: time = tokens / t/s"] if form == "markdown" else []
    return Timed(path, f"llama.cpp llama-bench ({form})", "model",
                 "the model's own routing on llama-bench's random prompt tokens", df, model=first[0][0], notes=notes)


# --- vLLM benchmark_moe.py --------------------------------------------------------------------------
def _tuned_sizes(doc: dict, path: Path) -> list[int]:
    sizes = [k for k in doc if k != "triton_version"]
    bad = [k for k in sizes if not (str(k).isdigit() and isinstance(doc[k], dict))]
    if bad or not sizes:
        refuse(path, "keys", "batch sizes mapping to fused_moe configs (benchmark_moe.py --tune's JSON)",
               bad or sorted(doc), error=AdviceInputError)
    return sorted(int(k) for k in sizes)


def _namespace(line: str) -> dict:
    return {k: v.strip("'\"") for k, v in re.findall(r"(\w+)=('[^']*'|\"[^\"]*\"|[^,]+)", line)}


def _benchmark_moe(lines: list[str], path: Path, kernel: str | None) -> Timed:
    args, rows, pending = {}, [], None
    for i, line in enumerate(lines, 1):
        if ARGS_LINE.match(line):
            args = _namespace(ARGS_LINE.match(line)["args"])
        elif BATCH_LINE.match(line):
            if pending:
                refuse(f"{path}:{pending[1]}", "Kernel time", "a 'Kernel time: T us' line after each 'Batch size'",
                       "the next 'Batch size' line", found_is_text=True, error=AdviceInputError)
            pending = (int(BATCH_LINE.match(line)["n"]), i)
        elif TIME_LINE.match(line):
            if not pending:
                refuse(f"{path}:{i}", "Batch size", "a 'Batch size: n, config: ...' line before", line.strip(),
                       error=AdviceInputError)
            rows.append({"n": pending[0], "t_s": float(TIME_LINE.match(line)["us"]) * 1e-6})
            pending = None
    dtype = args.get("dtype", "auto")
    if dtype not in VLLM_DTYPE_BYTES:
        refuse(path, "dtype", f"one of {sorted(VLLM_DTYPE_BYTES)} (benchmark_moe.py --dtype)", dtype,
               error=AdviceInputError)
    df = pd.DataFrame(rows)
    df["kernel"] = kernel or "dedup"
    tp = int(args.get("tp_size", 2))
    return Timed(path, "vLLM benchmark_moe.py (Triton fused_moe)", "expert", "uniform random expert ids", df,
                 model=args.get("model"), fmt={"auto": "bf16"}.get(dtype, dtype),
                 bytes_per_weight=VLLM_DTYPE_BYTES[dtype],
                 notes=[f"benchmark_moe.py: one layer (fused_topk + fused_experts) at --tp-size {tp}"
                        f"{' with expert parallelism' if args.get('enable_expert_parallel') == 'True' else ''}; "
                        "fused_moe groups each expert's tokens: the deduplicating path at every n"],
                 own=pd.DataFrame({"tp": [tp], "ep": [args.get("enable_expert_parallel") == "True"]}))


def _vllm_bytes(timed: Timed, spec) -> pd.DataFrame:
    """benchmark_moe.py's requested bytes: each GPU holds N/tp experts of intermediate I (expert
    parallelism) or all N of I/tp; the union of uniform ids times one expert's bytes on the GPU."""
    tp, ep = int(timed.own["tp"].iloc[0]), bool(timed.own["ep"].iloc[0])
    N = spec.num_experts // tp if ep else spec.num_experts
    inter = spec.expert_intermediate if ep else spec.expert_intermediate / tp
    b = 3 * spec.hidden_size * inter * timed.bytes_per_weight
    df = timed.rows.copy()
    df["bytes"] = np.where(df["kernel"] == "slot", df["n"] * spec.top_k, uniform_union(df["n"], N, spec.top_k)) * b
    # a GPU reads 1/tp of the bytes in the time measured: the model's bandwidth is tp times the GPU's
    df["bytes"] *= tp
    return df


# --- moespec's own benchmark ----------------------------------------------------------------------------
def _own(path: Path, header: str, kernel: str | None, model: str | None) -> Timed:
    if kernel is not None:
        refuse(path, "label", "no slot=/dedup= label (moespec's rows time both kernels)", kernel,
               error=AdviceInputError)
    if "t_median_s" in header:
        try:
            table = fit.bandwidth_table(pd.read_csv(path))
        except ValueError as exc:
            raise AdviceInputError(f"{path}: {exc}", where=str(path)) from None
        source = "moespec expert-operation rows (notebook 02)"
    else:
        table = read_bandwidth_table(path, ["n", "beta_slot_GBps", "beta_dedup_GBps"])
        source = "moespec bandwidth by n (02_bandwidth_by_n.csv)"
    if model and "model" in table.columns:
        table = table[table["model"].astype(str).str.lower() == preset_name(model).lower()]
    keys = [c for c in ("model", "backend", "fmt") if c in table.columns]
    groups = table.groupby(keys).ngroups if keys else 1
    if groups != 1:
        refuse(path, ", ".join(keys), "the rows of one model, backend and format (--model picks a model)",
               f"{groups} groups" + (f" for --model {model!r}" if model else ""), found_is_text=True,
               error=AdviceInputError)
    table = table.sort_values("n")
    rows = pd.concat([pd.DataFrame({"n": table["n"], "kernel": p, "t_s": 1.0,
                                    "bytes": table[f"beta_{p}_GBps"] * 1e9}) for p in KERNELS])
    return Timed(path, source, "expert", "the routing windows the benchmark recorded", rows.reset_index(drop=True),
                 model=str(table["model"].iloc[0]) if "model" in table else None,
                 fmt=str(table["fmt"].iloc[0]) if "fmt" in table else None, own=table)


# --- verify curves --------------------------------------------------------------------------------------
def _spec(model: str | None, timed: Timed):
    name = model or timed.model
    for spec in PRESETS.values():   # an HF id in the source line of a preset (benchmark_moe.py --model)
        if name and f"{name} config.json" in spec.source:
            return spec, spec.name
    if not name:
        raise AdviceInputError(f"{timed.path}: names no model; give --model (a preset: {', '.join(PRESETS)})",
                               where="--model")
    try:
        return get_spec(preset_name(name)), name
    except KeyError:
        raise AdviceInputError(f"--model {name!r}: not a preset ({', '.join(PRESETS)}); give --model",
                               where="--model", found=name) from None


def _per_n(rows: pd.DataFrame, path: Path, kernel: str, value) -> np.ndarray:
    """``value(group)`` of the rows of ``kernel`` at every n = 1..N_MAX (refused where an n is missing)."""
    sel = rows[rows["kernel"] == kernel].groupby("n")
    missing = [n for n in range(1, N_MAX + 1) if n not in sel.groups]
    if missing:
        refuse(path, f"n ({kernel} path)", f"passes of every n = 1..{N_MAX}", f"none at n = {missing}",
               found_is_text=True, error=AdviceInputError)
    return np.array([value(sel.get_group(n)) for n in range(1, N_MAX + 1)], float)


def _beta(group: pd.DataFrame) -> float:
    """Table 1's effective bandwidth: the requested bytes over the time, summed over the shapes."""
    return float(group["bytes"].sum() / group["t_s"].sum())


def _expert_curves(rows: pd.DataFrame, main: Timed, paths: str, ubar, m: int, W: float, dense_ratio: float,
                   read_GBps) -> tuple[dict, dict, dict, np.ndarray | None]:
    """tau_p(n), its memory part M_p(n) and expert part from the benchmark's bandwidths (eq. (5),
    t0 = phi = 0): both kernels where both were timed at every n, else the one path each n ran (the
    same curve for both engines)."""
    common = {"dense_bytes": dense_ratio * m * W}
    if paths == "both":
        beta = {p: _per_n(rows, main.path, p, _beta) for p in KERNELS}
        dense = float(np.median(read_GBps)) * 1e9 if read_GBps is not None else beta["slot"][0]
        slot, dedup = th.verify_times_from_bandwidths(beta["slot"], beta["dedup"], ubar, m, W, dense_bandwidth=dense,
                                                      **common)
        vt, r = {"slot": slot, "dedup": dedup}, th.bandwidth_ratio(dedup.bandwidth, slot.bandwidth)
    else:
        kernel = rows.groupby("n")["kernel"].first().reindex(range(1, N_MAX + 1))
        one = rows.assign(kernel="timed")
        beta = _per_n(one, main.path, "timed", _beta)
        E = th.slot_expert_bytes(float(m), W, N_MAX) * np.where(kernel.to_numpy() == "dedup", ubar, 1.0)
        dense = float(np.median(read_GBps)) * 1e9 if read_GBps is not None else beta[0]
        timed = th.VerifyTime(E, beta, dense_bandwidth=dense, **common)
        vt, r = {"slot": timed, "dedup": timed}, None
    return ({p: vt[p].tau() for p in KERNELS}, {p: vt[p].memory_time() for p in KERNELS},
            {p: vt[p].expert_time() for p in KERNELS}, r)


def _ubar(trace, timed: Timed, spec, name: str) -> tuple[np.ndarray, str]:
    """The user's byte share ubar(n): the trace's, else the source's own routing windows, else the
    preset's published byte share (paper 1 Table 1, geometric in the token index)."""
    if trace is not None:
        check_trace(trace, spec, name)
        return byte_share(trace, N_MAX), f"the given routing trace ({trace.num_layers} layers, m = {trace.top_k})"
    if timed.own is not None and "ubar" in timed.own:
        return timed.own["ubar"].to_numpy(float), "the routing windows of moespec's benchmark (its ubar column)"
    rows = table1()
    rows = rows[rows["model"].str.lower() == (spec.paper_label or spec.name).lower()]
    if rows.empty:
        raise AdviceInputError(f"--verify-times: no routing for {name}: give a routing trace (--trace; moespec "
                               "import-routing makes one from vLLM/SGLang routed experts)", where="--trace")
    rho = th.reuse_from_byte_share(float(rows["n2_ubar"].iloc[0]), float(rows["n8_ubar"].iloc[0]), N_MAX)
    return (np.cumsum(1 - rho) / np.arange(1, N_MAX + 1),
            f"{spec.paper_label}'s published byte share ubar(2), ubar(8) (paper 1 Table 1), geometric in the "
            "token index")


def from_verify_times(files, model: str | None = None, fmt: str | None = None, trace=None, eps: float | None = None,
                      dense_ratio: float = 0.5, draft=None, engine: str | None = None) -> VerifyCurves:
    """Verify curves from an engine's benchmark: ``files`` are paths, each optionally prefixed
    ``slot=`` or ``dedup=`` (the kernel path it timed), plus at most one vLLM tuned-config JSON."""
    timed, tuned, labels = [], None, []
    for item in files:
        label, _, name = str(item).partition("=") if str(item).startswith(("slot=", "dedup=")) else ("", "", item)
        got = read(name, label or None, model)
        if isinstance(got, list):
            tuned = got
        else:
            timed.append(got)
            labels.append(label)
    if not timed:
        raise AdviceInputError("--verify-times: only a tuned-config JSON (batch sizes, no times); give "
                               "benchmark_moe.py's output beside it", where="--verify-times")
    if len(timed) > 1 and (sorted(labels) != ["dedup", "slot"] or len({t.scope for t in timed}) > 1):
        raise AdviceInputError(f"--verify-times: {len(timed)} timing files; give one, or two of one kind labelled "
                               "slot=FILE and dedup=FILE", where="--verify-times", found=[str(t.path) for t in timed])
    if eps is None:
        raise AdviceInputError("--verify-times: no bandwidth error eps for these times; give --eps (the fit's error "
                               "on your routing, or the benchmark's spread)", where="--eps")
    main = timed[0]
    rows = pd.concat([t.rows for t in timed], ignore_index=True)
    draft = draft_or_refuse(draft, f"verify times {main.path}")
    both = all(set(rows.loc[rows["n"] == n, "kernel"]) == set(KERNELS) for n in range(1, N_MAX + 1))
    if len(timed) > 1 and not both:
        refuse("--verify-times", "slot=, dedup=", f"both files with passes of every n = 1..{N_MAX}",
               {p: sorted(set(rows.loc[rows['kernel'] == p, 'n'])) for p in KERNELS}, error=AdviceInputError)
    paths = "both" if both else "one"
    assumptions = [f"verify times: {t.source}, {t.path.name}" + "".join(f"; {x}" for x in t.notes) for t in timed]
    if main.scope == "model":
        if trace is not None:
            raise AdviceInputError(f"--trace: {main.path} times the whole model with its own routing on random "
                                   "prompt tokens; a routing trace applies to a kernel benchmark", where="--trace")
        tau = {p: _per_n(rows.assign(kernel=rows["kernel"].replace("as built", p)), main.path, p,
                         lambda g: g["t_s"].mean()) for p in KERNELS}
        name, fmt_used = model or main.model, fmt
        M = expert = tau
        ubar = r = None
        assumptions.append(f"routing: {main.routing}; the whole pass measured (dense reads and host work included), "
                           "its band bound (17) on the whole time")
    else:
        spec, name = _spec(model, main)
        if main.bytes_per_weight is not None:
            rows = pd.concat([_vllm_bytes(t, spec) for t in timed], ignore_index=True)
            W = float(spec.num_moe_layers * spec.weights_per_expert * main.bytes_per_weight)
        else:
            W = float(spec.total_expert_bytes(fmt or main.fmt))
        fmt_used = fmt or main.fmt or spec.default_format
        ubar, routing = _ubar(trace, main, spec, name)
        own_read = main.own["read_GBps"] if main.own is not None and "read_GBps" in main.own else None
        tau, M, expert, r = _expert_curves(rows, main, paths, ubar, spec.top_k, W, dense_ratio, own_read)
        assumptions += [f"routing: {routing}; the benchmark requested the bytes of {main.routing}: the user's union "
                        "bytes go through its bandwidths (paper 1's method)" if "random" in main.routing
                        else f"routing: {routing}",
                        f"model {spec.paper_label or spec.name}: m = {spec.top_k}, W = {W:.4g} B over "
                        f"{spec.num_moe_layers} MoE layers; dense bytes D = {dense_ratio:g} m W at "
                        + ("the benchmark's read bandwidth" if own_read is not None else
                           "the one-token bandwidth of the timed path")]
    half = (np.zeros(N_MAX) if paths == "one" else np.asarray(th.saving_bound(eps, expert["slot"], expert["dedup"]),
                                                                float))
    assumptions += [draft_assumption(draft), "host time h(k) = 0: a benchmark does not measure it"]
    own = main.own if main.own is not None and "backend" in main.own else None
    subject = {"model": str(name), "engine": engine or (f"moespec {own['backend'].iloc[0]}" if own is not None
                                                        else main.source.split(" (")[0]),
               "format": fmt_used or UNNAMED, "source": f"verify times: {main.source}",
               "from": f"verify times {', '.join(t.path.name for t in timed)}", "kernel_paths": paths,
               **({"tuned_batch_sizes": tuned} if tuned else {})}
    rm = predicted_round(tau, M, float(eps), half, draft, str(name), "verify times",
                         f"{main.source}, bound (17) at eps")
    return VerifyCurves(round_model=rm, interval="band of bound (18) at eps around the saving of these verify times"
                        if paths == "both" else "one kernel path timed per pass size: no saving between kernels",
                        eps=float(eps), subject=subject, inputs=[str(t.path) for t in timed], assumptions=assumptions,
                        covers=["verify: bound (17) at eps", f"draft: {draft.term.protocol}",
                                "host: not covered (taken as 0)"],
                        ubar=ubar if paths == "both" else None, r=r,
                        sources={"verify times": "; ".join(f"{t.path} ({t.source})" for t in timed),
                                 **({"routing trace": str(trace.path or "given")} if trace is not None else {})})
