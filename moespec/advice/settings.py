"""Ready-to-paste engine settings for a draft length k, a draft method (:data:`METHODS`) and a
kernel crossover n, with the exact option names of the engine versions cited in :data:`VERSIONS`
(read from each project's source or documentation at that commit; docs/advise.md quotes where):
the MoE kernel options of each engine, and the tuning of vLLM's Triton fused_moe for M = k + 1.

The theory assumes a fixed draft length k (a step drafts k tokens and verifies k + 1 in one pass),
so the settings ask each engine for exactly that: no early stop of the draft on low draft
probability, one draft chain (no tree). k = 0 means plain decoding: leave speculation off.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

#: The engine versions whose option names the settings use, and where each name was read
#: (``engine_sources.json`` beside this module: per source, the project, the commit and where in it).
VERSIONS = json.loads((Path(__file__).with_name("engine_sources.json")).read_text())


#: The draft methods advise has settings for (``--method``): a separate draft model, an EAGLE-3
#: head, the target's own multi-token-prediction layers, and n-gram lookup in the context.
METHODS = ("draft_model", "eagle3", "mtp", "ngram")

#: Every engine option, value and kernel name advise prints -> the VERSIONS entry it was read from;
#: docs/advise.md lists the same with file and commit, and tests/test_advise.py pins both to the
#: printed commands.
PRINTED_OPTIONS = {
    "vllm serve": "vllm", "--speculative-config": "vllm", "method": "vllm", "draft_model": "vllm",
    "eagle3": "vllm", "mtp": "vllm", "ngram": "vllm", "model": "vllm", "num_speculative_tokens": "vllm",
    "num_speculative_tokens_per_batch_size": "vllm",
    "moe_backend": "vllm", "--moe-backend": "vllm-kernel", "auto": "vllm-kernel", "triton": "vllm-kernel",
    "benchmarks/kernels/benchmark_moe.py": "vllm-benchmark-moe", "--model": "vllm-benchmark-moe",
    "--tp-size": "vllm-benchmark-moe", "--tune": "vllm-benchmark-moe", "--batch-size": "vllm-benchmark-moe",
    "--save-dir": "vllm-benchmark-moe", "VLLM_TUNED_CONFIG_FOLDER": "vllm-fused-moe",
    "try_get_optimal_moe_config": "vllm-fused-moe",
    "python3 -m sglang.launch_server": "sglang", "--model-path": "sglang", "--speculative-algorithm": "sglang",
    "STANDALONE": "sglang", "EAGLE3": "sglang", "EAGLE": "sglang", "NGRAM": "sglang",
    "--speculative-draft-model-path": "sglang", "--speculative-num-steps": "sglang",
    "--speculative-eagle-topk": "sglang", "--speculative-num-draft-tokens": "sglang",
    "--speculative-ngram-max-bfs-breadth": "sglang",
    "--moe-runner-backend": "sglang-server-args", "--speculative-moe-runner-backend": "sglang-server-args",
    "--speculative-adaptive": "sglang-server-args", "--speculative-adaptive-config": "sglang-server-args",
    "candidate_steps": "sglang-adaptive",
    "llama-server": "llama.cpp", "-m": "llama.cpp", "--spec-type": "llama.cpp", "draft-simple": "llama.cpp",
    "draft-eagle3": "llama.cpp", "draft-mtp": "llama.cpp", "ngram-simple": "llama.cpp",
    "--spec-draft-model": "llama.cpp", "--spec-draft-n-max": "llama.cpp", "--spec-draft-n-min": "llama.cpp",
    "--spec-draft-p-min": "llama.cpp", "--spec-ngram-simple-size-m": "llama.cpp",
    "-md": "llama.cpp-legacy", "--draft-max": "llama.cpp-legacy", "--draft-min": "llama.cpp-legacy",
    "--draft-p-min": "llama.cpp-legacy", "--spec-ngram-size-m": "llama.cpp-ngram-legacy",
    "get_mmvq_mmid_max_batch": "llama.cpp-cuda-kernel", "MMVQ_MAX_BATCH_SIZE": "llama.cpp-cuda-kernel",
    "ggml_cuda_should_use_mmq": "llama.cpp-cuda-mmq", "MMQ_DP4A_MAX_BATCH_SIZE": "llama.cpp-cuda-mmq",
}

#: benchmark_moe.py's batch sizes when --batch-size is not given (VERSIONS "vllm-benchmark-moe"):
#: the grid a tuned config covers; a verify pass of k + 1 tokens between two of them runs the config
#: of the nearer one.
VLLM_TUNE_BATCH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048, 3072, 4096)


def _method(method: str) -> str:
    if method not in METHODS:
        raise ValueError(f"--method {method!r}: expected one of {', '.join(METHODS)}")
    return method


def nearest_tuned(M: int, sizes) -> int:
    """The tuned batch size whose config vLLM's Triton fused_moe runs for M tokens:
    try_get_optimal_moe_config takes ``min(keys, key=|key - M|)``, the first of two equally near
    keys in the file's order (ascending as benchmark_moe.py writes them)."""
    return min(sizes, key=lambda x: abs(x - M))


def vllm_tune(k: int, target: str, tuned=None) -> dict:
    """The tuning of vLLM's Triton fused_moe for a verify pass of M = k + 1 tokens (one sequence)."""
    M = k + 1
    sizes = sorted(set(VLLM_TUNE_BATCH_SIZES) | {M})
    grid = sorted(int(x) for x in tuned) if tuned else list(VLLM_TUNE_BATCH_SIZES)
    runs = nearest_tuned(M, grid)
    whose = "your tuned config's" if tuned else "benchmark_moe.py's default"
    why = (f"try_get_optimal_moe_config runs the config of the nearest tuned batch size: M = k + 1 = {M} runs "
           f"the one tuned for {runs} ({whose} sizes {', '.join(map(str, grid))})" if runs != M else
           f"M = k + 1 = {M} is one of {whose} tuned sizes")
    cli = (f"python benchmarks/kernels/benchmark_moe.py --model {shlex.quote(target)} --tp-size 1 --tune "
           f"--batch-size {' '.join(map(str, sizes))} --save-dir tuned_moe")
    return {"M": M, "runs_config_of": runs, "cli": cli,
            "note": f"{why}; tune with M = {M} added to the default sizes (the file then keeps every other size), "
                    "--tp-size your tensor-parallel size, and serve with VLLM_TUNED_CONFIG_FOLDER=tuned_moe; "
                    "B sequences per verify pass: M = B (k + 1)"}


def vllm(k: int, target: str, draft: str, method: str = "draft_model", tuned=None) -> dict:
    """vLLM: ``vllm serve`` with ``--speculative-config`` and the same dict for ``LLM(...)``, and the
    Triton fused_moe tuning for a verify pass of k + 1 tokens."""
    method = _method(method)
    if k == 0:
        return {"cli": f"vllm serve {shlex.quote(target)}", "python": None, "tune": None,
                "note": "plain decoding: leave speculative_config unset (num_speculative_tokens must be > 0)"}
    config = {"method": method, **({"model": draft} if method in ("draft_model", "eagle3") else {}),
              "num_speculative_tokens": int(k)}
    text = json.dumps(config)
    notes = {"draft_model": "model: the draft model",
             "eagle3": "model: the EAGLE-3 head trained for the target",
             "mtp": "no model: the MTP layers are read from the target checkpoint; the per-model method names of "
                    "older builds (deepseek_mtp, qwen3_next_mtp, ...) are deprecated aliases of mtp",
             "ngram": "prompt_lookup_max and prompt_lookup_min unset: both 5; n-gram lookup drafts only where the "
                      "context repeats, so passes can be shorter than k + 1"}
    return {"cli": f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(text)}",
            "python": f"LLM(model={target!r}, speculative_config={config!r})",
            "tune": vllm_tune(k, target, tuned),
            "note": f"{notes[method]}; the draft's MoE backend: speculative_config moe_backend (unset: --moe-backend)"}


def _server(base: str, k: int, flags: str, note: str, plain: str) -> dict:
    """The server command ``base`` with the draft ``flags`` (k >= 1), or alone for plain decoding."""
    return {"cli": base, "note": plain} if k == 0 else {"cli": f"{base} {flags}", "note": note}


def sglang(k: int, target: str, draft: str, method: str = "draft_model") -> dict:
    """SGLang: one chain of k draft steps (top-k 1), k + 1 tokens verified, for each draft method."""
    method = _method(method)
    chain = f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
    path = f"--speculative-draft-model-path {shlex.quote(draft)} "
    flags = {"draft_model": f"--speculative-algorithm STANDALONE {path}{chain}",
             "eagle3": f"--speculative-algorithm EAGLE3 {path}{chain}",
             "mtp": f"--speculative-algorithm EAGLE {chain}",
             "ngram": f"--speculative-algorithm NGRAM --speculative-num-draft-tokens {k + 1} "
                      f"--speculative-ngram-max-bfs-breadth 1"}[method]
    notes = {"draft_model": "one draft chain: num-steps = k drafted tokens, num-draft-tokens = k + 1 verified",
             "eagle3": "one draft chain of the EAGLE-3 head: num-steps = k, num-draft-tokens = k + 1 verified",
             "mtp": "the model's MTP layers through EAGLE (NEXTN is an alias); where the MTP weights are a separate "
                    "checkpoint, give them with --speculative-draft-model-path",
             "ngram": "n-gram lookup, one chain (BFS breadth 1): num-draft-tokens = k + 1 verified per step"}
    return _server(f"python3 -m sglang.launch_server --model-path {shlex.quote(target)}", k, flags,
                   notes[method] + "; the draft's MoE kernel: --speculative-moe-runner-backend (unset: "
                   "--moe-runner-backend)", "plain decoding: leave --speculative-algorithm unset")


def llama_cpp(k: int, target: str, draft: str, method: str = "draft_model") -> dict:
    """llama.cpp's server drafting exactly k tokens (no early stop: p-min 0), for current builds
    (``cli``) and for builds before PR 22397 (``cli_legacy``; None where those builds had no such
    drafting)."""
    method = _method(method)
    base = f"llama-server -m {shlex.quote(target)}"
    if k == 0:
        return {"cli": base, "cli_legacy": base,
                "note": "plain decoding: leave --spec-type at its default (none); on builds before PR 22397 "
                        "give no -md/--model-draft"}
    fixed = f"--spec-draft-n-max {k} --spec-draft-n-min 0 --spec-draft-p-min 0"
    model = f"--spec-draft-model {shlex.quote(draft)} "
    cli = {"draft_model": f"{base} --spec-type draft-simple {model}{fixed}",
           "eagle3": f"{base} --spec-type draft-eagle3 {model}{fixed}",
           "mtp": f"{base} --spec-type draft-mtp {fixed}",
           "ngram": f"{base} --spec-type ngram-simple --spec-ngram-simple-size-m {k}"}[method]
    legacy = {"draft_model": f"{base} -md {shlex.quote(draft)} --draft-max {k} --draft-min 0 --draft-p-min 0",
              "ngram": f"{base} --spec-type ngram-simple --spec-ngram-size-m {k}"}.get(method)
    notes = {"draft_model": "cli_legacy: --draft-p-min defaults to 0.8 there and would cut drafts short",
             "eagle3": "the EAGLE-3 head as the draft model; the builds before PR 22397 read have no EAGLE-3 type",
             "mtp": "the MTP layers of the target; where they are a separate GGUF, give it with --spec-draft-model; "
                    "the builds before PR 22397 read have no MTP type",
             "ngram": "size-m: tokens drafted when the last n-gram recurs (none otherwise, so passes can be "
                      "shorter than k + 1)"}
    return {"cli": cli, "cli_legacy": legacy,
            "note": f"cli: builds from PR 22964 (2026-05-12) on; cli_legacy: builds before PR 22397 (2026-04-26); "
                    f"builds in between were not checked; {notes[method]}"}


def moe_backends() -> dict:
    """The options that pick each engine's MoE kernel for every pass size (no per-pass-size switch in
    vLLM or SGLang): the target's and the draft's."""
    return {"vllm": "--moe-backend (default auto; triton: the fused_moe kernel the tuning is for); the draft's: "
                    "speculative_config moe_backend",
            "sglang": "--moe-runner-backend (default auto; triton, ...); the draft's: --speculative-moe-runner-backend"}


#: get_mmvq_mmid_max_batch's per-type tables (ggml/src/ggml-cuda/mmvq.cu; VERSIONS
#: "llama.cpp-cuda-kernel" says which copy): types not listed take MMVQ_MAX_BATCH_SIZE.
MMVQ_MAX_BATCH_SIZE = 8
MMVQ_MMID_MAX_BATCH = {
    "pascal_older": {"IQ1_S": 6, "IQ1_M": 6, "IQ2_S": 4, "IQ2_XS": 5, "IQ2_XXS": 5, "IQ3_S": 4, "IQ3_XXS": 4,
                     "IQ4_NL": 6, "IQ4_XS": 5, "MXFP4": 4, "NVFP4": 4, "Q2_K": 4, "Q3_K": 4, "Q4_0": 6, "Q4_1": 6,
                     "Q4_K": 5, "Q5_0": 6, "Q5_1": 6, "Q5_K": 5, "Q6_K": 4, "Q8_0": 4},
    "turing_plus": {"IQ2_S": 7, "IQ3_S": 6, "IQ3_XXS": 7, "MXFP4": 7, "NVFP4": 8, "Q2_K": 7, "Q3_K": 5},
}
#: The quantized types ggml_cuda_should_use_mmq accepts (mmq.cu @ VERSIONS "llama.cpp-cuda-mmq").
MMQ_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS",
             "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ4_XS", "IQ4_NL")
#: NVIDIA architectures as get_mmvq_mmid_max_batch tells them apart, with a compute capability
#: (100 major + 10 minor, ggml's cc) that stands for each.
ARCHITECTURES = (("Pascal and older", "cc < 7.0 and 7.2", 610),
                 ("Volta", "cc 7.0: V100", 700),
                 ("Turing, Ampere", "7.5 <= cc < 8.9: T4 7.5, A100 8.0, RTX 30 8.6", 800),
                 ("Ada, Hopper, Blackwell", "cc >= 8.9: RTX 40 8.9, H100/H200 9.0, B200 10.0", 900))
#: moespec storage format -> the ggml types of its expert tensors (q4_k_m: gate/up Q4_K, down Q6_K).
GGML_TYPES = {"q8_0": ("Q8_0",), "q4_k": ("Q4_K",), "q6_k": ("Q6_K",), "q4_k_m": ("Q4_K", "Q6_K"),
              "mxfp4": ("MXFP4",), "f16": (), "bf16": (), "f32": ()}


def mmvq_mmid_max_batch(ggml_type: str, cc: int) -> int:
    """get_mmvq_mmid_max_batch(type, cc) for NVIDIA: MMVQ_MAX_BATCH_SIZE on Volta (700) and from Ada
    (890) on, the Turing-plus table from 750, the Pascal-and-older table below."""
    if cc == 700 or cc >= 890:
        return MMVQ_MAX_BATCH_SIZE
    table = MMVQ_MMID_MAX_BATCH["turing_plus" if cc >= 750 else "pascal_older"]
    return table.get(ggml_type, MMVQ_MAX_BATCH_SIZE)


def mmq_above_cap(ggml_type: str, cc: int) -> str:
    """What ggml_cuda_should_use_mmq answers for MUL_MAT_ID above the MMVQ cap on NVIDIA."""
    if ggml_type not in MMQ_TYPES or cc < 610:
        return "no MMQ (another MUL_MAT_ID kernel)"
    if cc >= 750:
        return "MMQ"
    if 700 <= cc < 750:
        return "MMQ only below MMQ_DP4A_MAX_BATCH_SIZE tokens (fp16 tensor cores present)"
    return "MMQ"


def mmvq_caps(fmt: str | None) -> list[dict]:
    """Per architecture and ggml type of ``fmt``: the MMVQ cap and what runs above it."""
    return [{"architecture": arch, "compute_capability": cc_text, "ggml_type": t,
             "cap": mmvq_mmid_max_batch(t, cc), "above_cap": mmq_above_cap(t, cc)}
            for t in GGML_TYPES.get(fmt or "", ()) for arch, cc_text, cc in ARCHITECTURES]


def _caps_text(fmt: str | None) -> str:
    if fmt is None or fmt.startswith("not named"):
        return "the cap depends on the weights' type: give --format for its caps (MMVQ_MMID_MAX_BATCH, docs/advise.md)"
    if fmt not in GGML_TYPES:
        return (f"format {fmt!r} has no llama.cpp type here; the cap depends on the type (MMVQ_MMID_MAX_BATCH, "
                f"docs/advise.md)")
    if not GGML_TYPES[fmt]:
        return f"{fmt} weights are not quantized: MUL_MAT_ID takes neither MMVQ nor MMQ for them"
    return (f"Upstream caps for {', '.join(GGML_TYPES[fmt])} ({fmt}): mmvq_cap, one per architecture "
            f"(get_mmvq_mmid_max_batch; MMVQ_MAX_BATCH_SIZE = {MMVQ_MAX_BATCH_SIZE} where its table has no entry; "
            f"above the cap ggml_cuda_should_use_mmq decides)")


def cap_lines(caps: list[dict]) -> list[str]:
    """One line per (type, architecture) of :func:`mmvq_caps`, as ``moespec advise`` prints them."""
    return [f"{c['ggml_type']} on {c['architecture']} ({c['compute_capability']}): MMVQ up to {c['cap']} "
            f"token{'s' if c['cap'] != 1 else ''}, above that {c['above_cap']}" for c in caps]


#: What the kernel switch says when the verify times hold one kernel path per pass size.
ONE_PATH = ("one kernel path timed per pass size (as the source dispatches it): the switch is not decided from it; "
            "time the other path too and label the files slot=/dedup= (docs/advise.md)")


def kernel_switch(n_switch: int | None, fmt: str | None = None, paths: str = "both") -> dict:
    """Where an engine should switch from its per-slot (MMVQ-like) to its grouped, deduplicating
    (MMQ-like) expert kernel, how llama.cpp's CUDA backend decides it for the weights' type, and the
    options that pick vLLM's and SGLang's MoE kernel (``engines``). ``paths``: ``"both"`` kernels
    timed, or ``"one"`` path per pass size (no switch can be decided)."""
    caps = _caps_text(fmt)
    common = {"mmvq_cap": mmvq_caps(fmt), "engines": moe_backends()}
    if paths == "one":
        return {"per_slot_up_to": None, **common, "text": ONE_PATH,
                "llama_cpp_cuda": f"upstream MUL_MAT_ID runs MMVQ up to the cap, then MMQ. {caps}"}
    if n_switch is None:
        return {"per_slot_up_to": None, **common,
                "text": "keep the per-slot kernel at every pass size up to 9 tokens (deduplication never pays here)",
                "llama_cpp_cuda": f"no change wanted; upstream MUL_MAT_ID keeps MMVQ up to the cap. {caps}"}
    cap = n_switch - 1
    return {"per_slot_up_to": cap, **common,
            "text": f"per-slot kernel for passes of up to {cap} token{'s' if cap != 1 else ''}, deduplicating "
                    f"from {n_switch} tokens",
            "llama_cpp_cuda": f"compile-time, no runtime option: a build whose get_mmvq_mmid_max_batch(type, cc) "
                              f"returns {cap} runs MMVQ up to {cap} token{'s' if cap != 1 else ''} and, where "
                              f"ggml_cuda_should_use_mmq "
                              f"agrees, MMQ from {n_switch}. {caps}"}


def engine_settings(k: int, n_switch: int | None, target: str = "<target-model>", draft: str = "<draft-model>",
                    fmt: str | None = None, method: str = "draft_model", paths: str = "both", tuned=None) -> dict:
    """All settings for draft length ``k`` with draft ``method``, kernel crossover ``n_switch`` and
    storage format ``fmt``; ``tuned``: the batch sizes of a vLLM tuned fused_moe config."""
    return {"k": int(k), "method": _method(method), "vllm": vllm(k, target, draft, method, tuned),
            "sglang": sglang(k, target, draft, method), "llama_cpp": llama_cpp(k, target, draft, method),
            "kernel_switch": kernel_switch(n_switch, fmt, paths)}


def schedule_ranges(k_by_B: dict) -> list[list[int]]:
    """[start, end, k] ranges of batch sizes from k*(B) at the batch sizes decided: each decided B
    starts a range that ends before the next decided B (the last ends at its own B; larger batches
    take its k in both engines, as their sources read); neighbouring ranges of equal k merged."""
    Bs = sorted(k_by_B)
    if not Bs or Bs[0] != 1:
        raise ValueError(f"batch sizes must start at 1 (the engines' first range does); found {Bs}")
    out = []
    for i, B in enumerate(Bs):
        end = Bs[i + 1] - 1 if i + 1 < len(Bs) else B
        if out and out[-1][2] == k_by_B[B]:
            out[-1][1] = end
        else:
            out.append([B, end, int(k_by_B[B])])
    return out


#: SGLang runs adaptive draft steps for these algorithms, one chain (speculative_eagle_topk 1) only
#: (adaptive_unsupported_reason, VERSIONS "sglang-adaptive"); moespec's methods that map to them.
SGLANG_ADAPTIVE_METHODS = {"eagle3": "EAGLE3", "mtp": "EAGLE"}


def batch_schedule_settings(k_by_B: dict, method: str, target: str, draft: str,
                            sglang_config: str = "adaptive_config.json") -> dict:
    """The per-batch-size schedule of k*(B) in the formats the engines read (VERSIONS "vllm",
    "vllm-dynamic-sd", "sglang-server-args", "sglang-adaptive"; docs/advise.md):

    * vLLM: ``num_speculative_tokens_per_batch_size``, a list of [range_start, range_end, k] with
      inclusive, sorted, non-overlapping ranges from 1, inside ``--speculative-config`` beside
      ``num_speculative_tokens`` (> 0, the largest k: vLLM clamps each range's k to it); batch sizes
      past the last range take its k. None where k*(B) = 0 at every B (speculation off).
    * SGLang: the JSON file of ``--speculative-adaptive-config`` with ``--speculative-adaptive``: one
      integer-string key per range start, each {"candidate_steps": [k]} (one candidate: the step count
      stays k); a batch takes the entry of the largest key not above it. SGLang runs it with EAGLE or
      EAGLE3 at top-k 1 only (:data:`SGLANG_ADAPTIVE_METHODS`); for other methods ``cli`` is None.
    """
    method = _method(method)
    ranges = schedule_ranges(k_by_B)
    kmax = max(r[2] for r in ranges)
    out = {"ranges": ranges, "vllm": None, "vllm_cli": None,
           "sglang": {str(start): {"candidate_steps": [k]} for start, _, k in ranges}, "sglang_cli": None}
    if kmax > 0:
        base = vllm(kmax, target, draft, method)
        spec = json.loads(shlex.split(base["cli"])[-1])
        spec["num_speculative_tokens_per_batch_size"] = ranges
        out["vllm"] = ranges
        out["vllm_cli"] = f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(json.dumps(spec))}"
        if method in SGLANG_ADAPTIVE_METHODS:
            out["sglang_cli"] = (f"{sglang(kmax, target, draft, method)['cli']} --speculative-adaptive "
                                 f"--speculative-adaptive-config {shlex.quote(sglang_config)}")
    notes = ["vLLM: batch sizes past the last range take its k; num_speculative_tokens is the largest k"
             if kmax > 0 else "vLLM: k*(B) = 0 at every batch size: leave speculative_config unset"]
    notes.append(f"SGLang: the config file {sglang_config}; a batch takes the entry of the largest key not above its "
                 "size padded to the next CUDA-graph batch size" if method in SGLANG_ADAPTIVE_METHODS else
                 f"SGLang: adaptive steps run with EAGLE/EAGLE3 at top-k 1 only; --method {method} has no per-batch "
                 "schedule there")
    out["note"] = "; ".join(notes)
    return out
