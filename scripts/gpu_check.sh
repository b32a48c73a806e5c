#!/usr/bin/env bash
# gpu_check.sh: build and check moespec's CUDA expert kernels on a machine with an NVIDIA GPU,
# measure them, and write a report (markdown + CSV) into one folder.
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# OUT_DIR: where everything goes; default $OUT if set, else reports/gpu/<UTC time>.
# Steps (each printed as it starts; the log is OUT_DIR/gpu_check.log):
#   1. GPU (nvidia-smi) and CUDA toolkit (nvcc) present;
#   2. Python: $GPU_CHECK_PYTHON if set (an interpreter that already has a CUDA torch 2.13.0 and
#      moespec's dependencies), else the repo's .venv via `make install`; if that torch is
#      CPU-only, replace it by the CUDA build of torch 2.13.0 for nvcc's CUDA version:
#        .venv/bin/pip uninstall -y torch
#        .venv/bin/pip install "torch==2.13.0+cu130" \
#            --index-url https://download.pytorch.org/whl/cu130 --extra-index-url https://pypi.org/simple
#      (tag from nvcc: cu<major><minor>, e.g. cu130 for CUDA 13.0; override with TORCH_CUDA_INDEX=cu128;
#      torch's extension builder needs the same CUDA major version as nvcc). Both need network.
#   3. build the CUDA extension (moespec.kernels.build.load_cuda, into build/);
#   4. the torch-free standalone harness (nvcc) against its host reference;
#   5. the CUDA tests (pytest -m cuda; files: $GPU_CHECK_TESTS, default the CUDA kernel tests);
#   6. the bandwidth benchmark (benchmarks/bench_kernels_cuda.py; extra args: $GPU_CHECK_BENCH_ARGS,
#      skipped with GPU_CHECK_SKIP_BENCH=1);
#   7. OUT_DIR/REPORT.md (+ bench_kernels_cuda.csv, pytest_cuda.txt/.xml, standalone_check.txt).
# A failed check (harness, tests) does not stop the later steps: the report says what failed and
# the script exits 1 at the end. A missing prerequisite stops it at once with the reason.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
OUT_DIR=${1:-${OUT:-reports/gpu/$(date -u +%Y%m%dT%H%M%SZ)}}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1

step() { printf '\n=== [%s] %s\n' "$(date -u +%H:%M:%S)" "$*"; }
die() { printf '\ngpu_check: ERROR: %s\n' "$*" >&2; exit 1; }
on_error() { printf '\ngpu_check: stopped (exit %s) at line %s: %s\n' "$1" "$2" "$3" >&2; }
trap 'on_error $? $LINENO "$BASH_COMMAND"' ERR

FAILED=()
echo "gpu_check: repo $ROOT, output $OUT_DIR"

# --- 1. GPU and toolkit -------------------------------------------------------------------
step "1/7 GPU and CUDA toolkit"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver on this machine"
nvidia-smi -L || die "nvidia-smi lists no GPU"
GPU_QUERY=$(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | head -n 1) \
  || die "nvidia-smi cannot query the GPU"
echo "GPU 0: $GPU_QUERY"
COMPUTE_CAP=$(echo "$GPU_QUERY" | cut -d, -f2 | tr -d ' ')
# CUDA_HOME: $CUDA_HOME if it holds nvcc, else /usr/local/cuda, else the folder above the real nvcc
if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  :
elif [ -x /usr/local/cuda/bin/nvcc ]; then
  CUDA_HOME=/usr/local/cuda
elif command -v nvcc >/dev/null 2>&1; then
  NVCC_REAL=$(readlink -f "$(command -v nvcc)")
  CUDA_HOME=$(cd "$(dirname "$NVCC_REAL")/.." && pwd)
else
  die "nvcc not found (\$CUDA_HOME/bin, /usr/local/cuda/bin, PATH): install the CUDA toolkit or set CUDA_HOME"
fi
NVCC="$CUDA_HOME/bin/nvcc"
[ -x "$NVCC" ] || die "no executable nvcc at $NVCC: set CUDA_HOME to the CUDA toolkit folder"
[ -f "$CUDA_HOME/include/cuda_runtime.h" ] || die "CUDA headers missing ($CUDA_HOME/include/cuda_runtime.h): set CUDA_HOME"
export CUDA_HOME
export PATH="$CUDA_HOME/bin:$PATH"
CUDA_VER=$("$NVCC" --version | sed -n 's/.*release \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p')
[ -n "$CUDA_VER" ] || die "cannot read the CUDA version from $NVCC --version"
echo "nvcc: $NVCC (CUDA $CUDA_VER), CUDA_HOME=$CUDA_HOME"

# --- 2. Python with a CUDA build of torch -------------------------------------------------
step "2/7 Python environment"
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
  PY=$GPU_CHECK_PYTHON
  [ -x "$PY" ] || PY=$(command -v "$PY" || true)
  [ -n "$PY" ] || die "GPU_CHECK_PYTHON=$GPU_CHECK_PYTHON is not an executable"
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  echo "using $PY (GPU_CHECK_PYTHON), moespec from $ROOT via PYTHONPATH"
else
  echo "make install (creates .venv and installs the pinned dependencies if missing; needs network the first time)"
  make install || die "make install failed (no network? set GPU_CHECK_PYTHON to an interpreter with a CUDA torch 2.13.0)"
  PY="$ROOT/.venv/bin/python"
fi
TORCH_CUDA=$("$PY" -c 'import torch; print(torch.version.cuda or "")') || die "$PY cannot import torch"
if [ -z "$TORCH_CUDA" ]; then
  [ -z "${GPU_CHECK_PYTHON:-}" ] || die "torch under $PY is CPU-only; install a CUDA build of torch 2.13.0 there"
  TAG=${TORCH_CUDA_INDEX:-cu$(echo "$CUDA_VER" | tr -d .)}
  echo "torch is CPU-only: replacing it by torch==2.13.0+$TAG from https://download.pytorch.org/whl/$TAG"
  "$ROOT/.venv/bin/pip" uninstall -y torch || die "cannot uninstall the CPU-only torch"
  "$ROOT/.venv/bin/pip" install --disable-pip-version-check "torch==2.13.0+$TAG" \
      --index-url "https://download.pytorch.org/whl/$TAG" --extra-index-url https://pypi.org/simple \
    || die "installing the CUDA build of torch 2.13.0 ($TAG) failed; set TORCH_CUDA_INDEX to a tag that exists (e.g. cu128, cu126) and matches nvcc's major version"
  TORCH_CUDA=$("$PY" -c 'import torch; print(torch.version.cuda or "")')
  [ -n "$TORCH_CUDA" ] || die "torch is still CPU-only after the install"
fi
"$PY" - <<'PYEOF' || die "torch cannot use the GPU (see above)"
import torch
print(f"torch {torch.__version__}, built for CUDA {torch.version.cuda}, GPU available: {torch.cuda.is_available()}")
assert torch.cuda.is_available(), "torch.cuda.is_available() is False (driver too old for this torch build?)"
print("device 0:", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
PYEOF
if [ "${TORCH_CUDA%%.*}" != "${CUDA_VER%%.*}" ]; then
  die "torch is built for CUDA $TORCH_CUDA but nvcc is CUDA $CUDA_VER: torch.utils.cpp_extension refuses a different major version; install the matching torch wheel (TORCH_CUDA_INDEX) or toolkit"
fi
"$PY" -c 'import moespec, numpy, pandas, psutil, pytest; import pynvml' \
  || die "moespec or its dependencies (numpy, pandas, psutil, pytest, nvidia-ml-py) do not import under $PY"

# --- 3. build the extension ---------------------------------------------------------------
step "3/7 build the CUDA extension (ninja, into build/)"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$COMPUTE_CAP}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
MOESPEC_BUILD_VERBOSE=1 "$PY" -c '
from moespec.kernels import build
build.load_cuda()
import torch
print("registered:", torch.ops.moespec.expert_slot, torch.ops.moespec.expert_dedup)
' || die "building the CUDA extension failed (compiler output above)"

# --- 4. standalone harness ----------------------------------------------------------------
step "4/7 standalone harness (torch-free kernels vs host reference)"
SM=sm_$(echo "$COMPUTE_CAP" | tr -d .)
mkdir -p "$ROOT/build"
HARNESS_BIN="$ROOT/build/standalone_check"
CUDA_SRC=moespec/kernels/csrc/cuda
if "$NVCC" -std=c++17 -O2 -arch="$SM" -I"$CUDA_SRC" "$CUDA_SRC/tools/standalone_check.cu" "$CUDA_SRC/expert_kernels.cu" \
     -o "$HARNESS_BIN"; then
  if "$HARNESS_BIN" | tee "$OUT_DIR/standalone_check.txt"; then :; else FAILED+=("standalone harness"); fi
else
  FAILED+=("standalone harness (compile)")
fi

# --- 5. CUDA tests ------------------------------------------------------------------------
step "5/7 CUDA tests"
TESTS=${GPU_CHECK_TESTS:-tests/test_kernels_cuda.py tests/test_kernels_correctness.py tests/test_cuda_compile.py}
# shellcheck disable=SC2086
if "$PY" -m pytest -q -m cuda -rA --junitxml="$OUT_DIR/pytest_cuda.xml" $TESTS 2>&1 | tee "$OUT_DIR/pytest_cuda.txt"; \
   [ "${PIPESTATUS[0]}" -eq 0 ]; then :; else FAILED+=("CUDA tests"); fi

# --- 6. benchmark -------------------------------------------------------------------------
step "6/7 bandwidth benchmark"
BENCH_DIR="$OUT_DIR/bench"
if [ "${GPU_CHECK_SKIP_BENCH:-0}" = 1 ]; then
  echo "skipped (GPU_CHECK_SKIP_BENCH=1)"
else
  # shellcheck disable=SC2086
  if "$PY" benchmarks/bench_kernels_cuda.py --out "$BENCH_DIR" ${GPU_CHECK_BENCH_ARGS:-}; then
    cp "$BENCH_DIR/rows.csv" "$OUT_DIR/bench_kernels_cuda.csv"
  else
    FAILED+=("benchmark")
  fi
fi

# --- 7. report ----------------------------------------------------------------------------
step "7/7 report"
REPORT="$OUT_DIR/REPORT.md"
{
  echo "# moespec GPU check"
  echo
  echo "- date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "- host: $(hostname)"
  echo "- GPU 0: $GPU_QUERY"
  echo "- nvcc: CUDA $CUDA_VER; torch: $("$PY" -c 'import torch; print(torch.__version__)') (CUDA $TORCH_CUDA)"
  if COMMIT=$(git rev-parse HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT (with uncommitted changes)"
  else
    COMMIT="unknown (no git checkout)"
  fi
  echo "- commit: $COMMIT"
  echo "- result: $([ ${#FAILED[@]} -eq 0 ] && echo 'all checks passed' || echo "FAILED: ${FAILED[*]}")"
  echo
  echo "## Standalone harness"
  echo
  echo '```'
  cat "$OUT_DIR/standalone_check.txt" 2>/dev/null || echo "(no output)"
  echo '```'
  echo
  echo "## CUDA tests"
  echo
  echo '```'
  tail -n 40 "$OUT_DIR/pytest_cuda.txt" 2>/dev/null || echo "(no output)"
  echo '```'
  echo
  if [ -f "$BENCH_DIR/report.md" ]; then
    sed 's/^# /## /; s/^## \([a-z]\)/### \1/' "$BENCH_DIR/report.md"
    echo
    echo "Rows: bench_kernels_cuda.csv; provenance: bench/provenance.json."
  else
    echo "## Benchmark"
    echo
    echo "(not run or failed)"
  fi
} > "$REPORT"
echo "wrote $REPORT"
if [ ${#FAILED[@]} -ne 0 ]; then
  echo "gpu_check: FAILED: ${FAILED[*]}"
  exit 1
fi
echo "gpu_check: all checks passed"
