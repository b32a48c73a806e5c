"""Pilot: where the real draft's round calibration runs in time (issue 27, the 5 % goal).

Notebook 05 calibrates the real draft's round model on its own MT-Bench turns *before* the test
runs it predicts (``before``); on a shared VM the one-token and the long passes drift apart by a few
percent between the two stretches of time (docs/engine.md, "Results of the committed run"). This
script runs, on one machine in one session and in the quiet state, that protocol and the
alternative (``interleaved``): the calibration turns and the test turns in one shuffled sweep
(:func:`moespec.engine.draftcost.interleaved_sweep`, every run on its prompt's own prefill), so
both meet the same mixture of machine states; the round model still comes from the calibration
turns only (:func:`moespec.predict.calibration.from_draft_runs`), the predictions from
:func:`moespec.predict.speculative.real_draft_predictions`. Sizes are notebook 05's profile's.

Writes ``<out>/<stamp>_interleaved.json`` (per protocol: points within 5 %, largest error, the
decomposition, the measurement against itself, wall time; the machine and versions) and the
prediction tables beside it as CSV. Not part of ``make reproduce``: a pilot before a protocol
amendment.

    .venv/bin/python benchmarks/bench_interleaved_calibration.py --profile full
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from moespec import io, paths, predict, provenance
from moespec.engine import draftcost as DC
from moespec.engine.subject import load_subject
from moespec.measure import protocols
from moespec.measure.load import machine_state
from moespec.measure.regimes import ReferenceRead
from moespec.notebook_profiles import resolve
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP
from moespec.predict.round_model import RoundModelError
from moespec.studies.whole_model import real_draft_parts

PROTOCOLS = ("before", "interleaved")


def summary(pred, wall_s: float) -> dict:
    """One protocol's result in numbers (every one from its prediction table)."""
    n = SP.measurement_noise(pred[SP.rep_columns(pred)]) if len(SP.rep_columns(pred)) >= 2 else None
    return {"points": int(len(pred)), "within_5pct": int((pred.rel_error.abs() <= 0.05).sum()),
            "largest_abs_error": float(pred.rel_error.abs().max()), "mean_error": float(pred.rel_error.mean()),
            "inside_interval": int(pred.inside.sum()),
            "within_5pct_measured_steps": int((pred.rel_error_measured_steps.abs() <= 0.05).sum()),
            "V0_hat_ms": float(pred.V0_hat_ms.iloc[0]), "V0_meas_ms": float(pred.V0_meas_ms.iloc[0]),
            "read_GBps_model": float(pred.read_GBps_model.iloc[0]), "read_GBps_runs": float(pred.read_GBps_runs.iloc[0]),
            "measurement_se": None if n is None else n["se"],
            "expected_outside_by_noise": None if n is None else n["expected_outside"], "wall_s": wall_s}


def run(profile: str, protocols_to_run, seed: int = 0, state: str = "quiet", out=None, threads: int = 1) -> dict:
    torch.set_num_threads(int(threads))      # notebook 05's default (its parameter ``threads``)
    sub = load_subject(profile=profile, model="byte-faithful-all", layout="published", seed=seed)
    rules = predict.load_rules(sub.rules_file)
    P, _ = resolve("05", profile)
    costs = P["draft_costs"] if P["draft_costs"] is not None else rules.get("draft_cost_grid", {}).get("values", [0.0])
    drafts = {float(r): sub.widened_draft(r, seed=seed + 1) for r in costs}
    cal, test = real_draft_parts(sub, {**P, "draft_costs": list(drafts)}, seed)
    ref = ReferenceRead(device="cpu")
    out = paths.ensure(Path(out) if out else paths.ROOT / "benchmarks" / "results" / "interleaved")
    stamp = protocols.stamp()
    result = {"what": "real-draft round calibration before the test runs against interleaved with them",
              "profile": profile, "state": state, "seed": seed, "draft_costs": [float(r) for r in drafts],
              "calibration_prompts": len(cal.prompts), "test_prompts": len(test.prompts), "test_reps": P["real_reps"],
              "plain_runs": P["plain_runs"], "ks": list(P["real_ks"]), "tokens": P["real_tokens"],
              "torch_threads": torch.get_num_threads(), "protocols": {},
              "subject": sub.label}
    with machine_state(state, pin=True) as ms:
        for name in protocols_to_run:
            t0 = time.perf_counter()
            if name == "before":        # notebook 05's order: the calibration sweep, then the test sweep
                cal_rows = DC.draft_cost_sweep(sub.engine, drafts, cal.prompts, P["real_ks"], P["real_tokens"],
                                               seed=seed + 11, reference=ref, slot_costs=cal.slot_costs,
                                               plain_runs=cal.plain_runs, desc="before: calibration")
                test_rows = DC.draft_cost_sweep(sub.engine, drafts, test.prompts, P["real_ks"], P["real_tokens"],
                                                seed=seed, reps=test.reps, plain_runs=test.plain_runs, reference=ref,
                                                desc="before: test")
            else:
                rows = DC.interleaved_sweep(sub.engine, drafts, [cal, test], P["real_ks"], P["real_tokens"], seed=seed,
                                            reference=ref, desc="interleaved")
                cal_rows, test_rows = DC.split_parts(rows, [cal, test])
            wall = time.perf_counter() - t0
            io.write_dataframe(out / f"{stamp}_{name}_runs.csv",
                               pd.concat([cal_rows.assign(role="calibration"), test_rows.assign(role="test")]))
            try:
                models = CAL.from_draft_runs(cal_rows.assign(state=state), sub.label, state, n_boot=P["n_boot"],
                                             seed=seed)
                pred = SP.real_draft_predictions(models, test_rows.assign(state=state))
            except (RoundModelError, ValueError) as err:     # e.g. a draft fit or a band the runs cannot give
                result["protocols"][name] = {"error": str(err), "wall_s": wall}
                continue
            io.write_dataframe(out / f"{stamp}_{name}_predictions.csv", pred)
            result["protocols"][name] = summary(pred, wall)
    result.update(machine_state=ms.describe(), provenance=provenance.full_record())
    path = io.write_json(out / f"{stamp}_interleaved.json", result)
    for name, s in result["protocols"].items():
        if "error" in s:
            print(f"{name}: no prediction ({s['error']})")
            continue
        print(f"{name}: within 5 % at {s['within_5pct']} of {s['points']} (largest {100 * s['largest_abs_error']:.1f} %, "
              f"mean {100 * s['mean_error']:+.1f} %); with the runs' own step times {s['within_5pct_measured_steps']}; "
              f"V(0) {s['V0_hat_ms']:.2f} predicted, {s['V0_meas_ms']:.2f} ms measured; measurement se "
              f"{100 * (s['measurement_se'] or np.nan):.1f} %; {s['wall_s'] / 60:.1f} min")
    print(f"wrote {path}")
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", choices=("quick", "full"), default="full")
    ap.add_argument("--protocols", default=",".join(PROTOCOLS), help="comma-separated, from before, interleaved")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (notebook 05's default: 1)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    chosen = [p for p in args.protocols.split(",") if p]
    if unknown := [p for p in chosen if p not in PROTOCOLS]:
        ap.error(f"unknown protocol(s) {unknown}; choose from {list(PROTOCOLS)}")
    return run(args.profile, chosen, seed=args.seed, out=args.out, threads=args.threads)


if __name__ == "__main__":
    main()
