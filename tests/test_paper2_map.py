"""The paper 2 item map: numbers parsed from comparison cells, the verdict rule, files found."""

from __future__ import annotations

import pandas as pd
import pytest

from moespec.tables.paper2_map import ITEMS, Item, agrees, numbers, paper2_map


@pytest.mark.parametrize("cell, expected", [("0.8141-0.9331", [0.8141, 0.9331]), ("1.1e-3", [0.0011]),
                                            ("-0.0153", [-0.0153]), ("2.34x beyond Lmax=6", [2.34]),
                                            ("about 2.1", [2.1]), ("7.3 to 10.5 then 4.7", [7.3, 10.5]),
                                            ("0.459*K + 0.073", []), ("", []), (float("nan"), [])])
def test_numbers(cell, expected):
    assert numbers(cell) == pytest.approx(expected)


def test_agrees_overlap_with_tolerance():
    assert agrees("0.95-0.99", "0.9669-0.9991") is True
    assert agrees("0.85", "0.9669-0.9991") is False                 # 0.85 < 0.9669 - 0.0999
    assert agrees("0.90", "0.9669-0.9991") is True                  # within 10 % of the range's end
    assert agrees("2.06", "0.37") is False
    assert agrees("0.707*K + 0.691", "0.459*K + 0.073") is None


def test_paper2_map_verdicts(tmp_path):
    (tmp_path / "07_a.csv").write_text("x\n1\n")
    (tmp_path / "07_b_one.png").write_bytes(b"")
    items = (Item("A", "1", ("07_a.csv",), ("q_ok",), "why A"), Item("B", "2", ("07_b_*.png",), ("q_bad",), "why B"),
             Item("C", "3", ("07_c.csv",), (), "why C"), Item("D", "4", ("07_a.csv",), (), "why D"))
    cmp = pd.DataFrame({"quantity": ["q_ok", "q_bad"], "ours": ["1.0", "5"], "theirs": ["1.05", "1"]})
    m = paper2_map(tmp_path, cmp, items).set_index("paper 2 item")
    assert m.loc["A", "verdict"] == "agrees" and m.loc["A", "why"] == ""
    assert m.loc["B", "verdict"] == "differs" and m.loc["B", "why"] == "why B"
    assert m.loc["B", "our files"] == "07_b_one.png"
    assert m.loc["C", "verdict"] == "missing"
    assert m.loc["D", "verdict"].startswith("counterpart")
    with pytest.raises(ValueError, match="no row 'q_missing'"):
        paper2_map(tmp_path, cmp, (Item("E", "5", ("07_a.csv",), ("q_missing",)),))


def test_items_name_comparison_rows_that_exist():
    """Every quantity an item compares is one notebook 07 writes (tables.oracle.paper2_comparison_values)."""
    from moespec.paper_reference import paper2_scalars

    known = set(paper2_scalars().quantity)
    for it in ITEMS:
        assert set(it.quantities) <= known, it.item


def test_appendix_a_comparison_values_read_back_the_ours_rows(tmp_path):
    """Appendix A's published quantities, ours read from the section's files (paper rows ignored)."""
    from moespec.oracle.categories import POOL
    from moespec.studies.ssp_oracle import appendix_a_values

    ours, theirs = "ours (this machine)", "paper 2, published (theirs)"
    pd.DataFrame({"category": ["a", "b", "c", POOL, "range"], "status": ["included", "included", "excluded",
                                                                         "included", None],
                  "oos_r2_ubar": [0.9, 0.8, None, 0.95, "0.60-0.87"], "source": [ours] * 4 + [theirs]}
                 ).to_csv(tmp_path / "07_tableA3_factors_by_category.csv", index=False)
    pd.DataFrame({"K": ["1", "2", "mean", "mean"], "mape_pct": [1.0, 3.0, 2.0, 5.2], "source": [ours] * 3 + [theirs]}
                 ).to_csv(tmp_path / "07_leave_one_k_out.csv", index=False)
    v = appendix_a_values(tmp_path)
    assert v == {"tableA3_ubar_only_oos_R2_range": "0.8-0.9", "leave_one_K_out_MAPE_pct_mean": "2"}
