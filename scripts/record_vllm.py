#!/usr/bin/env python3
"""Record a model's routing with vLLM, tensor-parallel on N GPUs, as the JSONL that
``moespec import-routing --engine vllm`` and ``moespec.routing.from_vllm`` read.

Two passes (docs/routing.md, "Traces from vLLM and SGLang"):

* ``--corpus wikitext``: paper 1's routing pass. Each WikiText-103 test article (raw text, from
  data/wikitext) is the prompt, cut to ``--max-prompt-tokens``; one token is generated, so the
  routing covers the article's tokens (teacher forcing, as ``moespec.routing.record``).
* ``--corpus spec-bench``: the first turn of each Spec-Bench question (data/spec_bench), in the
  model's chat template, then ``--max-new-tokens`` greedy tokens: prompt and generated routing.

The engine runs with ``enable_return_routed_experts=True`` (vLLM PR 28284). What routed-expert
capture needs changed across vLLM versions (docs/routing.md, "Recording with vLLM"): later
releases capture only with Model Runner V2 and prefix caching, earlier ones fall back to the V1
runner by themselves. So the script sets ``VLLM_USE_V2_MODEL_RUNNER=1`` unless it is already set,
asks for ``enable_prefix_caching=True`` (``--no-prefix-caching`` to leave it off), and prints and
records what it did. Every ``RequestOutput`` becomes one JSON line with vLLM's own field names
(``request_id`` set to the document id, ``prompt_token_ids``, ``prompt_routed_experts`` where the
vLLM version returns it, ``outputs[i].token_ids`` and ``outputs[i].routed_experts``), the ids as
integer lists whatever the engine returned (numpy arrays of any integer dtype, or the base64
``.npy`` strings of later versions), and ``routed_experts_prompt_start`` (0: every position). The
model's config.json is written beside the JSONL (``<out>.config.json``, for ``--config`` at
import) with a ``moespec_recording`` entry: the vLLM version, the layout and payload the engine
returned, and the capture settings.

    python scripts/record_vllm.py --model /path/to/Qwen3-30B-A3B --tp 4 --corpus wikitext \\
        --out runs/qwen3_wikitext.jsonl.gz
    moespec import-routing runs/qwen3_wikitext.jsonl.gz --engine vllm \\
        --config runs/qwen3_wikitext.jsonl.gz.config.json --out data/traces/qwen3_vllm.npz

Nothing here has been run against vLLM by moespec's authors (no machine with vLLM and model
weights was available); the JSONL writer, the settings and the prompt builders are tested on
stand-in outputs (tests/test_record_vllm_script.py). Importing this file needs neither vLLM nor a GPU.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from moespec.io import atomic_path, write_json  # noqa: E402  (moespec itself needs no vLLM)
from moespec.routing.engines import vllm_routed_array  # noqa: E402

CORPORA = ("wikitext", "spec-bench")


def _ids(value: Any, where: str, field: str) -> list | None:
    """The engine's routed experts (numpy array of any integer dtype, nested lists, or a base64
    ``.npy`` string) as nested lists of Python ints; the decoding and its errors are the importer's
    (``moespec.routing.engines.vllm_routed_array``)."""
    if value is None:
        return None
    return vllm_routed_array(value, where, field).tolist()


def payload_kind(value: Any) -> str | None:
    """How the engine returned an array: "base64 .npy" (a string), "array" or None."""
    return None if value is None else "base64 .npy" if isinstance(value, (str, bytes)) else "array"


def output_record(output: Any, request_id: str | None = None, prompt_start: int = 0) -> dict:
    """One ``vllm.RequestOutput`` as a JSON-ready dict with vLLM's field names; ``request_id``
    replaces vLLM's counter id (the document id is what the trace calls the document)."""
    rid = str(request_id if request_id is not None else output.request_id)
    completions = []
    for comp in output.outputs:
        completions.append({"index": int(comp.index), "token_ids": [int(t) for t in comp.token_ids],
                            "routed_experts": _ids(getattr(comp, "routed_experts", None),
                                                   f"vLLM request {rid!r}", "routed_experts"),
                            "finish_reason": getattr(comp, "finish_reason", None)})
    return {"request_id": rid,
            "vllm_request_id": str(output.request_id),
            "prompt_token_ids": [int(t) for t in output.prompt_token_ids],
            "prompt_routed_experts": _ids(getattr(output, "prompt_routed_experts", None),
                                          f"vLLM request {rid!r}", "prompt_routed_experts"),
            "routed_experts_prompt_start": int(prompt_start),
            "num_cached_tokens": getattr(output, "num_cached_tokens", None),
            "outputs": completions}


def returned_format(outputs: Iterable[Any]) -> dict:
    """The layout ("split" where prompt_routed_experts came back, else "full") and payload kinds of
    the engine's outputs, for the recording's config."""
    layouts, payloads = set(), set()
    for out in outputs:
        layouts.add("split" if getattr(out, "prompt_routed_experts", None) is not None else "full")
        payloads.update(filter(None, (payload_kind(getattr(c, "routed_experts", None)) for c in out.outputs)))
    return {"layout": sorted(layouts), "payload": sorted(payloads)}


def write_jsonl(outputs: Iterable[Any], path: str | Path, request_ids: Iterable[str] | None = None,
                prompt_start: int = 0) -> Path:
    """Write one JSON line per RequestOutput, atomically (gzip when ``path`` ends in .gz)."""
    path = Path(path)
    ids = list(request_ids) if request_ids is not None else None
    outputs = list(outputs)
    if ids is not None and len(ids) != len(outputs):
        raise ValueError(f"{len(ids)} request ids for {len(outputs)} outputs")
    with atomic_path(path) as tmp:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(tmp, "wt", encoding="utf-8") as fh:
            for i, out in enumerate(outputs):
                record = output_record(out, None if ids is None else ids[i], prompt_start)
                fh.write(json.dumps(record, separators=(",", ":")) + "\n")
    return path


def wikitext_prompts(tokenizer, max_docs: int | None, max_tokens: int) -> list[tuple[str, list[int]]]:
    """(document id, token ids) of the WikiText-103 test articles (raw text), each cut to
    ``max_tokens`` tokens."""
    from moespec import corpus

    arts = corpus.articles("test", "raw")[:max_docs]
    ids = corpus.tokenize(arts, tokenizer, max_tokens=max_tokens)
    return [(f"wikitext/{a.doc_id}", [int(t) for t in x]) for a, x in zip(arts, ids) if len(x)]


def spec_bench_prompts(tokenizer, max_docs: int | None, max_tokens: int) -> list[tuple[str, list[int]]]:
    """(document id, token ids) of the Spec-Bench first turns in the tokenizer's chat template
    (plain text when it has none), each cut to ``max_tokens`` tokens."""
    from moespec.oracle.record import load_questions

    out = []
    for q in load_questions()[:max_docs]:
        messages = [{"role": "user", "content": q["text"]}]
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        else:
            ids = tokenizer(q["text"], add_special_tokens=True)["input_ids"]
        out.append((f"spec-bench/{q['question_id']}", [int(t) for t in list(ids)[:max_tokens]]))
    return out


def model_config(model: str) -> dict | None:
    """The checkpoint's config.json (a local folder; else transformers' cache), or None."""
    local = Path(model) / "config.json"
    if local.is_file():
        return json.loads(local.read_text())
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model).to_dict()
    except Exception:  # no cached config: the importer then needs --num-experts
        return None


#: The environment variable that selects vLLM's Model Runner V2 (vLLM docs: routed-experts capture
#: needs it in later releases; earlier releases fall back to V1 with the feature on).
V2_RUNNER = "VLLM_USE_V2_MODEL_RUNNER"


def capture_settings(prefix_caching: bool = True, environ=None) -> tuple[dict, list[str]]:
    """Set what routed-expert capture needs (docs/routing.md): ``VLLM_USE_V2_MODEL_RUNNER=1`` unless
    the user set it, and ``enable_prefix_caching``. Returns (settings recorded, lines saying what was
    done)."""
    env = os.environ if environ is None else environ
    notes = []
    if env.get(V2_RUNNER) is None:
        env[V2_RUNNER] = "1"
        notes.append(f"set {V2_RUNNER}=1 (Model Runner V2: later vLLM releases capture routed experts only "
                     f"with it; earlier ones fall back to V1 by themselves)")
    else:
        notes.append(f"kept {V2_RUNNER}={env[V2_RUNNER]} as set in the environment"
                     + ("" if env[V2_RUNNER] == "1" else " (later vLLM releases capture routed experts only "
                                                         "with Model Runner V2, =1)"))
    notes.append("enable_prefix_caching=True (needed for routed-expert capture in later vLLM releases)"
                 if prefix_caching else "enable_prefix_caching=False (--no-prefix-caching: later vLLM releases "
                                        "may then refuse routed-expert capture)")
    return {V2_RUNNER: env[V2_RUNNER], "enable_prefix_caching": bool(prefix_caching),
            "enable_return_routed_experts": True, "routed_experts_prompt_start": 0}, notes


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="See docs/routing.md, 'Traces from vLLM and SGLang'.")
    p.add_argument("--model", required=True, help="checkpoint folder or model name vLLM can load")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size: the number of GPUs (default 1)")
    p.add_argument("--expert-parallel", action="store_true", help="enable_expert_parallel=True")
    p.add_argument("--corpus", choices=CORPORA, default="wikitext")
    p.add_argument("--max-docs", type=int, help="at most this many documents (default all: 60 articles / 480 questions)")
    p.add_argument("--max-prompt-tokens", type=int, default=4096, help="cut each prompt to this many tokens")
    p.add_argument("--max-new-tokens", type=int, default=256,
                   help="generated tokens per request for spec-bench (wikitext generates 1)")
    p.add_argument("--max-model-len", type=int, help="vLLM max_model_len (default: prompt + new tokens)")
    p.add_argument("--dtype", default="auto", help="vLLM dtype (default auto)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="do not ask for enable_prefix_caching (later vLLM releases need it for capture)")
    p.add_argument("--out", type=Path, required=True, help="JSONL to write (.jsonl or .jsonl.gz)")
    args = p.parse_args(argv)
    for name in ("tp", "max_prompt_tokens", "max_new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, found {getattr(args, name)}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    settings, notes = capture_settings(prefix_caching=not args.no_prefix_caching)  # before vLLM is imported
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt
    except ImportError as exc:
        print(f"record_vllm: vLLM is not installed here ({exc}); install it on the GPU machine", file=sys.stderr)
        return 2
    for note in notes:
        print(f"record_vllm: {note}")
    new_tokens = 1 if args.corpus == "wikitext" else args.max_new_tokens
    llm = LLM(model=args.model, tensor_parallel_size=args.tp, enable_expert_parallel=args.expert_parallel,
              enable_return_routed_experts=True, enable_prefix_caching=settings["enable_prefix_caching"],
              dtype=args.dtype, seed=args.seed, max_model_len=args.max_model_len or args.max_prompt_tokens + new_tokens)
    tokenizer = llm.get_tokenizer()
    build = wikitext_prompts if args.corpus == "wikitext" else spec_bench_prompts
    prompts = build(tokenizer, args.max_docs, args.max_prompt_tokens)
    sampling = SamplingParams(temperature=0.0, max_tokens=new_tokens, seed=args.seed)
    outputs = list(llm.generate([TokensPrompt(prompt_token_ids=ids) for _, ids in prompts], sampling))
    path = write_jsonl(outputs, args.out, [doc for doc, _ in prompts], settings["routed_experts_prompt_start"])
    recording = {"vllm_version": str(getattr(vllm, "__version__", "unknown")), **returned_format(outputs),
                 "settings": settings, "corpus": args.corpus, "tensor_parallel_size": args.tp,
                 "ids_written_as": "JSON integer lists"}
    config = model_config(args.model)
    if config is None:
        print("record_vllm: no config.json found for the model: give the checkpoint's config.json to "
              "`moespec import-routing --config` (the file written here holds the recording only)", file=sys.stderr)
    write_json(Path(f"{args.out}.config.json"), {**(config or {}), "moespec_recording": recording})
    print(f"record_vllm: {len(outputs)} requests ({args.corpus}, TP = {args.tp}, vLLM {recording['vllm_version']}, "
          f"layout {recording['layout']}, payload {recording['payload']}) -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
