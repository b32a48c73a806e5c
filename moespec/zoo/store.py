"""Checkpoints of the embedded models: safetensors + config.json (+ moespec.json provenance).

Loading is strict: a missing folder, an unreadable config, a truncated or corrupt safetensors
file, or weights that do not match the config (missing or unexpected tensors, which
transformers would otherwise fill with random values after a warning) raise an error naming
the file.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

WEIGHTS = "model.safetensors"
META = "moespec.json"


def save(model: PreTrainedModel, folder: Path, meta: dict | None = None, tokenizer=None) -> Path:
    """Write ``model`` (safetensors + config), ``meta`` and, if given, ``tokenizer`` into
    ``folder`` atomically.

    The files are written into a sibling temporary folder that takes the place of ``folder`` only
    once it is complete (:func:`_replace_folder`), so an interrupted build never leaves a
    half-written checkpoint, and never loses the build it replaces.
    """
    folder = Path(folder)
    tmp = _temporary(folder)
    if getattr(model, "hf_quantizer", None) is not None:
        # a GGUF-loaded model is dequantized in memory but flagged quantized, which
        # save_pretrained refuses; write its float weights and its config without the flag
        import safetensors.torch

        tmp.mkdir(parents=True)
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(cfg, indent=1, default=str))
        safetensors.torch.save_model(model, str(tmp / WEIGHTS))
    else:
        model.save_pretrained(tmp, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    (tmp / META).write_text(json.dumps(meta or {}, indent=1, default=str))
    _replace_folder(tmp, folder)
    return folder


def _exchange(a: Path, b: Path) -> bool:
    """Swap the two existing paths ``a`` and ``b`` in one step (Linux ``renameat2`` with
    ``RENAME_EXCHANGE``); False where the system or file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(a))


def _replace_folder(tmp: Path, folder: Path) -> None:
    """Put the complete folder ``tmp`` in the place of ``folder``: the new build is complete
    first, then the two are swapped, then the old build is deleted. The swap is one atomic step
    where Linux offers it (``renameat2``); elsewhere the old build is renamed aside
    (``<folder>.old-<pid>``) before the new one is renamed in, and put back if that fails, so a
    crash at any point leaves one complete build on disk (at worst the old one, aside)."""
    if not folder.exists():
        tmp.rename(folder)
        return
    if _exchange(tmp, folder):
        shutil.rmtree(tmp)        # tmp now holds the old build
        return
    old = folder.with_name(folder.name + f".old-{os.getpid()}")
    if old.exists():
        shutil.rmtree(old)
    folder.rename(old)
    try:
        tmp.rename(folder)
    except BaseException:
        old.rename(folder)
        raise
    shutil.rmtree(old)


def _temporary(folder: Path) -> Path:
    tmp = folder.with_name(folder.name + f".tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    return tmp


def save_tokenizer(tokenizer, folder: Path, meta: dict | None = None) -> Path:
    """Write a transformers tokenizer and ``meta`` into ``folder`` atomically (as :func:`save`)."""
    folder = Path(folder)
    tmp = _temporary(folder)
    tokenizer.save_pretrained(str(tmp))
    (tmp / META).write_text(json.dumps(meta or {}, indent=1, default=str))
    _replace_folder(tmp, folder)
    return folder


def read_meta(folder: Path) -> dict:
    path = Path(folder) / META
    return json.loads(path.read_text()) if path.is_file() else {}


def load(folder: Path, device: str = "cpu", dtype=torch.float32) -> PreTrainedModel:
    """Load a checkpoint written by :func:`save` (or any transformers causal-LM folder) strictly,
    in ``dtype`` (a torch dtype, or ``"auto"``: the checkpoint's own) on ``device``."""
    folder = Path(folder)
    if not folder.is_dir():
        aside = sorted(folder.parent.glob(f"{folder.name}.old-*")) if folder.parent.is_dir() else []
        if aside:
            raise FileNotFoundError(f"{folder}: no checkpoint folder, but a replace of it was interrupted: the previous "
                                    f"build is at {aside[0]} (rename it back to {folder.name})")
        raise FileNotFoundError(f"{folder}: no checkpoint folder; build the default models first "
                                f"(moespec build-models, or moespec.zoo.build_default_models())")
    cfg_path = folder / "config.json"
    weights = folder / WEIGHTS
    for p in (cfg_path, weights):
        if not p.is_file():
            raise FileNotFoundError(f"{p}: missing from checkpoint {folder}")
    try:
        config = AutoConfig.from_pretrained(str(folder))
    except Exception as exc:  # json errors, unknown model_type, ...
        raise ValueError(f"{cfg_path}: unreadable model config ({type(exc).__name__}: {exc})") from None
    try:
        from safetensors import safe_open

        with safe_open(str(weights), framework="pt") as fh:
            keys = set(fh.keys())
            for k in keys:  # read every tensor: truncation shows up here, not at first use
                fh.get_tensor(k)
    except Exception as exc:
        raise ValueError(f"{weights}: corrupt or truncated safetensors file "
                         f"({type(exc).__name__}: {exc})") from None
    model, info = AutoModelForCausalLM.from_pretrained(str(folder), config=config,
                                                       output_loading_info=True, dtype=dtype)
    bad = {k: v for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys") and v}
    if bad:
        raise ValueError(f"{weights}: weights do not match {cfg_path}: "
                         + "; ".join(f"{k}: {sorted(map(str, v))[:5]}" for k, v in bad.items()))
    return model.to(device).eval()
