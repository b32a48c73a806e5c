"""Ready-to-paste engine settings for a draft length k and a kernel crossover n, with the exact
option names of the engine versions cited in :data:`VERSIONS` (read from each project's source or
documentation at that commit; docs/advise.md quotes where).

The theory assumes a fixed draft length k (a step drafts k tokens and verifies k + 1 in one pass),
so the settings ask each engine for exactly that: no early stop of the draft on low draft
probability, one draft chain (no tree). k = 0 means plain decoding: leave speculation off.
"""

from __future__ import annotations

import json
import shlex

#: The engine versions whose option names the settings use, and where each name was read.
VERSIONS = {
    "vllm": {"project": "vllm-project/vllm", "commit": "002e77c1f0ef9b19cff8b9e21cfbd6feb3d6b443",
             "where": "vllm/config/speculative.py: SpeculativeConfig.method ('draft_model'), .model, "
                      ".num_speculative_tokens (> 0); passed as --speculative-config JSON"},
    "sglang": {"project": "sgl-project/sglang", "commit": "fc6d465375b9e4e49d32cd9ea24024a355125435",
               "where": "docs/advanced_features/speculative_decoding.md, 'Full Parameter Reference': "
                        "--speculative-algorithm STANDALONE, --speculative-draft-model-path, "
                        "--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens"},
    "llama.cpp": {"project": "ggml-org/llama.cpp", "commit": "00dc8057ab28c9cb4c79a6dd6dfce07fe779f63b",
                  "where": "tools/server/README.md: --spec-type draft-simple, --spec-draft-model, "
                           "--spec-draft-n-max (default 3), --spec-draft-n-min (default 0), --spec-draft-p-min "
                           "(default 0.00); it lists --draft-max/--draft-min as removed names of the last two"},
    "llama.cpp-cuda-kernel": {"project": "ggml-org/llama.cpp", "commit": "1d67db96f5d1f01c369c442541d4b9ba45570a09",
                              "where": "ggml/src/ggml-cuda/mmvq.cuh: #define MMVQ_MAX_BATCH_SIZE 8 and "
                                       "get_mmvq_mmid_max_batch(type, cc), the largest batch for which MUL_MAT_ID "
                                       "runs the matrix-vector (MMVQ, per-slot) kernel; above it the tiled MMQ "
                                       "kernel (deduplicating, paper 1 Table 6)"},
}


def vllm(k: int, target: str, draft: str) -> dict:
    """vLLM: ``vllm serve`` with ``--speculative-config`` and the same dict for ``LLM(...)``."""
    if k == 0:
        return {"cli": f"vllm serve {shlex.quote(target)}", "python": None,
                "note": "plain decoding: leave speculative_config unset (num_speculative_tokens must be > 0)"}
    config = {"method": "draft_model", "model": draft, "num_speculative_tokens": int(k)}
    text = json.dumps(config)
    return {"cli": f"vllm serve {shlex.quote(target)} --speculative-config {shlex.quote(text)}",
            "python": f"LLM(model={target!r}, speculative_config={config!r})",
            "note": "no option selects the MoE kernel by pass size; the kernel crossover is for engine developers"}


def _server(base: str, k: int, flags: str, note: str, plain: str) -> dict:
    """The server command ``base`` with the draft ``flags`` (k >= 1), or alone for plain decoding."""
    return {"cli": base, "note": plain} if k == 0 else {"cli": f"{base} {flags}", "note": note}


def sglang(k: int, target: str, draft: str) -> dict:
    """SGLang: a standalone draft model, one chain of k steps (top-k 1), k + 1 tokens verified."""
    return _server(f"python3 -m sglang.launch_server --model-path {shlex.quote(target)}", k,
                   f"--speculative-algorithm STANDALONE --speculative-draft-model-path {shlex.quote(draft)} "
                   f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}",
                   "one draft chain: num-steps = k drafted tokens, num-draft-tokens = k + 1 verified with top-k 1; "
                   "no option selects the MoE kernel by pass size",
                   "plain decoding: leave --speculative-algorithm unset")


def llama_cpp(k: int, target: str, draft: str) -> dict:
    """llama.cpp's server with a draft model drafting exactly k tokens (no early stop: p-min 0)."""
    return _server(f"llama-server -m {shlex.quote(target)}", k,
                   f"--spec-type draft-simple --spec-draft-model {shlex.quote(draft)} "
                   f"--spec-draft-n-max {k} --spec-draft-n-min 0 --spec-draft-p-min 0",
                   "builds older than the cited commit name the two counts --draft-max / --draft-min",
                   "plain decoding: leave --spec-type at its default (none)")


def kernel_switch(n_switch: int | None) -> dict:
    """Where an engine should switch from its per-slot (MMVQ-like) to its grouped, deduplicating
    (MMQ-like) expert kernel, and how llama.cpp's CUDA backend would be set to it."""
    if n_switch is None:
        return {"per_slot_up_to": None,
                "text": "keep the per-slot kernel at every pass size up to 9 tokens (deduplication never pays here)",
                "llama_cpp_cuda": "no change: MUL_MAT_ID keeps MMVQ up to get_mmvq_mmid_max_batch(type, cc) "
                                  "(MMVQ_MAX_BATCH_SIZE = 8 in ggml/src/ggml-cuda/mmvq.cuh)"}
    cap = n_switch - 1
    return {"per_slot_up_to": cap,
            "text": f"per-slot kernel for passes of up to {cap} token{'s' if cap != 1 else ''}, deduplicating "
                    f"from {n_switch} tokens",
            "llama_cpp_cuda": f"compile-time, no runtime option: a build whose get_mmvq_mmid_max_batch(type, cc) "
                              f"returns {cap} (upstream: MMVQ_MAX_BATCH_SIZE = 8 on recent NVIDIA GPUs, "
                              f"ggml/src/ggml-cuda/mmvq.cuh) runs MMQ from {n_switch} tokens"}


def engine_settings(k: int, n_switch: int | None, target: str = "<target-model>",
                    draft: str = "<draft-model>") -> dict:
    """All settings for draft length ``k`` and kernel crossover ``n_switch``."""
    return {"k": int(k), "vllm": vllm(k, target, draft), "sglang": sglang(k, target, draft),
            "llama_cpp": llama_cpp(k, target, draft), "kernel_switch": kernel_switch(n_switch)}
