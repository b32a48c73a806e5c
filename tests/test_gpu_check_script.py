"""scripts/gpu_check.sh without a GPU: valid bash (and shellcheck-clean where shellcheck is
installed), and it stops at the first missing prerequisite with a message naming it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from moespec import paths

SCRIPT = paths.ROOT / "scripts" / "gpu_check.sh"


def run(env_extra: dict, tmp_path, path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, **env_extra, "PATH": path}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True,
                          env=env, timeout=120)


def test_bash_syntax_and_shellcheck():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    assert os.access(SCRIPT, os.X_OK), "gpu_check.sh is not executable"
    sc = shutil.which("shellcheck")
    if sc:
        proc = subprocess.run([sc, str(SCRIPT)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout


def test_stops_without_nvidia_driver(tmp_path):
    path = "/usr/bin:/bin"
    if shutil.which("nvidia-smi", path=path):
        pytest.skip("nvidia-smi is installed in /usr/bin or /bin")
    proc = run({}, tmp_path, path)
    assert proc.returncode == 1
    assert "nvidia-smi not found" in proc.stdout + proc.stderr  # the script logs both streams together
    assert (tmp_path / "out" / "gpu_check.log").exists()


def test_cpu_only_torch_skips_torch_steps_and_reports(tmp_path):
    """With a (fake) GPU and the toolkit present, a CPU-only torch is named and never used: the
    torch steps are skipped, the report says why, and the script exits 1."""
    if torch.version.cuda is not None:
        pytest.skip("torch here is a CUDA build")
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc") or os.environ.get("CUDA_HOME")):
        pytest.skip("no CUDA toolkit")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text('#!/bin/sh\n[ "$1" = -L ] && { echo "GPU 0: fake"; exit 0; }\n'
                                     'echo "Fake GPU, 9.0, 570.00, 1 MiB"\n')
    (fake / "nvidia-smi").chmod(0o755)
    proc = run({"GPU_CHECK_PYTHON": sys.executable, "GPU_CHECK_SKIP_STANDALONE": "1"}, tmp_path,
               f"{fake}:{os.environ['PATH']}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "CPU-only" in out and "GPU 0: Fake GPU, 9.0" in out
    report = (tmp_path / "out" / "REPORT.md").read_text()
    assert "torch: not usable" in report and "steps 4-6 not run" in report
    assert "## Torch benchmark" in report and "(not run" in report
