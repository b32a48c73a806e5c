"""What notebooks 05 and 06 share: the model of each profile, the results folder, the CPU set-up."""

from __future__ import annotations

from pathlib import Path

from moespec import paths

QUICK_MOE = dict(seed=1, vocab_size=256, num_experts=16, top_k=4, num_layers=2, hidden_size=32)


def setup(profile: str, device: str, threads: int, out_dir: str = "") -> Path:
    """Check the device (the engine runs on the CPU here), set torch's threads (one thread: batch-one
    passes of a small model on a shared CPU, where more threads wait on descheduled ones), and
    return the results folder (``out_dir`` or ``<run data>/engine/<profile>``, see
    :func:`moespec.paths.run_data_dir`)."""
    import torch

    if profile not in ("quick", "full"):
        raise ValueError(f"profile must be 'quick' or 'full', found {profile!r}")
    if device != "cpu":
        raise ValueError(f"device={device!r}: the whole-model engine runs on the CPU here (kernels: torch/cpp)")
    torch.set_num_threads(int(threads))
    return Path(out_dir) if out_dir else paths.run_data_dir() / "engine" / profile


def target_model(profile: str):
    """(model, label): a tiny random OLMoE (quick) or the trained default MoE (full)."""
    from moespec import zoo

    if profile == "quick":
        return zoo.tiny_moe(**QUICK_MOE), "tiny random OLMoE (quick profile)"
    return zoo.load_default_moe(), "default MoE (trained here)"
