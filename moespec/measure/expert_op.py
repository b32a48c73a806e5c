"""The expert-operation benchmark: one MoE layer's expert operation, run alone (paper 1, Section 2).

For a model spec (published shapes with random weights, or real weights passed in) and each
chosen layer: (a) passes with chosen ids at a grid of U from heavy repetition (U = m) to none
(U = min(N, n·m)); (b) windows of n consecutive tokens copied from routing (a recorded
:class:`~moespec.routing.RoutingTrace`, or a synthetic one, labelled as such); both kernels on
every pass, the read ceiling (:class:`moespec.measure.ceiling.ReadCeiling`: the best of the
kernels' read patterns, rows of kind ``ceiling``) and a read of ``membw_bytes`` (``torch.sum``, kind
``membw``), all timed round-robin in one interleaved group per layer (or per (layer, n)), each call
after a cache flush sized from the machine's last-level cache (:func:`moespec.measure.timing.flush_bytes`).
Rows are written as each group finishes (RowLog); an interrupted run resumes at the first group not
on disk. Provenance goes to a JSON sidecar, with the cache, the flush and the ceiling (``cold``).

Run folder: ``<out_dir>/<run_id>/rows.csv`` and ``provenance.json``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import pandas as pd
import torch
from moespec.progress import tqdm

from moespec import io, paths, provenance
from moespec.kernels import ExpertWeights, expert_forward, resolve_backend
from moespec.measure import timing
from moespec.measure.ceiling import PREFIX, REFERENCE_KINDS, ReadCeiling
from moespec.measure.ids import batch_windows, chosen_ids, trace_windows, u_grid
from moespec.model_shapes import MoESpec, get_spec
from moespec.routing import RoutingTrace, synthetic
from moespec.routing.published import reuse_targets
from moespec.routing.stats import pass_union
from moespec.validate.invariants import check_trace_shape

FIELDS = ["run_id", "model", "layer", "kind", "kernel", "backend", "fmt", "device", "n", "m", "N", "U",
          "expert_bytes", "requested_bytes", "pass_id", "window", "t_median_s", "t_q25_s", "t_q75_s",
          "reps", "other_load", "swapped", "gpu_throttle", "flags", "flush_bytes", "cold_bytes"]
KEY = ["layer", "n", "pass_id", "kernel"]
KERNELS = ("slot", "dedup")
#: Batch mode's rows (``BenchConfig.batch_sizes``): each carries B sequences and k_plus_1 tokens per
#: sequence besides n = B·(k + 1); kind ``batch``.
BATCH_FIELDS = FIELDS + ["B", "k_plus_1"]
BATCH = "batch"


@dataclass(frozen=True)
class BenchConfig:
    """What one benchmark run measures.

    ``u_count``: values of U per n, spread over the reachable range (None: every reachable U;
    0: no chosen-id passes, windows only).
    ``windows_per_n``: windows of routing per n and layer. ``flush_bytes``: the cache flush before
    every call (None: the machine's, :func:`moespec.measure.timing.flush_bytes`). ``membw_bytes``:
    bytes of the reference reads, ``torch.sum`` and the read ceiling (None:
    :func:`moespec.measure.timing.read_bytes`, at least 1 GiB and more than the caches; tests use
    less). ``hidden``/``intermediate``
    shrink the spec's shapes (the quick profile); N and m stay the model's. ``threads``: torch
    CPU threads during the run (None: leave torch's setting). One thread by default: on a shared,
    oversubscribed CPU a multi-threaded op waits at every barrier for a descheduled thread, which
    adds milliseconds of noise to each small op; the read ceiling and the ``torch.sum`` read run with
    the same threads, so Figure 2 compares like with like. ``interleave``: ``"layer"`` runs all passes of a
    layer (every n) round-robin in one group, so that the machine's drift falls on every n alike
    (rows are written when the layer finishes); ``"n"``: one group per (layer, n), finer resume.

    ``batch_sizes`` (batch mode, when not empty): the passes are batched verify steps instead of
    chosen ids and windows, ``windows_per_n`` per (B, k + 1) for every B in ``batch_sizes`` and k + 1
    in ``ns``, each one window of k + 1 consecutive tokens from each of B different documents of the
    trace (:func:`moespec.measure.ids.batch_windows`), so n = B·(k + 1); rows of kind ``batch`` with
    columns ``B`` and ``k_plus_1`` (:data:`BATCH_FIELDS`). With ``interleave="n"`` a group holds every
    (B, k + 1) of one n.
    """

    model: str = "olmoe"
    fmt: str = "f32"
    backend: str = "auto"
    device: str = "cpu"
    layers: tuple[int, ...] = (0,)
    ns: tuple[int, ...] = tuple(range(1, 10))
    u_count: int | None = 6
    windows_per_n: int = 6
    reps: int = 5
    warmup: int = 1
    flush_bytes: int | None = None
    membw_bytes: int | None = None
    seed: int = 0
    hidden: int | None = None
    intermediate: int | None = None
    threads: int | None = 1
    interleave: str = "layer"
    batch_sizes: tuple[int, ...] = ()

    def spec(self) -> MoESpec:
        """The model spec, with its shapes replaced by ``hidden``/``intermediate`` if given."""
        spec = get_spec(self.model)
        if self.hidden or self.intermediate:
            spec = dataclasses.replace(spec, name=f"{spec.name}-shrunk",
                                       hidden_size=self.hidden or spec.hidden_size,
                                       expert_intermediate=self.intermediate or spec.expert_intermediate)
        return spec

    def as_dict(self) -> dict:
        """The fields as JSON values; ``batch_sizes`` only in batch mode, so that a run of the other
        passes keeps the configuration (and hash) it had without the field."""
        out = {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(self).items()}
        if not self.batch_sizes:
            del out["batch_sizes"]
        return out

    def pass_sizes(self) -> tuple[int, ...]:
        """The n timed: ``ns``, or in batch mode every B·(k + 1), ascending."""
        if not self.batch_sizes:
            return tuple(self.ns)
        return tuple(sorted({b * w for b in self.batch_sizes for w in self.ns}))


def shape_columns(config: BenchConfig) -> dict:
    """The benchmarked model's routing shape as table columns: ``N`` experts, ``m`` per token, ``L``
    MoE layers (kept by a quick run's shrunk shapes), so that a table of its bandwidths says which
    model's routing it may be used with (``moespec advise``), whatever its name."""
    spec = config.spec()
    return {"N": spec.num_experts, "m": spec.top_k, "L": spec.num_moe_layers}


def describe_shape(config: BenchConfig) -> str:
    """One line: the model's shape, where it comes from, and what the benchmark runs of it."""
    full, spec = get_spec(config.model), config.spec()
    shrunk = (f"; timed shrunk to H = {spec.hidden_size}, I = {spec.expert_intermediate} (quick profile)"
              if spec.name != full.name else "")
    return (f"{full.name}: N = {full.num_experts} experts, m = {full.top_k} per token, "
            f"L = {full.num_moe_layers} MoE layers, H = {full.hidden_size}, I = {full.expert_intermediate} "
            f"({full.source}){shrunk}; "
            f"random weights in {config.fmt} at this shape (kernel time depends on shapes and format, not on values)")


def requested_bytes(kernel: str, n: int, m: int, U: int, b: float) -> float:
    """Bytes one expert call of a pass requests (paper 1, Section 2): the per-slot kernel reads its
    n*m slots, the deduplicating kernel (and any peer that reads each expert once) the U distinct
    experts; ``b`` bytes per expert."""
    return n * m * b if kernel == "slot" else U * b


def synthetic_routing(model: str, seed: int = 0, num_docs: int = 8, doc_len: int = 256):
    """Synthetic routing for a preset when no recorded trace exists: the sticky process calibrated
    to paper 1's published layer-mean reuse of the model (:func:`moespec.routing.synthetic.calibrated`),
    else independent uniform routing. The trace's ``source`` says which; plots label windows with it."""

    spec = get_spec(model)
    try:
        targets = reuse_targets(spec.name)
    except KeyError:
        return synthetic.uniform(num_docs, doc_len, spec.num_moe_layers, spec.num_experts, spec.top_k,
                                 seed=seed, model=spec.name,
                                 source=f"synthetic uniform routing (no published reuse for {spec.paper_label})")
    return synthetic.calibrated(spec, targets, num_docs, doc_len, seed=seed)


def routing_for(model: str, trace_file: str = "", seed: int = 0, num_docs: int = 8, doc_len: int = 256):
    """The routing whose windows are timed: ``trace_file`` (a path, or a name in the trace folders
    of :func:`moespec.paths.trace_dirs`) if given; else the first recorded trace there whose
    ``model`` is ``model``; else :func:`synthetic_routing`. Each trace's ``label`` says which it is."""

    if trace_file:
        path = Path(trace_file)
        if not (path.is_absolute() or path.exists()):
            path = next((d / path for d in paths.trace_dirs() if (d / path).exists()), path)
        if not path.exists():
            raise FileNotFoundError(f"trace file {trace_file!r} not found (also looked in "
                                    f"{[str(d) for d in paths.trace_dirs()]})")
        return RoutingTrace.load(path)
    for path in paths.trace_files():
        tr = RoutingTrace.load(path)
        if same_model(tr.model, model):
            return tr
    return synthetic_routing(model, seed=seed, num_docs=num_docs, doc_len=doc_len)


def same_model(a, b) -> bool:
    """Whether two model names are the same model: equal names, or paths to the same folder or file
    (a checkpoint named relative in one place and absolute in another)."""
    if not a or not b:
        return False
    if str(a) == str(b):
        return True
    pa, pb = Path(str(a)).expanduser(), Path(str(b)).expanduser()
    return pa.exists() and pb.exists() and pa.resolve() == pb.resolve()


#: The backend name that times llama.cpp's own CPU expert operation (ggml MUL_MAT_ID, deduplicating)
#: and its per-slot counterpart (one MUL_MAT_ID call per token) instead of moespec's kernels
#: (:class:`moespec.measure.ggml_peer.GgmlExperts`; build the peer first: benchmarks/ggml_peer/build.py).
GGML = "ggml"


def ggml_forward(x, ids, w, kernel: str, backend: str = GGML):
    """The expert operation of a :class:`~moespec.measure.ggml_peer.GgmlExperts` ``w`` as the
    benchmark calls it: ``kernel="dedup"`` is ggml's MUL_MAT_ID over the pass (it reads each distinct
    expert once), ``"slot"`` its per-slot counterpart (docs/ggml_peer.md)."""
    if kernel == "dedup":
        return w(x, ids)
    if kernel == "slot":
        return w.per_slot(x, ids)
    raise ValueError(f"kernel must be 'slot' or 'dedup', found {kernel!r}")


def _ggml_weights(get_weights, threads: int | None):
    """``layer -> GgmlExperts`` holding the exact values of ``get_weights(layer)`` (int8_b32 -> q8_0)."""
    from moespec.measure import ggml_peer

    def get(layer):
        return ggml_peer.GgmlExperts.from_weights(get_weights(layer), threads=threads or torch.get_num_threads())
    return get


def _resolve_backend(backend: str, device: str) -> str:
    """The backend ``auto`` runs on ``device`` (asks moespec.kernels when it can tell); ``ggml``
    (:data:`GGML`) on the CPU only."""
    if backend == GGML:
        if device != "cpu":
            raise ValueError(f"backend {GGML!r} (ggml's CPU MUL_MAT_ID) runs on the CPU; device is {device!r}")
        return GGML


    return resolve_backend(backend, torch.device(device))


def _weights_getter(weights, config: BenchConfig, spec: MoESpec) -> Callable[[int], object]:

    if weights is None:
        return lambda layer: ExpertWeights.random((spec.num_experts, spec.hidden_size, spec.expert_intermediate),
                                                  fmt=config.fmt, seed=config.seed * 1000 + layer,
                                                  device=config.device)
    if isinstance(weights, ExpertWeights):
        return lambda layer: weights.to(config.device)
    if isinstance(weights, Mapping):
        return lambda layer: weights[layer].to(config.device)
    if callable(weights):
        return weights
    raise TypeError(f"weights must be None, an ExpertWeights, a mapping layer -> ExpertWeights or a "
                    f"callable; got {type(weights).__name__}")


def group_passes(config: BenchConfig, spec: MoESpec, trace, layer: int, n: int) -> list[dict]:
    """The passes of group (layer, n): chosen ids at :func:`u_grid` values of U, then windows of
    the trace; in batch mode the batched passes of every (B, k + 1) with B·(k + 1) = n
    (:func:`batch_passes`). Deterministic in (seed, layer, n), so a resumed run times the same passes."""
    if config.batch_sizes:
        return [p for b in config.batch_sizes for w in config.ns if b * w == n
                for p in batch_passes(config, trace, layer, b, w)]
    m, N = spec.top_k, spec.num_experts
    rng = np.random.default_rng([config.seed, layer, n])
    grid = u_grid(n, m, N, config.u_count) if config.u_count != 0 else []
    passes = [{"kind": "chosen", "pass_id": f"c{U}", "window": "", "ids": chosen_ids(n, m, N, U, rng)}
              for U in grid]
    if trace is not None and config.windows_per_n:
        for d, s, ids in trace_windows(trace.docs, layer, n, config.windows_per_n, rng):
            passes.append({"kind": "window", "pass_id": f"w{d}:{s}", "window": f"{trace.doc_ids[d]}:{s}",
                           "ids": ids})
    return passes


def batch_passes(config: BenchConfig, trace, layer: int, batch: int, window: int) -> list[dict]:
    """``config.windows_per_n`` passes of B = ``batch`` sequences x ``window`` (k + 1) tokens of the
    trace (:func:`moespec.measure.ids.batch_windows`), kind ``batch``, ``pass_id`` ``b{B}x{k+1}:{i}``,
    ``window`` the B windows as ``doc:start`` joined by ``+``. Deterministic in (seed, layer, B, k + 1)."""
    rng = np.random.default_rng([config.seed, layer, batch, window])
    return [{"kind": BATCH, "pass_id": f"b{batch}x{window}:{i}", "B": batch, "k_plus_1": window, "ids": ids,
             "window": "+".join(f"{trace.doc_ids[d]}:{s}" for d, s in where)}
            for i, (where, ids) in enumerate(batch_windows(trace.docs, layer, batch, window,
                                                           config.windows_per_n, rng))]


def _check_inputs(spec: MoESpec, trace, config: BenchConfig) -> None:
    """A trace whose windows are timed has the model's shape (L, N, m): routing is never applied to
    another model's shape. Batch mode needs a trace, with at least max(B) documents of max(k + 1) tokens."""
    if trace is None:
        if config.batch_sizes:
            raise ValueError("batch mode (batch_sizes): expected a routing trace to draw the B sequences from; "
                             "found none")
        return
    check_trace_shape(trace, spec, spec.name)
    bad = [l for l in config.layers if not 0 <= l < trace.num_layers]
    if bad:
        raise ValueError(f"layers {bad} are outside the trace's {trace.num_layers} MoE layers")
    if config.batch_sizes:
        bad_b = [b for b in config.batch_sizes if int(b) != b or b < 1]
        if bad_b or not config.windows_per_n:
            raise ValueError(f"batch mode: expected batch_sizes >= 1 and windows_per_n >= 1; found batch_sizes "
                             f"{list(config.batch_sizes)}, windows_per_n {config.windows_per_n}")
        need, w = max(config.batch_sizes), max(config.ns)
        have = int((np.asarray(trace.doc_lengths) >= w).sum())
        if have < need:
            raise ValueError(f"{trace.label}: batch mode needs {need} documents of >= {w} tokens (B = {need}, "
                             f"k + 1 = {w}); found {have}")


def _config_hash(config: BenchConfig, trace_source: str) -> str:
    blob = json.dumps({"config": config.as_dict(), "trace": trace_source}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:8]


def find_runs(out_dir: Path | None = None) -> list[dict]:
    """Sidecars of every run under ``out_dir`` (default :func:`moespec.paths.expert_op_dir`), oldest first,
    each with ``run_dir`` added."""
    out_dir = Path(out_dir or paths.expert_op_dir())
    runs = []
    for side in sorted(out_dir.glob("*/provenance.json")):
        rec = json.loads(side.read_text())
        rec["run_dir"] = str(side.parent)
        runs.append(rec)
    return sorted(runs, key=lambda r: r.get("started", ""))


def load_rows(run_dir: Path) -> pd.DataFrame:
    """The rows of one run (``rows.csv``) as a DataFrame."""
    path = Path(run_dir) / "rows.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no rows (has the run started?)")
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


#: The ``torch.sum`` reference's name where a table names the read it divides by.
SUM_PROBE = "torch.sum"


def read_groups(rows: pd.DataFrame, reference: str = "ceiling") -> pd.DataFrame:
    """Per interleaved group (run, layer, the read's n), the reference read timed in it, GB/s:
    ``read_GBps`` (bytes over the median time), ``read_hi_GBps`` (over the first quartile: the
    reference's fast end) and ``read_probe`` (what read). ``reference="ceiling"``: the read ceiling,
    the fastest read of the group by median among the ceiling's patterns (rows of kind ``ceiling``)
    and the ``torch.sum`` read (so never below it; a run without ceiling rows gives its ``torch.sum``
    read). ``"sum"``: the ``torch.sum`` read (kind ``membw``)."""
    if reference not in ("ceiling", "sum"):
        raise ValueError(f"reference must be 'ceiling' or 'sum', found {reference!r}")
    r = rows[rows["kind"].isin(REFERENCE_KINDS if reference == "ceiling" else ("membw",))]
    if r.empty:
        raise ValueError("no read-bandwidth rows (kind 'membw') in these rows")
    nbytes, t = pd.to_numeric(r["requested_bytes"]), pd.to_numeric(r["t_median_s"])
    t25 = pd.to_numeric(r["t_q25_s"]) if "t_q25_s" in r else t
    out = pd.DataFrame({"run_id": r["run_id"].astype(str) if "run_id" in r else "",
                        "layer": pd.to_numeric(r["layer"]).astype(int), "n": pd.to_numeric(r["n"]).astype(int),
                        "read_GBps": nbytes / t / 1e9, "read_hi_GBps": nbytes / t25 / 1e9,
                        "read_probe": r["kernel"].astype(str).where(r["kind"] == "ceiling", SUM_PROBE)})
    best = out.groupby(["run_id", "layer", "n"], sort=False)["read_GBps"].idxmax()
    return out.loc[best.to_numpy()].reset_index(drop=True)


def read_bandwidth(rows: pd.DataFrame, by_n: bool = False, reference: str = "ceiling"):
    """The reference read timed in this run (:func:`read_groups`: the read ceiling, or with
    ``reference="sum"`` the ``torch.sum`` read), GB/s: median and quartiles over its groups and the
    probe that read (a dict), or with ``by_n`` a DataFrame with, per timed n, the median over the
    groups that timed that n of ``read_GBps`` and ``read_hi_GBps``, and ``read_probe`` (with one group
    per (layer, n) it shows the drift between groups)."""
    g = read_groups(rows, reference)
    if by_n:  # a read row with n = 0 was timed in a group holding every n of its layer
        ns = sorted(set(pd.to_numeric(rows.loc[~rows["kind"].isin(REFERENCE_KINDS), "n"]).astype(int)))
        out = []
        for n in ns:
            at = g[(g["n"] == n) | (g["n"] == 0)]
            out.append({"n": n, "read_GBps": float(at["read_GBps"].median()),
                        "read_hi_GBps": float(at["read_hi_GBps"].median()),
                        "read_probe": str(at["read_probe"].mode().iloc[0]) if len(at) else ""})
        return pd.DataFrame(out)
    bw = g["read_GBps"]
    return {"median_GBps": float(bw.median()), "q25_GBps": float(bw.quantile(0.25)),
            "q75_GBps": float(bw.quantile(0.75)), "groups": int(len(bw)),
            "probe": str(g["read_probe"].mode().iloc[0])}


def profile_config(profile: str, model: str = "olmoe", fmt: str = "f32", backend: str = "auto",
                   device: str = "cpu", seed: int = 0, role: str = "main") -> BenchConfig:
    """The benchmark configuration of a notebook profile, shared by notebooks 02 and 03.

    ``role="main"``: the model of Figure 2 and the fits: two layers (the first and the middle MoE
    layer, as the paper fits two layers), n = 1..9, 5 values of U per n, 5 windows per n, 5
    repetitions (full: about 5-8 minutes for OLMoE's shapes in f32 on one core here).
    ``role="transfer"``: a model of Figure 7's transfer test: one layer, windows only at
    n = 2, 4, 6, 8. ``quick``: shapes shrunk to H=64, I=32·round(I/512) (N and m kept, expert
    sizes keep their order across models), small flush and read buffers: seconds, for tests.
    ``full``: the flush and the reference reads sized from ``device``'s last-level cache
    (:func:`moespec.measure.timing.flush_bytes`, :func:`~moespec.measure.timing.read_bytes`).
    """
    if profile not in ("quick", "full"):
        raise ValueError(f"profile must be 'quick' or 'full', found {profile!r}")
    spec = get_spec(model)
    common = dict(model=model, fmt=fmt, backend=backend, device=device, seed=seed)
    if profile == "quick":
        # tiny shapes that keep the models' order of expert sizes (multiples of 32 for int8 blocks)
        inter = 32 * max(1, round(spec.expert_intermediate / 512))
        common.update(hidden=64, intermediate=inter, flush_bytes=2**20, membw_bytes=2**22, warmup=1)
    else:
        common.update(flush_bytes=timing.flush_bytes(device), membw_bytes=timing.read_bytes(device))
    if role == "main":
        layers = (0,) if profile == "quick" else (0, spec.num_moe_layers // 2)
        cfg = dict(layers=layers, ns=tuple(range(1, 10)), u_count=3 if profile == "quick" else 5,
                   windows_per_n=2 if profile == "quick" else 5, reps=3 if profile == "quick" else 5)
    elif role == "transfer":
        cfg = dict(layers=(0,), ns=(2, 4, 6, 8), u_count=0, windows_per_n=2 if profile == "quick" else 4,
                   reps=3)
    else:
        raise ValueError(f"role must be 'main' or 'transfer', found {role!r}")
    return BenchConfig(**common, **cfg)


def run(config: BenchConfig, out_dir: Path | None = None, weights=None, trace=None, resume: bool = True,
        reuse_complete: bool = False, progress: bool = True, timer=None, flush=None) -> Path:
    """Run (or resume) the benchmark of ``config``; return the run folder.

    ``weights``: None (random weights of the spec's shapes), an ExpertWeights (real weights, used
    for every layer), a mapping layer -> ExpertWeights, or a callable layer -> ExpertWeights.
    ``trace``: RoutingTrace whose windows are timed (None: chosen ids only). ``resume``: continue
    the newest incomplete run with the same config and trace, if any. ``reuse_complete``: return
    the newest complete run with the same config and trace instead of measuring again (notebook
    03 reads notebook 02's run this way). ``timer``/``flush`` replace the harness's clock and
    cache flush (tests). The flush and the reference reads default to the machine's sizes
    (``config.flush_bytes``/``membw_bytes`` None: :func:`moespec.measure.timing.flush_bytes`,
    :func:`~moespec.measure.timing.read_bytes`); the sidecar's ``cold`` records them with the cache.
    """
    spec = config.spec()
    _check_inputs(spec, trace, config)
    out_dir = Path(out_dir or paths.expert_op_dir())
    trace_source = "" if trace is None else (trace.label if hasattr(trace, "label") else str(trace.source))
    chash = _config_hash(config, trace_source)
    run_dir = None
    for rec in reversed(find_runs(out_dir)):
        if rec.get("config_hash") != chash:
            continue
        if reuse_complete and rec.get("status") == "complete":
            return Path(rec["run_dir"])
        if resume and rec.get("status") != "complete":
            run_dir = Path(rec["run_dir"])
            break
    backend = _resolve_backend(config.backend, config.device)
    if run_dir is None:
        stamp = _dt.datetime.now(_dt.timezone.utc)
        run_id = f"{stamp:%Y%m%dT%H%M%S}-{spec.name}-{backend}-{config.fmt}-{chash}"
        suffix = 1
        while (out_dir / run_id).exists():  # two runs in one second: never reuse a folder
            suffix += 1
            run_id = f"{stamp:%Y%m%dT%H%M%S}-{spec.name}-{backend}-{config.fmt}-{chash}-{suffix}"
        run_dir = out_dir / run_id
        sidecar = {"run_id": run_id, "config": config.as_dict(), "config_hash": chash, "status": "running",
                   "started": stamp.isoformat(), "spec": dataclasses.asdict(spec), "backend_resolved": backend,
                   "trace_source": trace_source,
                   "weights": "random (published shapes)" if weights is None else "given",
                   "provenance": provenance.full_record(),
                   "cold": timing.cold_record(config.device, config.flush_bytes, config.membw_bytes)}
        if backend == GGML:   # the peer's ggml release and build, beside moespec's versions
            from moespec.measure import ggml_peer
            sidecar["ggml_version"] = ggml_peer.version()
        io.write_json(run_dir / "provenance.json", sidecar)
    sidecar = json.loads((run_dir / "provenance.json").read_text())
    run_id = sidecar["run_id"]
    get_weights = _weights_getter(weights, config, spec)
    forward = expert_forward
    if backend == GGML:
        get_weights, forward = _ggml_weights(get_weights, config.threads), ggml_forward
    timer = timer or timing.timer_for(config.device)
    cold = sidecar.get("cold") or timing.cold_record(config.device, config.flush_bytes, config.membw_bytes)
    flush = flush or timing.CacheFlush(cold["flush_bytes"], config.device)
    threads_before = torch.get_num_threads()
    if config.threads:
        torch.set_num_threads(config.threads)
    try:
        ceiling = _sweep(config, spec, trace, run_dir, run_id, backend, get_weights, forward, timer, flush,
                         progress, cold)
    finally:
        torch.set_num_threads(threads_before)
    if ceiling is not None:
        sidecar.setdefault("cold", cold)["ceiling"] = ceiling.record()
    sidecar.update(status="complete", finished=_dt.datetime.now(_dt.timezone.utc).isoformat(),
                   torch_threads=config.threads or threads_before)
    io.write_json(run_dir / "provenance.json", sidecar)
    return run_dir


def _sweep(config, spec, trace, run_dir, run_id, backend, get_weights, forward, timer, flush, progress, cold):
    """Time every group not yet on disk, writing its rows as it finishes. A group is one
    (layer, n) (``interleave="n"``) or one layer with all its n (``interleave="layer"``); each
    times the ``torch.sum`` read and the read ceiling's patterns beside the kernels. Returns the
    read ceiling (None when every group was on disk)."""

    log = io.RowLog(run_dir / "rows.csv", BATCH_FIELDS if config.batch_sizes else FIELDS, KEY)
    done = log.done_keys()
    read_fn, read_bytes = timing.read_bandwidth_callable(cold["read_bytes"], config.device)
    ceiling = None
    sizes = config.pass_sizes()
    if config.interleave == "n":
        groups = [(layer, (n,), n) for layer in config.layers for n in sizes]
    elif config.interleave == "layer":
        groups = [(layer, sizes, 0) for layer in config.layers]  # read row: n = 0, "all n"
    else:
        raise ValueError(f"interleave must be 'n' or 'layer', found {config.interleave!r}")
    bar = tqdm(groups, desc=f"expert op {spec.name} {backend} {config.fmt}", disable=not progress)
    current_layer, w = None, None
    for layer, ns, read_n in bar:
        todo = [(n, p) for n in ns for p in group_passes(config, spec, trace, layer, n)
                if any((str(layer), str(n), p["pass_id"], k) not in done for k in KERNELS)]
        if not todo:
            continue
        if layer != current_layer:
            w = None  # free the previous layer before building the next
            w = get_weights(layer)
            current_layer = layer
        b = int(w.bytes_per_expert)
        if ceiling is None:   # its lanes read matrices of the layer's gate matrix (a third of an expert)
            ceiling = ReadCeiling(cold["read_bytes"], config.device, matrix_bytes=b // 3)
        xs = {n: torch.randn(n, w.hidden_size, generator=torch.Generator().manual_seed(config.seed * 100 + n))
              .to(config.device) for n in ns}
        calls = {"read": read_fn, **ceiling.calls()}
        for i, (n, p) in enumerate(todo):
            ids = torch.as_tensor(p["ids"], device=config.device)
            order = KERNELS if i % 2 == 0 else KERNELS[::-1]  # alternate which kernel runs first
            for k in order:
                calls[f"{n}/{p['pass_id']}/{k}"] = (lambda x=xs[n], ids=ids, k=k:
                                                    forward(x, ids, w, kernel=k, backend=backend))
        with timing.MachineMonitor(config.device) as mon:
            result = timing.time_interleaved(calls, config.reps, config.warmup, timer=timer, flush=flush)
        base = {"run_id": run_id, "model": spec.name, "layer": layer, "backend": backend, "fmt": w.fmt,
                "device": config.device, "m": spec.top_k, "N": spec.num_experts, **mon.state.row(),
                "flush_bytes": cold["flush_bytes"], "cold_bytes": cold["cold_bytes"]}
        rows = []
        refs = [("membw", "read", "read", read_bytes)] + [
            ("ceiling", p, PREFIX + p, ceiling.bytes[p]) for p in ceiling.patterns]
        for kind, kernel, name, nbytes in refs:
            if (str(layer), str(read_n), name, kernel) not in done:
                rows.append({**base, "n": read_n, "kind": kind, "kernel": kernel, "U": "", "expert_bytes": "",
                             "requested_bytes": nbytes, "pass_id": name, "window": "", **result[name].row()})
        for n, p in todo:
            U = pass_union(p["ids"], spec.num_experts)
            for k in KERNELS:
                if (str(layer), str(n), p["pass_id"], k) in done:
                    continue
                req = requested_bytes(k, n, spec.top_k, U, b)
                rows.append({**base, "n": n, "kind": p["kind"], "kernel": k, "U": U, "expert_bytes": b,
                             "requested_bytes": req, "pass_id": p["pass_id"], "window": p["window"],
                             **{c: p[c] for c in ("B", "k_plus_1") if c in p},
                             **result[f"{n}/{p['pass_id']}/{k}"].row()})
        log.extend(rows)
    return ceiling
