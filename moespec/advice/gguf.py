"""llama.cpp loads a GGUF file, not a Hugging Face checkpoint folder: where ``moespec advise`` is
given a checkpoint folder as ``--target`` or ``--draft``, its llama.cpp settings name the GGUF file
that llama.cpp's own converter writes from it, and say how to make it."""

from __future__ import annotations

import shlex
from pathlib import Path

CONVERTER = "convert_hf_to_gguf.py"


def gguf_of(model: str) -> str | None:
    """The GGUF file llama.cpp takes for ``model`` when ``model`` is a checkpoint folder
    (``<folder>.gguf`` beside it), else None (a GGUF file, a placeholder or a hub name: as given)."""
    path = Path(model).expanduser()
    return str(path.with_name(path.name + ".gguf")) if path.is_dir() else None


def with_gguf(llama_cpp: dict, target: str, draft: str) -> dict:
    """``llama_cpp`` (settings of :func:`moespec.advice.settings.llama_cpp`) with every checkpoint
    folder replaced by its GGUF file (:func:`gguf_of`) and a ``convert`` line per folder:
    llama.cpp's converter, run from a llama.cpp checkout."""
    out, convert = dict(llama_cpp), []
    for model in dict.fromkeys((target, draft)):
        gguf = gguf_of(model)
        if gguf is None:
            continue
        for key in ("cli", "cli_legacy"):
            out[key] = out[key].replace(shlex.quote(model), shlex.quote(gguf))
        convert.append(f"python {CONVERTER} {shlex.quote(model)} --outfile {shlex.quote(gguf)}")
    if convert:
        out["convert"] = convert
    return out
