"""The ggml peer: ggml's own CPU MUL_MAT_ID expert FFN (what llama.cpp runs on CPUs), built from the
llama-cpp-python sdist by ``build.py`` and called through ``peer.py`` (see docs/ggml_peer.md)."""

from benchmarks.ggml_peer.peer import GgmlExperts, PeerNotBuilt, available, expert_bytes, library_path, version

__all__ = ["GgmlExperts", "PeerNotBuilt", "available", "expert_bytes", "library_path", "version"]
