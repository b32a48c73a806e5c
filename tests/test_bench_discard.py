"""The discard rule of the expert-operation benchmark (moespec.measure.discard) on a hand case."""

from __future__ import annotations

import pandas as pd
import pytest

from moespec.measure import discard
from moespec.measure.timing import FLUSH_FLOOR_BYTES


def _row(run, layer, n, kind, kernel, t, pass_id, flags="", nbytes=1e9):
    return dict(run_id=run, layer=layer, n=n, kind=kind, kernel=kernel, pass_id=pass_id, t_median_s=t,
                requested_bytes=nbytes, flags=flags)


def hand_rows() -> pd.DataFrame:
    rows = []
    # run A, one group per (layer, n): reads of 1 GB in 0.1, 0.1, 0.104, 0.2 s -> 10, 10, 9.615, 5 GB/s,
    # median 9.8077 GB/s; n = 4 departs by -49 %, the others by +-1.96 %
    for n, t in zip((1, 2, 3, 4), (0.1, 0.1, 0.104, 0.2)):
        rows.append(_row("A", 0, n, "membw", "read", t, "read"))
        rows += [_row("A", 0, n, "chosen", k, 0.01, f"A{n}") for k in ("slot", "dedup")]
    # run B, one group per layer (read n = 0): equal reads; layer 0 busy (kept), layer 1 swapped
    for layer, flags in ((0, "busy=0.90"), (1, "swap")):
        rows.append(_row("B", layer, 0, "membw", "read", 0.1, "read", flags=flags))
        rows += [_row("B", layer, n, "window", k, 0.01, f"B{layer}:{n}", flags=flags)
                 for n in (2,) for k in ("slot", "dedup")]
    return pd.DataFrame(rows)


def test_discard_rule_hand_case_exact_rows():
    dec = discard.apply_rule(hand_rows(), share=0.05)
    g = dec.groups.set_index(["run_id", "layer", "n"])
    median = (10 + 1 / 0.104) / 2
    assert g.loc[("A", 0, 4), "departure"] == pytest.approx(5 / median - 1, rel=1e-12)
    assert g.loc[("A", 0, 1), "departure"] == pytest.approx(10 / median - 1, rel=1e-12)
    assert g["run_median_GBps"].tolist() == pytest.approx([median] * 4 + [10, 10], rel=1e-12)
    assert g["discarded"].tolist() == [False, False, False, True, False, True]
    assert g.loc[("A", 0, 4), "discard_reason"] == "read -49.0% from the run's median"
    assert g.loc[("B", 1, 0), "discard_reason"] == "swap"
    kept = dec.kept
    assert sorted(set(kept.loc[kept["kind"] != "membw", "pass_id"])) == ["A1", "A2", "A3", "B0:2"]
    assert len(kept) == 4 * 3 and "discarded" not in kept.columns   # 4 groups of a read and 2 kernels
    assert dec.counts("Table 1") == {"table": "Table 1", "groups_kept": 4, "groups_discarded": 2,
                                     "rows_kept": 8, "rows_discarded": 4, "share": 0.05}


def test_share_moves_the_boundary():
    # at 50 % the slow read (-49 %) is kept; the swapped group stays discarded whatever the share
    dec = discard.apply_rule(hand_rows(), share=0.5)
    assert dec.groups["discarded"].tolist() == [False, False, False, False, False, True]
    # at 2 % the reads at +-1.96 % stay and the slow one goes; at 1.9 % no group of run A is within
    # the share of its median, so its reads judge nothing (run B's equal reads still do)
    dec = discard.apply_rule(hand_rows(), share=0.02)
    assert dec.groups["discarded"].tolist() == [False, False, False, True, False, True]
    dec = discard.apply_rule(hand_rows(), share=0.019)
    assert dec.groups["judged"].tolist() == [False] * 4 + [True] * 2
    assert dec.groups["discarded"].tolist() == [False, False, False, False, False, True]


def test_counts_table_and_combine():
    a = discard.apply_rule(hand_rows()[lambda d: d["run_id"] == "A"])
    b = discard.apply_rule(hand_rows()[lambda d: d["run_id"] == "B"])
    table = discard.counts_table({"Figure 7": discard.combine([a, b]), "fits": a})
    assert table[["groups_kept", "groups_discarded", "rows_kept", "rows_discarded"]].values.tolist() == [
        [4, 2, 8, 4], [3, 1, 6, 2]]


def test_timed_row_without_its_read_is_named():
    rows = hand_rows()
    rows = rows[~((rows["run_id"] == "B") & (rows["layer"] == 1) & (rows["kind"] == "membw"))]
    with pytest.raises(ValueError, match=r"rows\.csv: row \d+ \(layer 1, n 2, kind 'window'\) has no read-bandwidth row"):
        discard.apply_rule(rows, source="rows.csv")


@pytest.mark.parametrize("col, value", [("t_median_s", 0.0), ("requested_bytes", "x")])
def test_bad_read_row_is_named(col, value):
    rows = hand_rows().astype({col: object})
    rows.loc[0, col] = value
    with pytest.raises(ValueError, match="rows.csv: read row 0 needs t_median_s > 0"):
        discard.apply_rule(rows, source="rows.csv")


def test_share_must_be_positive():
    with pytest.raises(ValueError, match="discard share must be > 0"):
        discard.apply_rule(hand_rows(), share=0)


def test_reads_that_cannot_judge_keep_their_groups():
    # two groups 20 % apart: both depart by 9.1 % from their median, none is a reading of the
    # machine to judge against, so neither is discarded by its read
    two = pd.DataFrame([_row("C", layer, 0, "membw", "read", t, "read") for layer, t in ((0, 0.1), (1, 0.12))]
                       + [_row("C", layer, 2, "chosen", "slot", 0.01, f"C{layer}") for layer in (0, 1)])
    dec = discard.apply_rule(two)
    assert dec.groups["departure"].tolist() == pytest.approx([1 / 11, -1 / 11], rel=1e-12)
    assert dec.groups["judged"].tolist() == [False, False] and not dec.groups["discarded"].any()
    # a read smaller than the flush (served by the caches) is not judged either
    small = hand_rows().assign(requested_bytes=FLUSH_FLOOR_BYTES - 4)   # rows without cold_bytes: 256 MiB
    dec = discard.apply_rule(small)
    assert not dec.groups["judged"].any()
    assert dec.groups["discarded"].tolist() == [False] * 5 + [True]     # the swap still discards
    # the run's recorded cold size (4 x a 480 MiB cache) is the least judged read: its 1 GB reads are not
    big_cache = hand_rows().assign(cold_bytes=4 * 480 * 2**20)
    assert not discard.apply_rule(big_cache).groups["judged"].any()
    assert discard.apply_rule(hand_rows().assign(cold_bytes=2**28)).groups["judged"].tolist() == [True] * 4 + [True] * 2
    assert discard.judged_read_bytes(pd.DataFrame({"cold_bytes": [2**31, "", 0]})).tolist() == [2**31] + [2**28] * 2


def test_ceiling_rows_go_with_their_group_and_are_not_timed_rows():
    rows = hand_rows()
    ceiling = pd.DataFrame([_row("A", 0, n, "ceiling", "lanes", 0.09, "ceiling:lanes") for n in (1, 2, 3, 4)])
    dec = discard.apply_rule(pd.concat([rows, ceiling], ignore_index=True))
    assert dec.groups["timed_rows"].tolist() == discard.apply_rule(rows).groups["timed_rows"].tolist()
    kept = dec.kept
    assert sorted(kept.loc[kept["kind"] == "ceiling", "n"]) == [1, 2, 3]     # n = 4's group is discarded


def test_every_group_discarded_is_refused_with_the_reasons():
    rows = hand_rows().assign(flags="swap")
    dec = discard.apply_rule(rows)
    with pytest.raises(ValueError, match=r"discards every group: run A layer 0 n 1: swap;"):
        dec.kept
