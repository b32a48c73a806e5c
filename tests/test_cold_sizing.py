"""Cold working sets sized from the machine's last-level cache (moespec.measure.timing.flush_bytes),
the cache record read from sysfs (moespec.provenance.llc_record), the read ceiling's choice of the
best pattern on a fake clock (moespec.measure.ceiling) and the check of a share above 1."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from moespec import provenance
from moespec.measure import ceiling, timing

MiB, GiB = 2**20, 2**30


@pytest.mark.parametrize("llc, flush, read", [
    (32 * MiB, 256 * MiB, GiB),              # AMD EPYC VM: 4 x 32 MiB below the paper's floor
    (480 * MiB, 1920 * MiB, 1920 * MiB),     # Intel Xeon VM reporting 480 MiB: the read grows with it
    (1536 * MiB, 6 * GiB, 6 * GiB),          # a server with 1.5 GiB of L3
    (0, 256 * MiB, GiB),                     # no cache reported: the paper's flush
])
def test_flush_and_read_sizes_from_a_cache_record(llc, flush, read):
    cache = {"level": "L3", "bytes": llc}
    assert timing.flush_bytes(cache=cache) == flush
    assert timing.read_bytes(cache=cache) == read


def test_gpu_l2_sizes_the_flush(monkeypatch):
    import torch

    # an H100's 50 MiB L2: 200 MiB, so the paper's 256 MiB; a 126 MiB L2: 504 MiB
    for l2, flush in ((50 * MiB, 256 * MiB), (126 * MiB, 504 * MiB)):
        props = SimpleNamespace(name="fake GPU", L2_cache_size=l2)
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, props=props: props)
        cache = timing.last_level_cache("cuda:0")
        assert cache["level"] == "L2" and cache["bytes"] == l2 and "fake GPU" in cache["source"]
        assert timing.flush_bytes("cuda:0") == flush
        rec = timing.cold_record("cuda:0")
        assert rec["cold_bytes"] == rec["flush_bytes"] == flush and rec["read_bytes"] == max(GiB, flush)


def _cache(root, cpu, index, level, kind, size, shared, ident=None):
    d = root / f"cpu{cpu}" / "cache" / f"index{index}"
    d.mkdir(parents=True)
    for name, value in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
        (d / name).write_text(f"{value}\n")
    if ident is not None:
        (d / "id").write_text(f"{ident}\n")


def test_llc_record_totals_the_instances(tmp_path):
    # one socket's L3 shared by both CPUs (lscpu: "L3: 480 MiB (1 instance)")
    shared = tmp_path / "shared"
    for cpu in (0, 1):
        _cache(shared, cpu, 0, 1, "Data", "48K", cpu)
        _cache(shared, cpu, 1, 1, "Instruction", "64K", cpu)
        _cache(shared, cpu, 2, 2, "Unified", "2048K", cpu)
        _cache(shared, cpu, 3, 3, "Unified", "491520K", "0-1", ident=0)
    rec = provenance.llc_record(shared)
    assert (rec["level"], rec["instance_bytes"], rec["instances"], rec["bytes"]) == ("L3", 480 * MiB, 1, 480 * MiB)
    # a VM reporting the L3 per core (two instances of 32 MiB): the machine can hold both
    per_core = tmp_path / "per_core"
    for cpu in (0, 1):
        _cache(per_core, cpu, 0, 2, "Unified", "1M", cpu)
        _cache(per_core, cpu, 1, 3, "Unified", "32M", cpu)
    rec = provenance.llc_record(per_core)
    assert (rec["instances"], rec["bytes"]) == (2, 64 * MiB)
    assert timing.flush_bytes(cache=rec) == 256 * MiB
    # no caches at all
    assert provenance.llc_record(tmp_path / "none")["bytes"] == 0


def test_hardware_record_holds_the_llc():
    assert set(provenance.cpu_record()["llc"]) >= {"level", "bytes", "instances", "source"}


class FakeProbe:
    """read_probe's signature: each pattern reads ``per_buffer[pattern]`` bytes of a buffer and takes
    ``ns[pattern]`` fake nanoseconds of the clock."""

    def __init__(self, clock, per_buffer, ns):
        self.clock, self.per_buffer, self.ns, self.seen = clock, per_buffer, ns, []

    def __call__(self, buf, pattern, matrix_bytes, threads, fmas, prefetch):
        self.seen.append((pattern, buf.numel() * 4, matrix_bytes, threads, fmas, prefetch))
        self.clock.now += self.ns[pattern]
        return self.ns[pattern], self.per_buffer[pattern], 0.0


class Clock:
    now = 0

    def __call__(self):
        return self.now


def test_ceiling_is_the_best_patterns_bytes_over_time():
    clock = Clock()
    # per buffer: halves 1000 bytes in 100 ns (10 GB/s), lanes 1000 in 80 ns (12.5 GB/s), side 900 in 80
    probe = FakeProbe(clock, {"halves": 1000, "lanes": 1000, "side": 900}, {"halves": 100, "lanes": 80, "side": 80})
    c = ceiling.ReadCeiling(3 * 2**20, threads=2, patterns=("halves", "lanes", "side"), buffers=3,
                            matrix_bytes=2304 * 1024, probe=probe)
    res = timing.time_interleaved(c.calls(), reps=3, warmup=1, timer=timing.CpuTimer(clock))
    assert list(res) == ["ceiling:halves", "ceiling:lanes", "ceiling:side"]
    assert c.bytes == {"halves": 3000, "lanes": 3000, "side": 2700}          # three buffers per call
    assert res["ceiling:lanes"].samples_ns == (240.0,) * 3
    s = c.summary(res)
    assert s["pattern"] == "lanes" and s["GBps"] == pytest.approx(3000 / 240)
    assert s["patterns"] == pytest.approx({"halves": 10.0, "lanes": 12.5, "side": 2700 / 240})
    assert np.allclose(s["per_round"], 12.5)
    # the kernels' threads, every buffer of 1 MiB, no arithmetic, no prefetch
    assert {p[1:] for p in probe.seen} == {(2**20, 2**19, 2, 0, 0)}   # a matrix of at most half a buffer
    with pytest.raises(ValueError, match="no timed read-ceiling calls"):
        c.summary({})
    with pytest.raises(ValueError, match="not among"):
        ceiling.ReadCeiling(2**20, patterns=("sideways",), probe=probe)


def test_ceiling_with_torch_reads_counts_its_bytes():
    c = ceiling.ReadCeiling(3 * 2**20, probe=None, device="cpu", patterns=None, buffers=3)
    if c.probe is not None:      # the extension loaded: its patterns; torch's reads on request
        c.probe = None
        c.patterns = ceiling.TORCH_PATTERNS
    for fn in c.calls().values():
        fn()
    assert c.bytes == {"sum": 3 * 2**20, "copy": 3 * 2**20}


def test_share_above_one_flagged_beyond_the_spread():
    """Shares 0.9 and 1.02 within the probe's spread (its fast quartile 5 % above its median) are not
    flagged; 1.2 is, with its likely cause."""
    from moespec.tables.bandwidth import flag_shares

    bw = pd.DataFrame({"n": [1, 2, 3], "ubar": [1.0, 1.0, 0.9], "read_GBps": 10.0, "read_hi_GBps": 10.5,
                       "beta_slot_GBps": [9.0, 10.2, 12.0], "beta_dedup_GBps": [9.0, 9.5, 9.8],
                       "flush_bytes": 2**31, "cold_bytes": 2**31})
    out = flag_shares(bw)
    assert out["slot_over_read"].tolist() == pytest.approx([0.9, 1.02, 1.2])
    assert out["above_read"].tolist() == ["", "", "slot"]
    assert out["above_read_cause"].tolist() == ["", "", f"slot: {ceiling.CAUSE_REREAD}"]
    # at n = 1 (no repeated expert) the cause is the probe; with a flush below the cold size, the flush
    one = flag_shares(bw.assign(ubar=1.0))
    assert one["above_read_cause"].iloc[2] == f"slot: {ceiling.CAUSE_PROBE}"
    small = flag_shares(bw.assign(flush_bytes=2**28))
    assert small["above_read_cause"].iloc[2] == f"slot: {ceiling.CAUSE_FLUSH}"
    old = flag_shares(bw.drop(columns=["flush_bytes", "cold_bytes"]))
    assert old["above_read_cause"].iloc[2] == f"slot: {ceiling.CAUSE_UNKNOWN}"


def _rows(ceiling_rows: bool = True) -> pd.DataFrame:
    """One group (layer 0, n = 0: every n) of a run: a torch.sum read of 1 GB in 0.1 s (10 GB/s), the
    ceiling's lanes 1 GB in 0.08 s (12.5 GB/s; first quartile 0.075 s) and halves in 0.09 s, and one
    window per n = 1, 2 with both kernels: per-slot 8 experts of 1e8 bytes in 0.08 s (10 GB/s) at n = 1,
    16 slots of 9 distinct experts in 0.1 s (16 GB/s) at n = 2."""
    base = dict(run_id="r", model="toy", backend="cpp", fmt="f32", layer=0, m=8, N=64, expert_bytes=1e8,
                flags="", flush_bytes=2**31, cold_bytes=2**31)
    rows = [dict(base, kind="membw", kernel="read", n=0, pass_id="read", requested_bytes=1e9, t_median_s=0.1,
                 t_q25_s=0.1, U="")]
    if ceiling_rows:
        rows += [dict(base, kind="ceiling", kernel=p, n=0, pass_id=f"ceiling:{p}", requested_bytes=1e9,
                      t_median_s=t, t_q25_s=q, U="") for p, t, q in (("halves", 0.09, 0.09), ("lanes", 0.08, 0.075))]
    for n, U, t_slot, t_dedup in ((1, 8, 0.08, 0.08), (2, 9, 0.1, 0.09)):
        for kernel, t in (("slot", t_slot), ("dedup", t_dedup)):
            rows.append(dict(base, kind="window", kernel=kernel, n=n, U=U, pass_id=f"w{n}", t_median_s=t, t_q25_s=t,
                             requested_bytes=(n * 8 if kernel == "slot" else U) * 1e8))
    return pd.DataFrame(rows)


def test_bandwidth_by_n_divides_by_the_ceiling_and_flags_above_it():
    from moespec.measure import expert_op
    from moespec.tables.bandwidth import bandwidth_by_n

    bw = bandwidth_by_n(_rows()).set_index("n")
    assert bw["read_probe"].tolist() == ["lanes", "lanes"]
    assert bw["read_GBps"].tolist() == pytest.approx([12.5, 12.5])
    assert bw["read_hi_GBps"].tolist() == pytest.approx([1e9 / 0.075 / 1e9] * 2)
    assert bw["sum_GBps"].tolist() == pytest.approx([10.0, 10.0])
    assert bw.loc[1, "slot_over_read"] == pytest.approx(10 / 12.5) and bw.loc[1, "slot_over_sum"] == pytest.approx(1.0)
    # n = 2: per-slot 16 GB/s, 1.2 of the ceiling's fast quartile (13.3 GB/s): flagged, re-reads the cause
    assert bw.loc[2, "slot_over_read"] == pytest.approx(16 / 12.5)
    assert bw["above_read"].tolist() == ["", "slot"]
    assert bw.loc[2, "above_read_cause"] == f"slot: {ceiling.CAUSE_REREAD}"
    # a run without the ceiling (older rows): torch.sum is the read, and the flag still applies
    old = bandwidth_by_n(_rows(ceiling_rows=False).drop(columns=["flush_bytes", "cold_bytes"])).set_index("n")
    assert old["read_probe"].tolist() == ["torch.sum"] * 2 and old["read_GBps"].tolist() == pytest.approx([10, 10])
    assert old.loc[2, "above_read_cause"] == f"slot: {ceiling.CAUSE_UNKNOWN}"
    assert expert_op.read_bandwidth(_rows())["probe"] == "lanes"
    # a probe slower than torch.sum: torch.sum is the ceiling (the ceiling is never below it)
    slow = _rows()
    slow.loc[slow["kind"] == "ceiling", ["t_median_s", "t_q25_s"]] = 0.2
    assert bandwidth_by_n(slow)["read_probe"].tolist() == ["torch.sum"] * 2
    assert expert_op.read_bandwidth(_rows(), reference="sum")["median_GBps"] == pytest.approx(10.0)


def test_flagged_shares_are_marked_in_the_figures():
    import matplotlib

    matplotlib.use("Agg")
    from moespec import fit
    from moespec.plots.bandwidth import FLAG_LABEL, figure2_bandwidth
    from moespec.plots.kernels import kernel_share_figure
    from moespec.tables.bandwidth import bandwidth_by_n

    rows = _rows()
    fig = figure2_bandwidth(fit.window_bandwidths(rows), {"toy": bandwidth_by_n(rows)})
    ax = fig.get_axes()[0]
    ring = [line for line in ax.get_lines() if line.get_label() == FLAG_LABEL]
    assert len(ring) == 1 and ring[0].get_xydata().tolist() == [[2.0, 16.0]]
    caption = " ".join(t.get_text() for t in fig.texts)
    assert "Red rings" in caption and "toy n = 2" in " ".join(caption.split()) and "re-reads" in caption
    labels = [line.get_label() for line in ax.get_lines()]
    assert any(lab.startswith("read ceiling (lanes)") for lab in labels) and any("torch.sum" in lab for lab in labels)
    # the benchmark's figure: a ring on each flagged row, the causes under the panels
    share = pd.DataFrame([dict(model="toy", fmt="f32", kernel=k, backend="cpp", n=n, beta_over_read=s,
                               beta_over_read_q25=s - 0.01, beta_over_read_q75=s + 0.01, read_GBps=12.5,
                               read_probe="lanes", layer_read_over_read=0.97, above_read=s - 0.01 > 1,
                               above_read_cause=ceiling.CAUSE_PROBE if s - 0.01 > 1 else "")
                          for k in ("slot", "dedup") for n, s in ((1, 0.95), (2, 1.2))])
    fig = kernel_share_figure(share, "toy")
    ax = fig.get_axes()[0]
    assert ax.get_title() == "f32, read ceiling (lanes) 12.5 GB/s"
    rings = [line for line in ax.get_lines() if "above 1" in line.get_label()]
    assert len(rings) == 1 and rings[0].get_xydata().tolist() == [[2.0, 1.2], [2.0, 1.2]]
    assert ceiling.CAUSE_PROBE in " ".join(" ".join(t.get_text() for t in fig.texts).split())


def test_breadth_rows_flag_a_lower_quartile_above_one():
    from moespec.tables.bandwidth import breadth_bandwidths

    rows = []
    for backend in ("cpp", "ggml"):
        for kernel, q25 in (("slot", 1.03), ("dedup", 0.97)):
            rows.append(dict(model="toy", fmt="f32", kernel=kernel, backend=backend, n=1, m=8, U_mean=8.0,
                             beta_GBps=10.0, beta_over_read=q25 + 0.01, beta_over_read_q25=q25, read_GBps=10.0,
                             r_n=1.0, r_n_ggml=1.0, flush_bytes=2**28, cold_bytes=2**31))
    bw = breadth_bandwidths(pd.DataFrame(rows))
    assert bw["slot_above_read"].tolist() == [True, True] and not bw["dedup_above_read"].any()
    assert set(bw["slot_above_read_cause"]) == {ceiling.CAUSE_FLUSH} and set(bw["dedup_above_read_cause"]) == {""}


def test_report_shows_the_new_columns_where_present_and_the_flag():
    from moespec.report.format import named_table
    from moespec.report.sections import _above_read_note

    old = pd.DataFrame({"n": [1, 2], "slot_over_read": [1.07, 1.08]})
    new = old.assign(read_probe="lanes", above_read=["", "slot"], above_read_cause=["", f"slot: {ceiling.CAUSE_PROBE}"])
    cols = "n,read_probe?,slot_over_read,above_read?"
    assert named_table(old, "t.csv", cols).splitlines()[2] == "| n | slot_over_read |"
    assert named_table(new, "t.csv", cols).splitlines()[2] == "| n | read_probe | slot_over_read | above_read |"
    assert _above_read_note(old) == ""
    assert "at most 1" in _above_read_note(new.assign(above_read=""))
    assert _above_read_note(new).endswith(f"n = 2 slot: {ceiling.CAUSE_PROBE}.")


def test_benchmark_provenance_records_the_cache_and_sizes(tmp_path):
    import json

    from moespec.measure import protocols

    rec = json.loads(protocols.write_provenance(tmp_path / "p.json", {"flush_mib": 512, "membw_gib": 2.0}).read_text())
    cold = rec["cold"]
    assert (cold["flush_bytes"], cold["read_bytes"]) == (512 * MiB, 2 * GiB)
    assert cold["cold_bytes"] == timing.flush_bytes(cache=cold["cache"])
    assert cold["cache"] == rec["hardware"]["cpu"]["llc"]
    mine = json.loads(protocols.write_provenance(tmp_path / "q.json", {"threads": 2}).read_text())["cold"]
    assert mine["flush_bytes"] == mine["cold_bytes"] and mine["read_bytes"] == timing.read_bytes(cache=mine["cache"])
