"""Tables of the round model (notebook 05): its terms per draft length, and the two verify-time
protocols side by side."""

from __future__ import annotations

import pandas as pd


def round_terms_table(models: list) -> pd.DataFrame:
    """One row per (round model, k): the terms in ms with their intervals, V(k) of the
    deduplicating kernel with its interval and delta_k, and where each term comes from."""
    rows = []
    for rm in models:
        V = rm.step_times("dedup")
        lo, hi = rm.step_interval("dedup")
        delta = rm.delta_by_k("dedup")
        for k in range(rm.kmax + 1):
            rows.append({"state": rm.state, "context": rm.context, "draft": rm.draft.name, "k": k,
                         "t_draft_ms": 1e3 * rm.draft.term.values_s[k], "tau_slot_ms": 1e3 * rm.tau("slot")[k],
                         "tau_dedup_ms": 1e3 * rm.tau("dedup")[k], "host_ms": 1e3 * rm.host.values_s[k],
                         "V_ms": 1e3 * V[k], "V_lo_ms": 1e3 * lo[k], "V_hi_ms": 1e3 * hi[k], "delta": delta[k],
                         "read_GBps": rm.read_GBps, "regime": rm.regime,
                         "draft_a_ms": None if rm.draft.a_s is None else 1e3 * rm.draft.a_s,
                         "draft_b_ms": None if rm.draft.b_s is None else 1e3 * rm.draft.b_s,
                         "draft_one_token_ms": 1e3 * rm.draft.one_token_s, "draft_catch_up_ms": 1e3 * rm.draft.catch_up_s,
                         "catch_up_share": (None if rm.draft.catch_up_share is None
                                            else float(rm.draft.catch_up_share[k])),
                         "verify_protocol": rm.verify["dedup"].protocol, "draft_protocol": rm.draft.term.protocol})
    return pd.DataFrame(rows)


def protocol_table(grid: pd.DataFrame, models: dict) -> pd.DataFrame:
    """Per depth, kernel and n: the verify time of notebook 05's shuffled grid (median, a
    :func:`moespec.engine.verify.summarize_verify` table) beside the decode loops' (mean per pass,
    ``models`` {d: RoundModel}), their difference and ratio."""
    rows = []
    for d, rm in sorted(models.items()):
        g = grid[grid["d"] == d].set_index("n")
        for p in ("slot", "dedup"):
            loop = rm.verify[p]
            for i in range(rm.n_max):
                n = i + 1
                if n not in g.index:
                    continue
                tg = 1e3 * float(g.loc[n, f"tau_{p}_s"])
                tl = 1e3 * float(loop.values_s[i])
                rows.append({"d": int(d), "kernel": p, "n": n, "tau_grid_ms": tg, "tau_loop_ms": tl,
                             "tau_loop_lo_ms": 1e3 * float(loop.lo_s[i]), "tau_loop_hi_ms": 1e3 * float(loop.hi_s[i]),
                             "grid_minus_loop_ms": tg - tl, "grid_over_loop": tg / tl, "state": rm.state})
    return pd.DataFrame(rows)
