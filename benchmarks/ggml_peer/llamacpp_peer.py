"""llama.cpp's own CPU decode beside moespec's engine on the same weights (the peer of the decode-step benchmark).

The model: OLMoE's shapes (H = 2048, 16 heads of 128, I = 1024 per expert, 8 experts routed per
token, q/k norms) at the byte-faithful subjects' 4 layers, with ``experts`` experts per layer
(fewer than OLMoE's 64: a decode step reads 8 per layer whatever N is; N only sets the memory both
engines hold) and OLMoE's LM-head rows at 4 of its 16 layers (12,576; docs/engine.md). Random
weights (transformers' initialisation, seeded): timing depends on shapes, formats and ids.

* moespec: the model as transformers' ``OlmoeForCausalLM`` in an :class:`moespec.engine.Engine`
  (the lean path), experts, attention projections and LM head in int8_b32
  (:func:`moespec.engine.widen.attention_and_head_in_format`, no padding).
* llama.cpp: the same float weights written to a GGUF file (``gguf``, architecture ``olmoe``) in
  Q8_0 (int8 blocks of 32 with an fp16 scale, 34 bytes per 32 values where int8_b32 takes 36), run
  by llama.cpp's ``llama_decode`` through llama-cpp-python's bindings (its C API, no Python
  sampling), one thread as the engine's. Norms, router and embedding stay F32 in both.

The tokens of the two engines are not compared (the formats round the same weights differently);
each engine's step is set against its own bytes. llama-cpp-python is built from the same sdist
``benchmarks/ggml_peer/build.py`` fetches, into ``build/llamacpp_py``:

    CMAKE_BUILD_PARALLEL_LEVEL=1 CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \\
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF" .venv/bin/python -m pip install --no-deps \\
        --target build/llamacpp_py build/ggml/sdist/llama_cpp_python-0.3.36.tar.gz
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import torch

from moespec import paths
from moespec.engine import Engine
from moespec.engine.subject import Subject
from moespec.engine.widen import attention_and_head_in_format

#: OLMoE's shapes at the byte-faithful subjects' 4 layers (LM head: 50,304 rows x 4 / 16).
SHAPE = dict(hidden_size=2048, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=16, num_experts_per_tok=8, vocab_size=12576, max_position_embeddings=4096,
             rms_norm_eps=1e-5, norm_topk_prob=False)
PY_DIR = "llamacpp_py"


def llama_cpp():
    """The ``llama_cpp`` bindings built into ``build/llamacpp_py`` (module docstring)."""
    where = paths.build_dir() / PY_DIR
    if not (where / "llama_cpp").is_dir():
        raise SystemExit(f"{where}/llama_cpp: not built; build llama-cpp-python as this file's docstring says")
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
    import llama_cpp as L

    return L


def peer_model(experts: int, seed: int):
    """The peer's transformers model (module docstring), float32, seeded."""
    from transformers import OlmoeConfig, OlmoeForCausalLM

    torch.manual_seed(seed)
    cfg = OlmoeConfig(**SHAPE, num_experts=int(experts), pad_token_id=0, bos_token_id=1, eos_token_id=2,
                      tie_word_embeddings=False)
    return OlmoeForCausalLM(cfg).eval()


def write_gguf(model, path) -> dict:
    """``model`` as a GGUF file of architecture ``olmoe``: matrices in Q8_0, norms and router F32, an
    SPM vocabulary of placeholder tokens (256 byte tokens first). Returns the bytes of each part."""
    import gguf

    cfg = model.config
    w = gguf.GGUFWriter(str(path), "olmoe")
    w.add_name("moespec peer: OLMoE shapes, random weights")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_expert_count(cfg.num_experts)
    w.add_expert_used_count(cfg.num_experts_per_tok)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    V = cfg.vocab_size
    tokens = [f"<0x{i:02X}>".encode() for i in range(256)] + [f"t{i}".encode() for i in range(256, V)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * V)
    w.add_token_types([int(gguf.TokenType.BYTE)] * 256 + [int(gguf.TokenType.NORMAL)] * (V - 256))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    nbytes = {"attention": 0, "expert": 0, "lm_head": 0, "other": 0}

    def add(name, t, quant, part):
        arr = t.detach().float().contiguous().numpy()
        if quant:
            data = gguf.quants.quantize(arr, gguf.GGMLQuantizationType.Q8_0)
            w.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
            size = arr.size // 32 * 34
        else:
            w.add_tensor(name, arr)
            size = arr.nbytes
        if part == "expert":
            size //= int(cfg.num_experts)
        if part in nbytes:              # the embedding: one row per token, left out as in byte_shares
            nbytes[part] += size

    m, inner = model, model.model
    inter = cfg.intermediate_size
    add("token_embd.weight", inner.embed_tokens.weight, True, "embedding")
    add("output_norm.weight", inner.norm.weight, False, "other")
    add("output.weight", m.lm_head.weight, True, "lm_head")
    for i, layer in enumerate(inner.layers):
        a, mlp = layer.self_attn, layer.mlp
        add(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight, False, "other")
        for name, proj in (("attn_q", a.q_proj), ("attn_k", a.k_proj), ("attn_v", a.v_proj), ("attn_output", a.o_proj)):
            add(f"blk.{i}.{name}.weight", proj.weight, True, "attention")
        add(f"blk.{i}.attn_q_norm.weight", a.q_norm.weight, False, "other")
        add(f"blk.{i}.attn_k_norm.weight", a.k_norm.weight, False, "other")
        add(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight, False, "other")
        add(f"blk.{i}.ffn_gate_inp.weight", mlp.gate.weight, False, "other")
        gate_up = mlp.experts.gate_up_proj
        add(f"blk.{i}.ffn_gate_exps.weight", gate_up[:, :inter], True, "expert")
        add(f"blk.{i}.ffn_up_exps.weight", gate_up[:, inter:], True, "expert")
        add(f"blk.{i}.ffn_down_exps.weight", mlp.experts.down_proj, True, "expert")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    nbytes["expert"] //= int(cfg.num_hidden_layers)      # one expert of one layer (gate, up, down)
    return nbytes


def _quiet(level, text, user_data):
    """llama.cpp's log callback: drop its load-time messages (errors still raise from the API)."""


_QUIET = None


class LlamaCppDecoder:
    """llama.cpp's context on a GGUF file, driven through its C API: :meth:`prefill` a prompt, then
    :meth:`step` passes of n tokens at the prompt's end, each removed from the cache after it (as the
    engine's timed passes are cropped). Every pass computes the logits of all its tokens (a verify
    pass needs each position's argmax)."""

    def __init__(self, gguf_path, threads: int = 1, n_ctx: int = 512, n_batch: int = 512, extra_bufts: bool = False):
        L = self.L = llama_cpp()
        L.llama_backend_init()
        global _QUIET
        if _QUIET is None:      # kept alive for llama.cpp
            _QUIET = L.llama_log_callback(_quiet)
        L.llama_log_set(_QUIET, ctypes.c_void_p())
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = bool(extra_bufts)
        self.extra_bufts = bool(extra_bufts)
        self.model = L.llama_model_load_from_file(str(gguf_path).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_threads = cp.n_threads_batch = int(threads)
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.mem = L.llama_get_memory(self.ctx)
        self.batch = L.llama_batch_init(n_batch, 0, 1)
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.length = 0

    def _decode(self, tokens) -> None:
        b, n = self.batch, len(tokens)
        for i, t in enumerate(tokens):
            b.token[i] = int(t)
            b.pos[i] = self.length + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1
        b.n_tokens = n
        rc = self.L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        self.length += n

    def argmax(self, n: int) -> list[int]:
        """The argmax of each of the last pass's ``n`` positions."""
        ptr = self.L.llama_get_logits(self.ctx)
        arr = np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=(n, self.vocab))
        return arr.argmax(-1).tolist()

    def prefill(self, tokens) -> None:
        """Start the cache with ``tokens`` (one token per pass with the repacked weights: see
        :class:`PeerPair`)."""
        self.L.llama_memory_clear(self.mem, True)
        self.length = 0
        tokens = [int(t) for t in tokens]
        for chunk in ([[t] for t in tokens] if self.extra_bufts else [tokens]):
            self._decode(chunk)

    def crop(self, length: int) -> None:
        self.L.llama_memory_seq_rm(self.mem, 0, int(length), -1)
        self.length = int(length)

    def step(self, tokens) -> list[int]:
        """One pass of ``tokens`` and the argmax at each position; the cache is cropped back."""
        start = self.length
        self._decode(tokens)
        out = self.argmax(len(tokens))
        self.crop(start)
        return out

    def system_info(self) -> str:
        return self.L.llama_print_system_info().decode()


def pass_tag(n: int) -> str:
    """The breakdown's name of a pass of n tokens, for llama.cpp's: beside moespec's deduplicating
    pass of the same size (ggml's MUL_MAT_ID reads each distinct expert of a pass once)."""
    return "n=1" if n == 1 else f"n={n} dedup"


class PeerPair:
    """The peer model in both engines (module docstring), its prompt of ``depth`` seeded ids, and the
    callables and bytes the breakdown benchmark times and divides by.

    llama.cpp runs in two contexts over the same file: ``llamacpp`` with its weights in ggml's CPU
    buffers (``use_extra_bufts=False``), and ``llamacpp_repacked`` as llama.cpp loads by default,
    its matrices repacked for this CPU's extra buffer types (AMX tiles on this Xeon). The repacked
    context decodes one token per pass; a pass of several tokens ends in a segmentation fault in
    llama.cpp on this machine (llama-cpp-python 0.3.36's llama.cpp), so it is timed at n = 1 only and
    its prompt is fed one token at a time."""

    name = "peer-olmoe-shape"

    def __init__(self, experts: int = 16, depth: int = 64, seed: int = 0, backend: str = "auto", threads: int = 1):
        model = peer_model(experts, seed)
        folder = paths.build_dir() / "llamacpp_peer"
        folder.mkdir(parents=True, exist_ok=True)
        self.gguf = folder / f"olmoe_shape_L4_N{experts}_seed{seed}_q8_0.gguf"
        self.gguf_bytes = write_gguf(model, self.gguf)
        self.depth, self.experts, self.threads = int(depth), int(experts), int(threads)
        eng = Engine(model, backend=backend, fmt="int8_b32")
        attention_and_head_in_format(model, "int8_b32", backend=backend)
        self.subject = Subject(kind="peer", label=f"OLMoE shapes, 4 layers, {experts} experts, random weights "
                               "(int8_b32; llama.cpp: the same weights in Q8_0)", engine=eng, draft=None,
                               tokenizer=None, device="cpu", description={"fmt": "int8_b32", "experts": experts})
        self.prompt = np.random.default_rng(seed).integers(3, SHAPE["vocab_size"], size=self.depth)
        self.decoders = {"llamacpp": LlamaCppDecoder(self.gguf, threads=threads),
                         "llamacpp_repacked": LlamaCppDecoder(self.gguf, threads=threads, extra_bufts=True)}
        for dec in self.decoders.values():
            dec.prefill(self.prompt)
        first = eng.prefill(self.prompt)
        self.tokens = [first] + eng.greedy(first, 8)
        eng.crop(self.depth)

    def calls(self, ns) -> dict:
        """``{(name, "peer_<path>", pass_tag(n)): fn}``: one llama.cpp pass of n tokens, cropped
        back; ``llamacpp`` at every n, ``llamacpp_repacked`` at n = 1 (class docstring)."""
        plain, repacked = self.decoders["llamacpp"], self.decoders["llamacpp_repacked"]
        out = {(self.name, "peer_llamacpp", pass_tag(n)): (lambda n=n: plain.step(self.tokens[:n])) for n in ns}
        if 1 in ns:
            out[(self.name, "peer_llamacpp_repacked", "n=1")] = lambda: repacked.step(self.tokens[:1])
        return out

    def bytes_by_pass(self, ns) -> dict:
        """``{(name, n, "llamacpp"): {"total": bytes, "kernel": "grouped"}}``: llama.cpp's pass of n
        tokens reads its Q8_0 attention and head once, each distinct expert of the pass once per
        layer (ggml's MUL_MAT_ID groups the pass by expert; the distinct experts from the moespec
        engine's routing of the same tokens), and an f16 KV cache of the prompt."""
        eng = self.subject.engine
        cfg = eng.model.config
        kv = cfg.num_hidden_layers * self.depth * 2 * cfg.num_key_value_heads * (cfg.hidden_size //
                                                                                  cfg.num_attention_heads) * 2
        out = {}
        for n in ns:
            with eng.routing_tap() as counts:
                eng.forward(self.tokens[:n])
            eng.crop(self.depth)
            distinct = counts[0] if n > 1 else n * cfg.num_experts_per_tok * cfg.num_hidden_layers
            total = (self.gguf_bytes["attention"] + self.gguf_bytes["lm_head"] + self.gguf_bytes["other"] + kv
                     + distinct * self.gguf_bytes["expert"])
            for path in self.decoders:
                out[(self.name, n, path)] = {"total": float(total), "kernel": "grouped"}
        return out

    def record(self) -> dict:
        dec = self.decoders["llamacpp"]
        return {"name": self.name, "gguf": str(self.gguf), "experts": self.experts, "shape": SHAPE,
                "threads": self.threads, "llama_cpp_python": getattr(dec.L, "__version__", "?"),
                "system_info": dec.system_info(), "gguf_bytes": self.gguf_bytes,
                "paths": {"llamacpp": "use_extra_bufts=False (ggml's CPU buffers, every pass size)",
                          "llamacpp_repacked": "use_extra_bufts=True (llama.cpp's default: weights repacked for "
                                               "this CPU's AMX; n = 1 only, its passes of several tokens crash here)"}}
