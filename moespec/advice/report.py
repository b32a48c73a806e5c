"""The advice as text (:func:`format_text`: one screen, the answer; :func:`format_explain`: its
derivation, every table) and as JSON (with its JSON Schema, checked before writing)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from moespec import io
from moespec.theory import MARGIN_VERDICTS

from .decide import ENGINE_NAMES, ENGINES, SCHEMA_ID
from .settings import cap_lines

_NUM = {"type": "number"}
_NUMS = {"type": "array", "items": {"type": "number"}, "minItems": 1}
_NUM_OR_NULL = {"type": ["number", "null"]}
_INT_OR_NULL = {"type": ["integer", "null"]}
_ENGINE = {"type": "object",
           "required": ["k_star", "speedup", "speedup_lo", "speedup_hi", "throughput_per_s", "k_star_certain",
                        "loss_k_off_by_one", "speedup_by_k", "speedup_lo_by_k", "speedup_hi_by_k", "delta_by_k",
                        "step_ms_by_k"],
           "properties": {"k_star": {"type": "integer", "minimum": 0},
                          "speedup": {"type": "number", "exclusiveMinimum": 0},
                          "speedup_lo": _NUM, "speedup_hi": _NUM, "throughput_per_s": _NUM,
                          "k_star_certain": {"type": "boolean"}, "loss_k_off_by_one": {"type": "number", "minimum": 0},
                          "speedup_by_k": _NUMS, "speedup_lo_by_k": _NUMS, "speedup_hi_by_k": _NUMS,
                          "delta_by_k": {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1},
                          "step_ms_by_k": _NUMS}}
_SETTING = {"type": "object", "required": ["cli", "note"],
            "properties": {"cli": {"type": "string"}, "note": {"type": "string"}}}

#: JSON Schema (draft 2020-12) of the advice ``moespec advise`` writes.
ADVICE_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "moespec advise: expert kernel and draft length for speculative decoding on an MoE model",
    "type": "object",
    "required": ["schema", "subject", "inputs", "assumptions", "band_covers", "error", "draft_time_ms",
                 "host_time_ms", "draft", "dedup", "acceptance", "settings", "versions_cited"],
    "properties": {
        "schema": {"const": SCHEMA_ID},
        "subject": {"type": "object", "required": ["model", "engine", "format", "source", "from"],
                    "properties": {k: {"type": ["string", "null"]}
                                   for k in ("model", "engine", "format", "source", "from")}},
        "inputs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "assumptions": {"type": "array", "items": {"type": "string"}},
        "band_covers": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "error": {"type": "object",
                  "required": ["eps", "delta", "verify_time_rel_17", "margin_19", "loss_bound_20", "speedup_factor_21"],
                  "properties": {"eps": {"type": ["number", "null"], "minimum": 0, "exclusiveMaximum": 0.5},
                                 "delta": {"type": "number", "minimum": 0},
                                 "verify_time_rel_17": _NUM_OR_NULL, "margin_19": _NUM_OR_NULL, "loss_bound_20": _NUM,
                                 "speedup_factor_21": {"type": "array", "items": _NUM, "minItems": 2, "maxItems": 2}}},
        "draft_time_ms": {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1},
        "host_time_ms": {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 1},
        "draft": {"type": "object", "required": ["name", "source", "protocol", "a_ms_per_token", "b_ms_per_round"],
                  "properties": {"name": {"type": "string"}, "source": {"type": "string"},
                                 "protocol": {"type": "string"}, "a_ms_per_token": _NUM_OR_NULL,
                                 "b_ms_per_round": _NUM_OR_NULL, "form": {"enum": ["line", "catch-up"]},
                                 "one_token_ms": _NUM, "catch_up_ms": {"type": "number", "minimum": 0}}},
        "dedup": {"type": "object", "required": ["from_n", "earliest_n", "guaranteed_from_n", "interval", "pass_sizes"],
                  "properties": {"from_n": _INT_OR_NULL, "earliest_n": _INT_OR_NULL, "guaranteed_from_n": _INT_OR_NULL,
                                 "interval": {"type": "string"},
                                 "pass_sizes": {"type": "array", "minItems": 2, "items": {
                                     "type": "object",
                                     "required": ["n", "tau_slot_ms", "tau_dedup_ms", "saving_ms", "saving_lo_ms",
                                                  "saving_hi_ms", "dedup_faster", "sign_certain"],
                                     "properties": {"n": {"type": "integer", "minimum": 1},
                                                    "tau_slot_ms": {"type": "number", "exclusiveMinimum": 0},
                                                    "tau_dedup_ms": {"type": "number", "exclusiveMinimum": 0},
                                                    "saving_ms": _NUM, "saving_lo_ms": _NUM, "saving_hi_ms": _NUM,
                                                    "dedup_faster": {"type": "boolean"},
                                                    "sign_certain": {"type": "boolean"},
                                                    "ubar": _NUM, "r": _NUM, "kernels_agree_19": {"type": "boolean"},
                                                    "margin_19_verdict": {"enum": list(MARGIN_VERDICTS)}}}}}},
        "acceptance": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["a", "label", "engines", "recommended", "other_states", "loss_if_wrong"],
            "properties": {
                "a": {"type": "number", "minimum": 0, "exclusiveMaximum": 1}, "label": {"type": "string"},
                "engines": {"type": "object", "required": list(ENGINES),
                            "properties": {e: _ENGINE for e in ENGINES}, "additionalProperties": False},
                "recommended": {"type": "object",
                                "required": ["engine", "engine_name", "k", "speculate", "speedup", "speedup_lo",
                                             "speedup_hi", "verify_pass_tokens", "k_certain", "interval_contains_1"],
                                "properties": {"engine": {"enum": list(ENGINES)},
                                               "k": {"type": "integer", "minimum": 0},
                                               "speculate": {"type": "boolean"},
                                               "interval_contains_1": {"type": "boolean"}}},
                "other_states": {"type": "object", "additionalProperties": {
                    "type": "object", "required": ["engine", "k", "speedup", "speedup_lo", "speedup_hi", "differs"],
                    "properties": {"engine": {"enum": list(ENGINES)}, "k": {"type": "integer", "minimum": 0},
                                   "differs": {"type": "boolean"}}}},
                "loss_if_wrong": {"type": "object",
                                  "required": ["per_slot_kernel_only", "dedup_kernel_only", "draft_length_off_by_one",
                                               "plain_decoding", "bound_20"],
                                  "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1}}}}},
        "settings": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["a", "k", "vllm", "sglang", "llama_cpp", "kernel_switch"],
            "properties": {"a": _NUM, "k": {"type": "integer", "minimum": 0}, "vllm": _SETTING, "sglang": _SETTING,
                           "llama_cpp": _SETTING,
                           "kernel_switch": {"type": "object", "required": ["per_slot_up_to", "text", "llama_cpp_cuda"],
                                             "properties": {"per_slot_up_to": _INT_OR_NULL}}}}},
        "versions_cited": {"type": "object", "required": ["vllm", "sglang", "llama.cpp", "llama.cpp-cuda-kernel"]},
        "sources": {"type": "object", "additionalProperties": {"type": "string"}},
        "batch_schedule": {
            "type": "object", "required": ["batch_sizes", "rows", "ranges", "vllm", "sglang", "assumptions",
                                           "speculation_stops_from"],
            "properties": {
                "speculation_stops_from": _INT_OR_NULL,
                "batch_sizes": {"type": "array", "items": {"type": "integer", "minimum": 1}, "minItems": 1},
                "rows": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "required": ["B", "engine", "k", "speedup", "throughput_per_sequence",
                                                   "throughput_per_batch", "pass_tokens", "verify_from"],
                    "properties": {"B": {"type": "integer", "minimum": 1}, "engine": {"enum": list(ENGINES)},
                                   "k": {"type": "integer", "minimum": 0}, "speedup": _NUM}}},
                "ranges": {"$ref": "#/$defs/ranges"},
                "vllm": {"oneOf": [{"$ref": "#/$defs/ranges"}, {"type": "null"}]},
                "sglang": {"type": "object", "patternProperties": {"^[1-9][0-9]*$": {
                    "type": "object", "required": ["candidate_steps"],
                    "properties": {"candidate_steps": {"type": "array", "minItems": 1,
                                                       "items": {"type": "integer", "minimum": 0}}}}},
                           "additionalProperties": False},
                "assumptions": {"type": "array", "items": {"type": "string"}}}},
    },
    "$defs": {"ranges": {"type": "array", "minItems": 1, "items": {
        "type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 3, "maxItems": 3}}},
}


def validate(advice: dict) -> dict:
    """Check ``advice`` against :data:`ADVICE_SCHEMA`; raise ``jsonschema.ValidationError`` naming the field."""
    import jsonschema

    jsonschema.validate(advice, ADVICE_SCHEMA, cls=jsonschema.Draft202012Validator)
    return advice


def write_json(advice: dict, path: str | Path) -> Path:
    """Validate and write atomically."""
    return io.write_json(path, validate(advice))


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _faster_at(kd: dict) -> str:
    """Where deduplication is faster, as pass sizes: ``at n = 2-5, 8`` (``at no n up to 9``)."""
    ns = [r["n"] for r in kd["pass_sizes"] if r["dedup_faster"]]
    runs = []
    for n in ns:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
    return f"at n = {text}" if ns else f"at no n up to {len(kd['pass_sizes'])}"


def _n(x) -> str:
    return "none" if x is None else str(x)


def _interval(lo: float, hi: float) -> str:
    return f"[{lo:.3f}, {hi:.3f}]"


def _margin_lines(rows: list[dict], margin: float) -> list[str]:
    """Where (19)'s margin guarantees the faster kernel, at the table's values and over its rounding."""
    judged = [r for r in rows if "kernels_agree_19" in r]
    if not judged:
        return []
    def ns(rs):
        return ", ".join(str(r["n"]) for r in rs) or "none"
    line = (f"  margin (19) ln((1+eps)/(1-eps)) = {margin:.4f}: |ln r - ln ubar| exceeds it at n = "
            f"{ns([r for r in judged if r['kernels_agree_19']])}")
    if any("margin_19_verdict" in r for r in judged):
        within = [r for r in judged if r.get("margin_19_verdict") == "within rounding"]
        line += (f"; within the table's rounding (not certain either way) at n = {ns(within)}")
    return [line]


def _method_notes(setting: dict) -> list[str]:
    """The draft method's notes per engine and vLLM's fused_moe tuning for M = k + 1 (``--explain``)."""
    tune = setting["vllm"].get("tune")
    out = [f"    notes ({setting.get('method', 'draft_model')}): vLLM: {setting['vllm']['note']}; "
           f"SGLang: {setting['sglang']['note']}; llama.cpp: {setting['llama_cpp']['note']}"]
    if tune:
        out += [f"    vLLM Triton fused_moe for M = {tune['M']}: {tune['cli']}", f"      {tune['note']}"]
    return out


def format_explain(advice: dict) -> str:
    """The advice with its derivation, as ``moespec advise --explain`` prints it: the error bounds,
    the assumptions, the saving at every pass size, the round's terms, every engine's k* and
    speedup at every k, the settings and where each option name was read."""
    s, err, kd = advice["subject"], advice["error"], advice["dedup"]
    lo21, hi21 = err["speedup_factor_21"]
    head = [f"moespec advise: {s['model']}, {s['engine']} ({s['format']})",
            f"  numbers from: {s['from']}; {s['source']}"
            + (f"; hardware: {s['hardware']}" if s.get("hardware") else "")]
    if s.get("state"):
        head.append(f"  machine state: {s['state']}" + (f", read {s['read_GBps']:.2f} GB/s in the same rounds"
                                                       if s.get("read_GBps") is not None else "")
                    + f", bandwidth regime {s.get('regime', 'one')}")
    if err["eps"] is not None:
        head.append(f"  bandwidth error eps = {err['eps']:.3f}: predicted verify times within "
                    f"+-{_pct(err['verify_time_rel_17'])} "
                    "(17) where the verify term is predicted from bandwidths")
    head.append(f"  step-time error: delta = {err['delta']:.3f} (largest over k of the recommended engine's delta_k); "
                f"a draft length chosen on these step times loses at most {_pct(err['loss_bound_20'])} of the best "
                f"throughput (20); best speedup within x[{lo21:.3f}, {hi21:.3f}] (21)")
    head.append("  the band covers: " + "; ".join(advice["band_covers"]))
    out = head + ["Assumptions:", *[f"  - {a}" for a in advice["assumptions"]], "",
                  f"Expert kernel: deduplication is faster {_faster_at(kd)}; "
                  + (f"from n = {kd['from_n']} tokens per pass on" if kd["from_n"] else "from no n through the last")
                  + f" (earliest {_n(kd['earliest_n'])}, guaranteed from {_n(kd['guaranteed_from_n'])}; "
                  f"{kd['interval']})",
                  "   n   tau slot ms   tau dedup ms   saving ms [interval]         dedup faster   sign certain"]
    for r in kd["pass_sizes"]:
        out.append(f"  {r['n']:>2}   {r['tau_slot_ms']:>11.4f}   {r['tau_dedup_ms']:>12.4f}   "
                   f"{r['saving_ms']:>+8.4f} [{r['saving_lo_ms']:+.4f}, {r['saving_hi_ms']:+.4f}]   "
                   f"{'yes' if r['dedup_faster'] else 'no':>12}   {'yes' if r['sign_certain'] else 'no':>12}")
    if err["margin_19"] is not None:
        out += _margin_lines(kd["pass_sizes"], err["margin_19"])
    out += ["", "Round: V(k) = t_draft(k) + tau(k + 1) + h(k) (ms), deduplicating engine",
            "   k   t_draft   h(k)    V(k)"]
    V = advice["acceptance"][0]["engines"]["dedup"]["step_ms_by_k"]
    for k, (d, h, v) in enumerate(zip(advice["draft_time_ms"], advice["host_time_ms"], V)):
        out.append(f"  {k:>2}   {d:7.3f}  {h:6.3f}  {v:7.3f}")
    for item, setting in zip(advice["acceptance"], advice["settings"]):
        rec, loss = item["recommended"], item["loss_if_wrong"]
        head = (f"Draft length at the measured acceptance profile ({item['label']}); tokens per step G(k) = "
                + ", ".join(f"{t:.3f}" for t in item["tokens_per_step"][1:]) + f" ({item['tokens_per_step_from']}):"
                if item.get("acceptance_model") == "profile"
                else f"Draft length at acceptance a = {item['a']:.3f} ({item['label']}):")
        out += ["", head,
                "  engine                                                k*   speedup [band (21) at delta_k*]   "
                "k* certain (20)   lost at k*+-1"]
        for e in ENGINES:
            x = item["engines"][e]
            out.append(f"  {ENGINE_NAMES[e]:<52}  {x['k_star']:>2}   {x['speedup']:.3f} "
                       f"{_interval(x['speedup_lo'], x['speedup_hi'])}"
                       f"          {'yes' if x['k_star_certain'] else 'no':>15}   {_pct(x['loss_k_off_by_one']):>12}")
        eng = item["engines"][rec["engine"]]
        out.append("  speedup by k, " + rec["engine_name"] + ": " + ", ".join(
            f"k={k} {sp:.3f} {_interval(lo, hi)}" for k, (sp, lo, hi) in
            enumerate(zip(eng["speedup_by_k"], eng["speedup_lo_by_k"], eng["speedup_hi_by_k"])) if k > 0))
        verdict = (f"draft k = {rec['k']} token{'s' if rec['k'] != 1 else ''} (verify passes of "
                   f"{rec['verify_pass_tokens']}), "
                   f"{rec['engine_name']}: speedup {rec['speedup']:.3f} "
                   f"{_interval(rec['speedup_lo'], rec['speedup_hi'])}"
                   if rec["speculate"] else "plain decoding (k = 0): speculation does not pay at this acceptance rate")
        out.append(f"  -> {verdict}")
        if rec["interval_contains_1"]:
            out.append("  !! the band holds a speedup of 1: by these measurements drafting may or may not pay here")
        for state, o in item["other_states"].items():
            what = (f"draft k = {o['k']} ({ENGINE_NAMES[o['engine']]}), speedup {o['speedup']:.3f} "
                    f"{_interval(o['speedup_lo'], o['speedup_hi'])}" if o["k"] > 0 else "plain decoding")
            read = f" (read {o['read_GBps']:.2f} GB/s)" if o.get("read_GBps") else ""
            out.append(f"  in the {state} machine state{read}: "
                       f"{what}" + ("  <- DIFFERS from the recommendation above" if o["differs"] else " (the same)"))
        out += [f"  throughput lost by a wrong choice: per-slot kernel only {_pct(loss['per_slot_kernel_only'])}, "
                f"dedup kernel only {_pct(loss['dedup_kernel_only'])}, draft length off by one "
                f"{_pct(loss['draft_length_off_by_one'])}, plain decoding {_pct(loss['plain_decoding'])} "
                f"(bound (20) for a k chosen on these step times: {_pct(loss['bound_20'])})",
                "  settings:",
                f"    vLLM:      {setting['vllm']['cli']}",
                f"    SGLang:    {setting['sglang']['cli']}",
                f"    llama.cpp: {setting['llama_cpp']['cli']}",
                f"    llama.cpp builds before PR 22397: {setting['llama_cpp']['cli_legacy'] or 'none read'}",
                *_method_notes(setting)]
    ks = advice["settings"][0]["kernel_switch"]
    out += ["", f"Kernel switch: {ks['text']}", f"  llama.cpp CUDA: {ks['llama_cpp_cuda']}",
            *[f"    {line}" for line in cap_lines(ks.get("mmvq_cap", []))],
            *[f"  {name}: {text}" for name, text in ks.get("engines", {}).items()], ""]
    if advice.get("batch_schedule"):
        out += _explain_batch(advice["batch_schedule"]) + [""]
    out += ["Inputs:"] + [f"  - {p}" for p in advice["inputs"]]
    out += ["Option names from:"] + [f"  - {name}: {v['project']} @ {v['commit'][:12]} ({v['where']})"
                                     for name, v in advice["versions_cited"].items()]
    return "\n".join(out)


# --- one screen ---------------------------------------------------------------------------------------
WIDTH = 120


def _wrap(text: str, indent: str = "", more: str = "    ") -> list[str]:
    """``text`` on lines of at most :data:`WIDTH` characters, the first indented by ``indent``."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent + more,
                         break_long_words=False, break_on_hyphens=False) or [indent]


def _words(command: str) -> list[str]:
    """A shell command cut at its spaces outside quotes (the quotes kept)."""
    words, word, quote = [], "", None
    for ch in command:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == " ":
            words.append(word)
            word = ""
            continue
        word += ch
    return words + [word]


def _command(label: str, command: str) -> list[str]:
    """``label`` and a shell command, continued with backslashes at option boundaries so that no
    line exceeds :data:`WIDTH` characters (an option and its value stay together)."""
    groups = []
    for word in _words(command):
        if word.startswith("-") or not groups:
            groups.append(word)
        else:
            groups[-1] += " " + word
    lines, line = [], label + groups[0]
    for group in groups[1:]:
        if len(line) + 1 + len(group) + 2 > WIDTH:
            lines.append(line + " \\")
            line = " " * (len(label) + 2) + group
        else:
            line += " " + group
    return lines + [line]


def _state_line(s: dict, eps) -> str:
    if not s.get("state"):
        return f"  numbers from {s['from']}" + (f"; eps {eps:.3f}" if eps is not None else "")
    read = f", read {s['read_GBps']:.2f} GB/s in the same rounds" if s.get("read_GBps") is not None else ""
    hw = f"; {s['hardware']}" if s.get("hardware") else ""
    return f"  machine state: {s['state']}{read}{hw}" + (f"; eps {eps:.3f}" if eps is not None else "")


def _explain_batch(sched: dict) -> list[str]:
    """Per batch size: every engine's V(k, B), k*, where each k's verify time comes from, the union."""
    out = ["Batch sizes: V(k, B) = t_draft(k) + tau(B, k) + h(k) (ms), verify passes of B(k + 1) tokens"]
    out += [line for a in sched["assumptions"] for line in _wrap("- " + a, "  ", "  ")]
    if sched.get("fits"):
        out += [f"  fit of the rows, {p}: " + ", ".join(f"{c} = {v:.4g}" for c, v in f.items())
                for p, f in sched["fits"].items()]
    for r in sched["rows"]:
        out.append(f"  B = {r['B']}: k* = {r['k']} ({r['engine']}), speedup over plain decoding at B = {r['B']}: "
                   f"{r['speedup']:.3f}")
        for e, x in r["engines"].items():
            out += _wrap(f"{e} (k* = {x['k']}): " + ", ".join(f"{v:.2f}" for v in x["step_ms"]), "    ")
        if r.get("union_pairs"):
            out += _wrap("distinct (expert, layer) pairs of the pass U(B, k + 1): "
                         + ", ".join(f"{u:.1f}" for u in r["union_pairs"]), "    ")
        froms = list(dict.fromkeys(r["verify_from"]))
        out += _wrap("verify: " + "; ".join(f"{w} at k = " + ", ".join(str(k) for k, v in enumerate(r["verify_from"])
                                                                     if v == w) for w in froms), "    ")
    return out


def format_batch(sched: dict) -> list[str]:
    """k*(B) per batch-size range and the schedules for vLLM and SGLang, as ``moespec advise
    --batch-sizes`` prints them."""
    rows = sched["rows"]
    out = _wrap(f"Batch sizes B ({sched['acceptance'].split(' (', 1)[0]}): k*(B) from V(k, B), verify passes of "
                f"B(k + 1) tokens")
    out.append(f"  {'B':>7}" + "".join(f"{r['B']:>9}" for r in rows))
    out.append(f"  {'k*':>7}" + "".join(f"{r['k']:>9}" for r in rows))
    out.append(f"  {'speedup':>7}" + "".join(f"{r['speedup']:>9.3f}" for r in rows))
    out.append(f"  {'kernel':>7}" + "".join(f"{r['engine']:>9}" for r in rows))
    verify = ["rows" if all(w == "row" for w in r["verify_from"]) else "fit" if all(w.startswith("fit") for w in
              r["verify_from"]) else "rows+fit" for r in rows]
    out.append(f"  {'verify':>7}" + "".join(f"{v:>9}" for v in verify))
    out += _wrap("verify: rows = the source's verify times; fit = paper 1's fit (4)/(E.1) of them at the union of "
                 "B sequences (--explain: per k)", "  ")
    stop = sched["speculation_stops_from"]
    out += _wrap("ranges: " + "; ".join(f"B = {a}" + ("" if a == b else f"..{b}") + f": k = {k}"
                                        for a, b, k in sched["ranges"])
                 + (f"; speculation stops paying from B = {stop}" if stop is not None else
                    "; speculation pays at every batch size given"), "  ")
    if sched.get("vllm_cli"):
        out += _command("    vLLM:      ", sched["vllm_cli"])
    if sched.get("sglang_cli"):
        out += _command("    SGLang:    ", sched["sglang_cli"])
    out += _wrap(sched["note"], "  ")
    return out


def format_text(advice: dict) -> str:
    """The answer on one screen, as ``moespec advise`` prints it: per acceptance rate the
    recommendation with its band and what the other machine states would take, the kernel switch,
    the settings for vLLM, SGLang and llama.cpp, the machine state, and each source named once.
    Lines of at most :data:`WIDTH` characters; ``--explain`` (:func:`format_explain`) prints the
    derivation."""
    s, kd = advice["subject"], advice["dedup"]
    out = _wrap(f"moespec advise: {s['model']}; {s['engine']}, {s['format']}")
    if s.get("source") not in (None, "this run"):
        out += _wrap(f"numbers: {s['source']}", "  ")
    out.append(_state_line(s, advice["error"]["eps"]))
    for item, setting in zip(advice["acceptance"], advice["settings"]):
        rec, loss = item["recommended"], item["loss_if_wrong"]
        head = f"At a = {item['a']:.3f} ({item['label']}): "
        if item.get("acceptance_model") == "profile":
            G = ", ".join(f"{t:.2f}" for t in item["tokens_per_step"][1:])
            kmax = len(item["tokens_per_step"]) - 1     # the label's source and the geometric fit: --explain
            out += _wrap(f"Acceptance: {item['label'].split(' (', 1)[0]}; tokens per step G(k) = {G} for k = 1..{kmax} "
                         f"(best geometric fit a = {item['a']:.3f})")
            head = "At this profile: "
        if rec["speculate"]:
            out += _wrap(head + f"draft k = {rec['k']} token{'s' if rec['k'] != 1 else ''} (verify passes of "
                         f"{rec['verify_pass_tokens']}), {rec['engine_name']}")
            out += _wrap(f"speedup {rec['speedup']:.3f}, band {_interval(rec['speedup_lo'], rec['speedup_hi'])} "
                         f"(bound (21)); k off by one loses {_pct(loss['draft_length_off_by_one'])}, the per-slot "
                         f"kernel alone {_pct(loss['per_slot_kernel_only'])}", "  ")
        else:
            out += _wrap(head + "plain decoding (k = 0): speculation does not pay at this acceptance rate")
        if rec["interval_contains_1"]:
            out.append("  !! the band holds a speedup of 1: by these measurements drafting may or may not pay here")
        for state, o in item["other_states"].items():
            read = f" (read {o['read_GBps']:.2f} GB/s)" if o.get("read_GBps") else ""
            what = (f"k = {o['k']}, {ENGINE_NAMES[o['engine']]}, speedup {o['speedup']:.3f} "
                    f"{_interval(o['speedup_lo'], o['speedup_hi'])}" if o["k"] > 0 else "plain decoding")
            out += _wrap(f"{state} machine{read}: {what}" + (" <- differs" if o["differs"] else " (the same)"), "  ")
        method = setting.get("method", "draft_model")
        out.append(f"  settings for k = {setting['k']}" + ("" if method == "draft_model" else f", {method}") + ":")
        out += _command("    vLLM:      ", setting["vllm"]["cli"])
        out += _command("    SGLang:    ", setting["sglang"]["cli"])
        out += _command("    llama.cpp: ", setting["llama_cpp"]["cli"])
        if setting["llama_cpp"]["cli_legacy"] not in (None, setting["llama_cpp"]["cli"]):
            out += _command("    llama.cpp before PR 22397: ", setting["llama_cpp"]["cli_legacy"])
        if setting["vllm"].get("tune"):
            tune = setting["vllm"]["tune"]
            out += _wrap(f"vLLM Triton MoE: tune M = k + 1 = {tune['M']} (" + (
                f"it runs the config tuned for {tune['runs_config_of']}" if tune["runs_config_of"] != tune["M"]
                else "a tuned size") + "; command: --explain)", "  ")
        for line in setting["llama_cpp"].get("convert", []):   # moespec.advice.gguf: a checkpoint folder's GGUF file
            out += _command("    GGUF for llama.cpp (its converter): ", line)
    switches = {}   # one kernel switch per recommendation (moespec.advice.decide.kernel_switch_of): the same, or per a
    for setting in advice["settings"]:
        switches.setdefault(setting["kernel_switch"]["text"], (setting["kernel_switch"], []))[1].append(setting["a"])
    for ks, rates in switches.values():
        at = "" if len(switches) == 1 else " at a = " + ", ".join(f"{a:.3f}" for a in rates)
        decided = ks["per_slot_up_to"] == (None if kd["from_n"] is None else kd["from_n"] - 1)
        guaranteed = f" (guaranteed from {kd['guaranteed_from_n']})" if decided and kd["from_n"] is not None else ""
        out += _wrap(f"Kernel switch{at}: {ks['text']}{guaranteed}" + ("" if decided else
                     " (that engine is faster at the recommended draft length, though deduplication is faster "
                     f"{_faster_at(kd)})"))
        out += _wrap(f"llama.cpp CUDA: {ks['llama_cpp_cuda']}", "  ")
        out += [wrapped for line in cap_lines(ks.get("mmvq_cap", [])) for wrapped in _wrap(line, "    ")]
    ks = advice["settings"][0]["kernel_switch"]
    if ks.get("engines"):
        out += _wrap("MoE kernel options (every pass size): " + "; ".join(
            f"{name} {text}" for name, text in (("vLLM", ks["engines"]["vllm"]), ("SGLang", ks["engines"]["sglang"]))),
            "  ")
    if advice.get("batch_schedule"):
        out += format_batch(advice["batch_schedule"])
    sources = advice.get("sources") or {"inputs": ", ".join(advice["inputs"])}
    out += _wrap("Sources: " + "; ".join(f"{part}: {where}" for part, where in sources.items())
                 + "; option names: docs/advise.md; the derivation: --explain")
    return "\n".join(out)
