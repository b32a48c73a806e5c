"""The discard rule of the expert-operation benchmark: which interleaved groups of timings enter
the tables and fits (paper 1, Appendix E: timings taken while the machine was disturbed are
discarded).

A group is one interleaved block of :func:`moespec.measure.expert_op.run` (all passes of a layer,
or of one (layer, n)), timed together with a read of ``membw_bytes`` (``torch.sum``, the
``membw`` row of the group) and the read ceiling (rows of kind ``ceiling``, not counted as timed
rows) that see the same machine. A group is discarded when

* its read bandwidth departs from the median read bandwidth of its run's groups by more than
  :data:`READ_DEPARTURE_SHARE` (the machine's memory bandwidth moved while the group ran). The
  read is judged (column ``judged``) only where it can say this: when it reads at least
  :func:`judged_read_bytes` (the machine's cold size, the flush of the protocol: a smaller read is
  served by the caches, as in the quick profiles' 4 MiB reads), and when some group of the run
  reads within the share of the median (with two groups both depart by the same share, so a larger
  gap says the groups disagree, not which one moved); or
* any of its rows carries a flag of :data:`DISCARDING_FLAGS` (the machine swapped, or a GPU
  reported a slowing throttle reason: :class:`moespec.measure.timing.MachineMonitor`).

The monitor's ``busy=`` flag (other processes used more than half of all CPUs) is recorded but
does not discard: on a shared 2-core machine it is set on every group while the read bandwidth
stays within a percent of its median (docs/bench.md), so the read itself is the test of
whether the kernels saw a disturbed machine. :func:`apply_rule` is the one place the rule is
applied; every consumer of the rows (notebooks 02, 03, 06, 07) calls it.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from moespec.measure.ceiling import REFERENCE_KINDS
from moespec.measure.timing import FLUSH_FLOOR_BYTES

#: Largest share by which a group's read bandwidth may depart from its run's median read
#: bandwidth (docs/bench.md gives the committed run's departures this was chosen from).
READ_DEPARTURE_SHARE = 0.05
def judged_read_bytes(reads: pd.DataFrame) -> pd.Series:
    """Per read row, the smallest read that measures the memory rather than the caches: the
    machine's cold size the run recorded (column ``cold_bytes``: :func:`moespec.measure.timing.flush_bytes`
    where it ran), else the paper's 256 MiB flush (:data:`~moespec.measure.timing.FLUSH_FLOOR_BYTES`,
    the flush of runs that predate the column)."""
    cold = pd.to_numeric(reads["cold_bytes"], errors="coerce") if "cold_bytes" in reads else None
    if cold is None:
        return pd.Series(float(FLUSH_FLOOR_BYTES), index=reads.index)
    return cold.where(cold > 0, float(FLUSH_FLOOR_BYTES)).fillna(float(FLUSH_FLOOR_BYTES))
#: Flag prefixes of :class:`moespec.measure.timing.MachineMonitor` that discard a group.
DISCARDING_FLAGS = ("swap", "gpu_throttle")
#: Columns the rule adds to each row.
RULE_COLUMNS = ("group", "discarded", "discard_reason")


@dataclass(frozen=True)
class DiscardDecision:
    """The rule applied to one set of rows.

    ``rows``: every row with :data:`RULE_COLUMNS` added; ``groups``: one row per group (run,
    layer, the read's n: 0 for a group holding every n of its layer) with its read bandwidth,
    its run's median, the departure, the number of timed rows, ``discarded`` and the reason.
    """

    rows: pd.DataFrame
    groups: pd.DataFrame
    share: float

    @property
    def kept(self) -> pd.DataFrame:
        """The rows of the kept groups (read rows included), without the rule's columns; raises
        ``ValueError`` listing the groups and why when the rule discards every group."""
        if len(self.groups) and self.groups["discarded"].all():
            why = "; ".join(f"run {r.run_id} layer {r.layer} n {r.n}: {r.discard_reason}" for r in self.groups.itertuples())
            raise ValueError(f"the discard rule (read within {self.share:.0%} of the run's median, no swap or GPU "
                             f"throttle) discards every group: {why}. Repeat the run on a quieter machine, or "
                             f"pass a larger share and say so")
        return self.rows.loc[~self.rows["discarded"]].drop(columns=list(RULE_COLUMNS))

    def counts(self, table: str) -> dict:
        """Groups and timed rows kept and discarded, for the table ``table`` that reads them."""
        g = self.groups
        return {"table": table, "groups_kept": int((~g["discarded"]).sum()),
                "groups_discarded": int(g["discarded"].sum()),
                "rows_kept": int(g.loc[~g["discarded"], "timed_rows"].sum()),
                "rows_discarded": int(g.loc[g["discarded"], "timed_rows"].sum()),
                "share": self.share}


def _flag_reason(flags: pd.Series) -> str:
    hits = sorted({f.split("=")[0] for v in flags for f in str(v).split(";")
                   if f and f.split("=")[0] in DISCARDING_FLAGS})
    return ";".join(hits)


def apply_rule(rows: pd.DataFrame, share: float = READ_DEPARTURE_SHARE,
               source: str = "expert-operation rows") -> DiscardDecision:
    """Apply the discard rule to benchmark rows (:data:`moespec.measure.expert_op.FIELDS`).

    Each timed row (kind other than the reference kinds ``membw`` and ``ceiling``) and each ceiling
    row belongs to the read row of its run with its layer and its n, else n = 0 (one group per
    layer). A group's read judges it (``judged``) when it reads at least :func:`judged_read_bytes`
    and some group of its run reads within ``share`` of the run's median (see the module's
    docstring). Raises ``ValueError`` naming ``source`` and the row when a timed row has no read in
    its run and layer, when a read time or size is not a positive number, or when ``share`` is not
    positive.
    """
    if not share > 0:
        raise ValueError(f"discard share must be > 0, found {share!r}")
    missing = [c for c in ("layer", "kind", "n", "requested_bytes", "t_median_s") if c not in rows.columns]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing} needed by the discard rule")
    df = rows.copy()
    run = df["run_id"].astype(str) if "run_id" in df.columns else pd.Series("", index=df.index)
    is_read = df["kind"] == "membw"
    reads = df[is_read]
    t = pd.to_numeric(reads["t_median_s"], errors="coerce")
    nbytes = pd.to_numeric(reads["requested_bytes"], errors="coerce")
    bad = ~((t > 0) & (nbytes > 0))
    if bad.any():
        i = reads.index[bad.to_numpy()][0]
        raise ValueError(f"{source}: read row {i} needs t_median_s > 0 and requested_bytes > 0; found "
                         f"{rows.loc[i, 't_median_s']!r} and {rows.loc[i, 'requested_bytes']!r}")
    layer = pd.to_numeric(df["layer"]).astype(int)
    n = pd.to_numeric(df["n"]).astype(int)
    groups = pd.DataFrame({"run_id": run[is_read], "layer": layer[is_read], "n": n[is_read],
                           "read_GBps": (nbytes / t / 1e9).to_numpy()})
    groups["run_median_GBps"] = groups.groupby("run_id")["read_GBps"].transform("median")
    groups["departure"] = groups["read_GBps"] / groups["run_median_GBps"] - 1.0
    big = (nbytes >= judged_read_bytes(reads)).to_numpy()
    within = pd.Series(big & (groups["departure"].abs() <= share).to_numpy(), index=groups.index)
    groups["judged"] = big & within.groupby(groups["run_id"]).transform("any").to_numpy()
    group_of = {(r, l, k): i for i, (r, l, k) in zip(groups.index, zip(groups["run_id"], groups["layer"], groups["n"]))}
    member = pd.Series(groups.index.to_numpy(), index=groups.index, dtype=object).reindex(df.index)
    for i in df.index[~is_read]:
        g = group_of.get((run[i], layer[i], n[i]), group_of.get((run[i], layer[i], 0)))
        if g is None:
            raise ValueError(f"{source}: row {i} (layer {layer[i]}, n {n[i]}, kind {df.loc[i, 'kind']!r}) has no "
                             f"read-bandwidth row (kind 'membw') in its run {run[i]!r} and layer")
        member[i] = g
    df["group"] = member.astype(int)
    # an all-empty flags column reads back as float NaN; as objects, "" fills it (pandas refuses "" in float64)
    flags = df["flags"].astype(object).fillna("").astype(str) if "flags" in df.columns else pd.Series("", index=df.index)
    reasons = []
    for g, r in groups.iterrows():
        why = [_flag_reason(flags[df["group"] == g])]
        if r["judged"] and abs(r["departure"]) > share:
            why.insert(0, f"read {r['departure']:+.1%} from the run's median")
        reasons.append("; ".join(w for w in why if w))
    timed = ~df["kind"].isin(REFERENCE_KINDS)
    groups["timed_rows"] = [int(((df["group"] == g) & timed).sum()) for g in groups.index]
    groups["discard_reason"] = reasons
    groups["discarded"] = groups["discard_reason"] != ""
    df["discarded"] = df["group"].map(groups["discarded"]).astype(bool)
    df["discard_reason"] = df["group"].map(groups["discard_reason"])
    return DiscardDecision(rows=df, groups=groups.reset_index(drop=True).assign(group=groups.index.to_numpy()),
                           share=float(share))


def counts_table(decisions: dict[str, DiscardDecision]) -> pd.DataFrame:
    """One row per table (key of ``decisions``): groups and timed rows kept and discarded."""
    return pd.DataFrame([d.counts(table) for table, d in decisions.items()])


def combine(decisions) -> DiscardDecision:
    """One decision over several runs' decisions (the groups of each, concatenated; a table such as
    Figure 7's reads several runs)."""
    decisions = list(decisions)
    shares = {d.share for d in decisions}
    if len(shares) != 1:
        raise ValueError(f"decisions made with different shares {sorted(shares)} cannot be combined")
    return DiscardDecision(rows=pd.concat([d.rows for d in decisions], ignore_index=True),
                           groups=pd.concat([d.groups for d in decisions], ignore_index=True),
                           share=shares.pop())


__all__ = ["READ_DEPARTURE_SHARE", "DISCARDING_FLAGS", "DiscardDecision", "apply_rule", "counts_table", "combine"]
