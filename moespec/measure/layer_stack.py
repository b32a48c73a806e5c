"""The expert layers of a whole verify pass, layer after layer, eager and replayed from a CUDA graph.

A verify pass of n tokens through a MoE model runs, in each of its L MoE layers, the expert
operation on that layer's routing of the n tokens (paper 1, Section 4: the verify time T(n) whose
expert part the kernels change). Here the preset's L layers get random weights in the kernel's
format (drawn on the device), and the routing is replayed from a :class:`moespec.routing.RoutingTrace`
(:func:`moespec.measure.expert_op.routing_for`: a recorded trace of the model if ``data/traces``
holds one, else the synthetic one calibrated to paper 1's reuse; the rows carry its label):
windows of n consecutive tokens, the same window in every layer. Each layer's input is the pass's
x: attention, norms and residuals are not modelled, so this measures the expert bytes of a pass
and the launch overhead around them, not a model's whole step. It is the part of issue 20's
whole-model GPU run that needs no engine support (the engine's device=cuda is another issue's).

Per (n, window), one interleaved run (``moespec.measure.timing``) times the L-layer pass with the
per-slot kernel and with the dedup one, each eager (one op call per layer from Python; CUDA
events with the host's enqueueing inside, as an eager engine pays it) and, on a GPU, replayed from
one CUDA graph per pass (GPU time only), round-robin with a read of ``membw_bytes`` (the GPU's
read bandwidth in the same run). A pass reads every layer's experts (a whole OLMoE layer stack is
gigabytes), so no flush is needed: each layer evicts the one before. Rows go to ``rows.csv``
(resumable); :func:`summarize` gives T(n) per kernel and mode and S(n) = T_slot(n) - T_dedup(n).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from moespec.progress import tqdm

from moespec import io, paths, provenance
from moespec.kernels import ExpertWeights, build, expert_forward
from moespec.measure import timing
from moespec.measure import cuda_peers
from moespec.measure.expert_op import requested_bytes, routing_for
from moespec.measure.ids import trace_windows
from moespec.model_shapes import get_spec
from moespec.routing.stats import pass_union

FIELDS = ["model", "fmt", "device", "layers", "n", "m", "N", "window", "doc", "start", "U_mean", "kernel", "mode",
          "bytes", "t_s", "t_q25_s", "t_q75_s", "beta_GBps", "t_read_s", "beta_read_GBps", "of_read", "routing",
          "reps", "gpu_throttle", "flags"]
KEY = ["model", "fmt", "n", "window"]
KERNELS = ("slot", "dedup")


@dataclass(frozen=True)
class StackConfig:
    """One layer-stack run. ``layers``: the first this many MoE layers (None: all of the preset's);
    ``hidden``/``intermediate`` shrink the shapes (tests); ``graph``: also time CUDA-graph replay
    (GPU only)."""

    model: str = "olmoe"
    fmt: str = "bf16"
    device: str = "cuda"
    ns: tuple[int, ...] = tuple(range(1, 10))
    windows: int = 4
    reps: int = 10
    warmup: int = 2
    membw_bytes: int | None = None      # None: timing.read_bytes (at least 1 GiB and 4x the last-level cache)
    spin_cycles: int = 2_000_000
    seed: int = 0
    trace_file: str = ""
    layers: int | None = None
    hidden: int | None = None
    intermediate: int | None = None
    graph: bool = True

    def __post_init__(self):
        if self.windows < 1 or self.reps < 1 or self.warmup < 0:
            raise ValueError(f"windows and reps must be >= 1 and warmup >= 0, got {self.windows}, {self.reps}, "
                             f"{self.warmup}")
        if not self.ns or min(self.ns) < 1:
            raise ValueError(f"pass sizes must be >= 1, got {self.ns}")
        if self.layers is not None and self.layers < 1:
            raise ValueError(f"layers must be >= 1 (or None for all), got {self.layers}")


def layer_call(kernel: str, device: str) -> Callable:
    """``f(x, ids, gates, weights) -> y`` for one layer: on a GPU the op itself (no per-call checks,
    no host sync: capturable in a CUDA graph); on the CPU ``expert_forward`` with the C++ backend."""


    if str(device).startswith("cuda"):
        op = {"slot": torch.ops.moespec.expert_slot, "dedup": torch.ops.moespec.expert_dedup}[kernel]
        return lambda x, ids, gates, w: op(x, ids, gates, *w.tensors())
    return lambda x, ids, gates, w: expert_forward(x, ids, w, gates, kernel=kernel, backend="cpp")


def stack_pass(kernel: str, device: str, x, ids_layers, gates_layers, weights) -> Callable[[], object]:
    """The L-layer pass as a no-argument call: layer l runs on (x, ids_layers[l], gates_layers[l])."""
    call = layer_call(kernel, device)

    def run():
        y = None
        for ids, gates, w in zip(ids_layers, gates_layers, weights):
            y = call(x, ids, gates, w)
        return y

    return run


def run(config: StackConfig, out_dir: Path | None = None, progress: bool = True) -> Path:
    """Measure the layer stack; returns the run folder (``rows.csv``, ``report.md``, ``provenance.json``)."""


    cuda = str(config.device).startswith("cuda")
    if cuda:
        if not torch.cuda.is_available():
            raise RuntimeError(f"no GPU visible to torch {torch.__version__}")
        build.load_cuda()
    else:
        build.load_cpu()
    spec = get_spec(config.model)
    H = config.hidden or spec.hidden_size
    I = config.intermediate or spec.expert_intermediate
    N, m = spec.num_experts, spec.top_k
    L = config.layers or spec.num_moe_layers
    trace = routing_for(config.model, config.trace_file, seed=config.seed)
    if len(trace.docs[0][0]) < L:
        raise ValueError(f"the trace has {len(trace.docs[0][0])} MoE layers, fewer than the {L} asked for")
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = paths.ensure(out_dir or paths.bench_dir() / "layer_stack" / stamp)
    log = io.RowLog(out / "rows.csv", FIELDS, KEY)
    done = log.done_keys()
    weights = [ExpertWeights.random((N, H, I), config.fmt, seed=config.seed * 1000 + layer, device=config.device,
                                    on_device=cuda) for layer in range(L)]
    b = weights[0].bytes_per_expert
    read_fn, read_bytes = timing.read_bandwidth_callable(config.membw_bytes, config.device)
    eager_timer = timing.timer_for(config.device)
    graph_timer = timing.QueuedCudaTimer(config.device, config.spin_cycles) if cuda else None
    rng = np.random.default_rng(config.seed)
    for n in tqdm(config.ns, desc="layer stack: n", disable=not progress):
        wins = trace_windows(trace.docs, None, n, config.windows, rng)
        for w, (doc, start, ids_nlm) in enumerate(wins):
            if (config.model, config.fmt, str(n), str(w)) in done:
                continue
            gen = torch.Generator(device=config.device).manual_seed(config.seed + 97 * n + w)
            x = torch.randn((n, H), generator=gen, device=config.device)
            ids_layers = [torch.from_numpy(np.ascontiguousarray(ids_nlm[:, layer, :])).to(config.device)
                          for layer in range(L)]
            gates_layers = [torch.softmax(torch.randn((n, m), generator=gen, device=config.device), dim=1)
                            for _ in range(L)]
            U = [pass_union(ids_nlm[:, layer, :], N) for layer in range(L)]
            calls, timers, flags = {}, {}, []
            for kernel in KERNELS:
                fn = stack_pass(kernel, config.device, x, ids_layers, gates_layers, weights)
                calls[f"{kernel}/eager"], timers[f"{kernel}/eager"] = fn, eager_timer
                if cuda and config.graph:
                    try:
                        calls[f"{kernel}/graph"], timers[f"{kernel}/graph"] = cuda_peers.graph_replay(fn), graph_timer
                    except Exception as exc:  # report, keep measuring eager
                        flags.append(f"graph capture of {kernel} failed: {type(exc).__name__}")
            calls["read"], timers["read"] = read_fn, eager_timer
            with timing.MachineMonitor(config.device) as mon:
                res = timing.time_interleaved(calls, reps=config.reps, warmup=config.warmup,
                                              timer=lambda fn, _t=timers, _c=calls: _t[_name_of(_c, fn)](fn))
            tr = res["read"]
            beta_r = read_bytes / tr.median_s
            rows = []
            for name, t in res.items():
                if name == "read":
                    continue
                kernel, mode = name.split("/")
                nbytes = float(sum(requested_bytes(kernel, n, m, u, b) for u in U))
                rows.append({"model": config.model, "fmt": config.fmt, "device": config.device, "layers": L, "n": n,
                             "m": m, "N": N, "window": w, "doc": doc, "start": start, "U_mean": float(np.mean(U)),
                             "kernel": kernel, "mode": mode, "bytes": nbytes, "t_s": t.median_s, "t_q25_s": t.q25_s,
                             "t_q75_s": t.q75_s, "beta_GBps": nbytes / t.median_s / 1e9, "t_read_s": tr.median_s,
                             "beta_read_GBps": beta_r / 1e9, "of_read": nbytes / t.median_s / beta_r,
                             "routing": trace.label, "reps": t.reps, "gpu_throttle": mon.state.gpu_throttle,
                             "flags": ";".join([*mon.state.flags, *flags])})
            log.extend(rows)
            del calls
    io.write_json(out / "provenance.json", {"config": dataclasses.asdict(config), **provenance.full_record()})
    io.write_text(out / "report.md", report_markdown(pd.DataFrame(log.rows()), config))
    return out


def _name_of(calls: dict, fn) -> str:
    """The name under which ``fn`` is in ``calls`` (the interleaved timer gets the callable only)."""
    for name, f in calls.items():
        if f is fn:
            return name
    raise KeyError("callable not in the group")


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Per (model, fmt, n, mode): median over windows of T_slot, T_dedup (seconds), S(n) =
    T_slot - T_dedup, the mean U per layer, and the slot pass's share of the read bandwidth."""
    df = rows.copy()
    for c in ("n", "t_s", "of_read", "U_mean"):
        df[c] = pd.to_numeric(df[c])
    wide = df.pivot_table(index=["model", "fmt", "n", "mode", "window"], columns="kernel",
                          values=["t_s", "of_read"], aggfunc="first")
    wide.columns = [f"{a}_{k}" for a, k in wide.columns]
    wide = wide.reset_index()
    wide["S_s"] = wide["t_s_slot"] - wide["t_s_dedup"]
    u = df.groupby(["model", "fmt", "n"])["U_mean"].mean().rename("U_mean").reset_index()
    out = wide.groupby(["model", "fmt", "n", "mode"]).median(numeric_only=True).reset_index()
    return out.drop(columns=["window"], errors="ignore").merge(u, on=["model", "fmt", "n"])


def report_markdown(rows: pd.DataFrame, config: StackConfig) -> str:
    lines = ["# Expert layers of a verify pass (layer stack)", "",
             f"- model {config.model}, format {config.fmt}, device {config.device}; routing: "
             f"{rows['routing'].iloc[0] if len(rows) else 'n/a'}",
             f"- {rows['layers'].iloc[0] if len(rows) else '?'} MoE layers with random weights; attention, norms and "
             "residuals not modelled; windows per n: " + str(config.windows),
             "- eager: one op call per layer from Python, host enqueueing inside the CUDA events; graph: the pass "
             "replayed from one CUDA graph (GPU time only)", "",
             "| n | mode | U per layer | T slot (ms) | T dedup (ms) | S(n) (ms) | slot share of read | dedup share of read |",
             "|---|---|---|---|---|---|---|---|"]
    if len(rows):
        for _, r in summarize(rows).iterrows():
            lines.append(f"| {int(r['n'])} | {r['mode']} | {r['U_mean']:.1f} | {r['t_s_slot'] * 1e3:.3f} "
                         f"| {r['t_s_dedup'] * 1e3:.3f} | {r['S_s'] * 1e3:+.3f} | {r['of_read_slot']:.2f} "
                         f"| {r['of_read_dedup']:.2f} |")
    return "\n".join(lines) + "\n"
