#!/usr/bin/env bash
# gpu_check.sh: build, check and measure moespec's CUDA expert kernels on a machine with an NVIDIA
# GPU, in one run of a few minutes, and write a report (markdown + CSV) into one folder.
#
#   scripts/gpu_check.sh [OUT_DIR]
#
# OUT_DIR: where everything goes; default $OUT/<stamp> when $OUT is set (the lent machines copy
# $OUT back), else benchmarks/results/gpu/<stamp>, <stamp> = UTC time and GPU name. Copy a folder
# made under $OUT to benchmarks/results/gpu/ and commit it.
# Steps, most important first, each printed as it starts (log: OUT_DIR/gpu_check.log), each with
# a time limit so the whole run stays within minutes (GPU_CHECK_QUICK=1 trims the measurements):
#   1. GPU (nvidia-smi, clocks and power to nvidia_smi.txt) and CUDA toolkit (nvcc);
#   2. torch-free (nvcc and the GPU only; runs where no CUDA torch is installed):
#      a. the standalone harness (tools/standalone_check.cu): every case on every execution path
#         (legacy, fused, fused without PDL) against a host reference, all bitwise equal;
#      b. the standalone benchmark (tools/bench_standalone.cu) at every preset of
#         moespec.model_shapes.PRESETS (read with plain python3), all formats, n = 1..9, protocol rotate,
#         variants legacy / fused / fused-nopdl / fused-graph -> bench_standalone.csv;
#      c. the cache protocols side by side at OLMoE (flush, clean, rotate) -> bench_protocols.csv;
#      d. a tuning sweep of the fused path at OLMoE and Qwen3 -> bench_sweep.csv;
#   3. Python: $GPU_CHECK_PYTHON if set (an interpreter that already has a CUDA torch and moespec's
#      dependencies; moespec is taken from the checkout via PYTHONPATH), else the repo's .venv via
#      `make install`; if that torch is CPU-only, replace it by the CUDA build of torch 2.13.0 for
#      nvcc's CUDA version (needs network; TORCH_CUDA_INDEX=cu128 overrides the tag). Without a
#      usable torch, steps 4-6 are skipped (reported as not run);
#   4. build the CUDA extension (moespec.kernels.build.load_cuda, into build/);
#   5. the CUDA tests (pytest -m cuda; files: $GPU_CHECK_TESTS);
#   6. the torch benchmark (benchmarks/bench_kernels_cuda.py: our kernels on both paths, CUDA-graph
#      replay, the torch peers: per-expert matmuls and torch._grouped_mm; extra args:
#      $GPU_CHECK_BENCH_ARGS) -> bench_kernels_cuda.csv; then the expert layers of a verify pass
#      (benchmarks/bench_layers_cuda.py: OLMoE's 16 layers, replayed routing, eager and CUDA
#      graph) -> layers/;
#   7. OUT_DIR/REPORT.md: goals met or short (from every benchmark CSV), tables, test results.
# GPU_CHECK_SKIP_STANDALONE=1 skips step 2, GPU_CHECK_SKIP_BENCH=1 every benchmark. A failed
# check does not stop the later steps: the report says what failed and the script exits 1 at the
# end. A missing GPU or toolkit stops it at once with the reason.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
STAMP=$(date -u +%Y%m%dT%H%MZ)
if [ -n "${1:-}" ]; then
  OUT_DIR=$1
elif [ -n "${OUT:-}" ]; then
  OUT_DIR=$OUT/$STAMP
else
  OUT_DIR=benchmarks/results/gpu/$STAMP
fi
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
exec > >(tee -a "$OUT_DIR/gpu_check.log") 2>&1

T0=$(date +%s)
step() { printf '\n=== [%s, +%ss] %s\n' "$(date -u +%H:%M:%S)" "$(( $(date +%s) - T0 ))" "$*"; }
die() { printf '\ngpu_check: ERROR: %s\n' "$*" >&2; exit 1; }
on_error() { printf '\ngpu_check: stopped (exit %s) at line %s: %s\n' "$1" "$2" "$3" >&2; }
trap 'on_error $? $LINENO "$BASH_COMMAND"' ERR

FAILED=()
failed_list() { local IFS=';' joined; joined="${FAILED[*]}"; echo "${joined//;/; }"; }
# limited LIMIT_S CMD...: run CMD with a time limit (exit 124 on timeout, named in the log)
limited() {
  local lim=$1; shift
  local rc=0
  timeout --signal=TERM --kill-after=10 "$lim" "$@" || rc=$?
  [ "$rc" -ne 124 ] || printf 'gpu_check: time limit of %ss reached: %s\n' "$lim" "$*"
  return "$rc"
}
QUICK=${GPU_CHECK_QUICK:-0}
if [ "$QUICK" = 1 ]; then REPS=10; NS=1,2,4,8,9; else REPS=30; NS=1,2,3,4,5,6,7,8,9; fi
echo "gpu_check: repo $ROOT, output $OUT_DIR (reps $REPS, n in $NS)"

# --- 1. GPU and toolkit -------------------------------------------------------------------
step "1/7 GPU and CUDA toolkit"
command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: no NVIDIA driver on this machine"
nvidia-smi -L || die "nvidia-smi lists no GPU"
GPU_QUERY=$(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | head -n 1) \
  || die "nvidia-smi cannot query the GPU"
echo "GPU 0: $GPU_QUERY"
nvidia-smi -q -d CLOCK,POWER,PERFORMANCE > "$OUT_DIR/nvidia_smi.txt" 2>&1 || true
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

# --- 2. torch-free harness and benchmarks ------------------------------------------------
step "2/7 torch-free: standalone harness and benchmarks"
SM=sm_$(echo "$COMPUTE_CAP" | tr -d .)
SHAPES=""
if [ "${GPU_CHECK_SKIP_STANDALONE:-0}" = 1 ]; then
  echo "skipped (GPU_CHECK_SKIP_STANDALONE=1)"
else
  mkdir -p "$ROOT/build"
  CUDA_SRC=moespec/kernels/csrc/cuda
  KOBJ="$ROOT/build/expert_kernels_$SM.o"
  HARNESS_BIN="$ROOT/build/standalone_check"
  BENCH_BIN="$ROOT/build/bench_standalone"
  if limited 300 "$NVCC" -std=c++17 -O3 -arch="$SM" -I"$CUDA_SRC" -c "$CUDA_SRC/expert_kernels.cu" -o "$KOBJ" \
     && limited 120 "$NVCC" -std=c++17 -O2 -arch="$SM" -I"$CUDA_SRC" "$CUDA_SRC/tools/standalone_check.cu" "$KOBJ" \
          -o "$HARNESS_BIN" \
     && limited 120 "$NVCC" -std=c++17 -O3 -arch="$SM" -I"$CUDA_SRC" "$CUDA_SRC/tools/bench_standalone.cu" "$KOBJ" \
          -o "$BENCH_BIN"; then
    echo "--- 2a harness"
    if limited 240 "$HARNESS_BIN" | tee "$OUT_DIR/standalone_check.txt"; [ "${PIPESTATUS[0]}" -eq 0 ]; then :; else
      FAILED+=("standalone harness"); fi
    if [ "${GPU_CHECK_SKIP_BENCH:-0}" = 1 ]; then
      echo "standalone benchmarks skipped (GPU_CHECK_SKIP_BENCH=1)"
    elif ! SHAPES=$(PYTHONPATH="$ROOT" python3 -c 'from moespec.model_shapes import PRESETS; print(" ".join(
        f"{k}:{s.num_experts},{s.hidden_size},{s.expert_intermediate},{s.top_k}" for k, s in PRESETS.items()))'); then
      FAILED+=("standalone benchmarks (python3 cannot read moespec.model_shapes.PRESETS)")
    else
      echo "shapes: $SHAPES"
      OLMOE=$(echo "$SHAPES" | tr ' ' '\n' | grep '^olmoe:' || true)
      QWEN=$(echo "$SHAPES" | tr ' ' '\n' | grep '^qwen3:' || true)
      echo "--- 2b every preset, protocol rotate, all variants"
      # shellcheck disable=SC2086
      if limited 300 "$BENCH_BIN" "$OUT_DIR/bench_standalone.csv" --reps "$REPS" --ns "$NS" --protocols rotate \
           $SHAPES | tee "$OUT_DIR/bench_standalone.md"; [ "${PIPESTATUS[0]}" -eq 0 ]; then :; else
        FAILED+=("standalone benchmark"); fi
      echo "--- 2c cache protocols at OLMoE"
      if [ -n "$OLMOE" ] && limited 120 "$BENCH_BIN" "$OUT_DIR/bench_protocols.csv" --reps "$REPS" --ns 1,2,8 \
           --protocols flush,clean,rotate --variants legacy,fused "$OLMOE" | tee "$OUT_DIR/bench_protocols.md"; \
         [ "${PIPESTATUS[0]}" -eq 0 ]; then :; else FAILED+=("standalone protocol comparison"); fi
      echo "--- 2d tuning sweep of the fused path"
      # shellcheck disable=SC2086
      if limited 180 "$BENCH_BIN" "$OUT_DIR/bench_sweep.csv" --sweep --reps "$REPS" --ns 1,2,8 --protocols rotate \
           $OLMOE $QWEN | tee "$OUT_DIR/bench_sweep.md"; [ "${PIPESTATUS[0]}" -eq 0 ]; then :; else
        FAILED+=("standalone tuning sweep"); fi
    fi
  else
    FAILED+=("standalone harness and benchmarks (compile)")
  fi
fi

# --- 3. Python with a CUDA build of torch -------------------------------------------------
step "3/7 Python environment"
PY_OK=1
PY_WHY=""
skip_py() { PY_WHY=$1; printf 'gpu_check: Python/torch unusable: %s\n' "$1"; }
# Returns 1 (after skip_py names the reason) at the first missing piece. Called in a condition,
# so set -e is off inside: every check returns explicitly.
setup_python() {
  if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    PY=$GPU_CHECK_PYTHON
    [ -x "$PY" ] || PY=$(command -v "$PY" || true)
    [ -n "$PY" ] || { skip_py "GPU_CHECK_PYTHON=$GPU_CHECK_PYTHON is not an executable"; return 1; }
    export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    echo "using $PY (GPU_CHECK_PYTHON), moespec from $ROOT via PYTHONPATH"
  else
    echo "make install (creates .venv and installs the pinned dependencies if missing; needs network the first time)"
    make install || { skip_py "make install failed (no network? set GPU_CHECK_PYTHON to an interpreter with a CUDA torch 2.13.0)"; return 1; }
    PY="$ROOT/.venv/bin/python"
  fi
  TORCH_CUDA=$("$PY" -c 'import torch; print(torch.version.cuda or "")') || { skip_py "$PY cannot import torch"; return 1; }
  if [ -z "$TORCH_CUDA" ]; then
    [ -z "${GPU_CHECK_PYTHON:-}" ] || { skip_py "torch under $PY is CPU-only; install a CUDA build of torch 2.13.0 there"; return 1; }
    TAG=${TORCH_CUDA_INDEX:-cu$(echo "$CUDA_VER" | tr -d .)}
    echo "torch is CPU-only: replacing it by torch==2.13.0+$TAG from https://download.pytorch.org/whl/$TAG"
    "$ROOT/.venv/bin/pip" uninstall -y torch || { skip_py "cannot uninstall the CPU-only torch"; return 1; }
    "$ROOT/.venv/bin/pip" install --disable-pip-version-check "torch==2.13.0+$TAG" \
        --index-url "https://download.pytorch.org/whl/$TAG" --extra-index-url https://pypi.org/simple \
      || { skip_py "installing torch 2.13.0+$TAG failed; set TORCH_CUDA_INDEX to a tag that exists (e.g. cu128) and matches nvcc's major version"; return 1; }
    TORCH_CUDA=$("$PY" -c 'import torch; print(torch.version.cuda or "")')
    [ -n "$TORCH_CUDA" ] || { skip_py "torch is still CPU-only after the install"; return 1; }
  fi
  "$PY" -c '
import torch
print(f"torch {torch.__version__}, built for CUDA {torch.version.cuda}, GPU available: {torch.cuda.is_available()}")
assert torch.cuda.is_available(), "torch.cuda.is_available() is False (driver too old for this torch build?)"
print("device 0:", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
' || { skip_py "torch cannot use the GPU (see above)"; return 1; }
  if [ "${TORCH_CUDA%%.*}" != "${CUDA_VER%%.*}" ]; then
    skip_py "torch is built for CUDA $TORCH_CUDA but nvcc is CUDA $CUDA_VER: torch.utils.cpp_extension refuses a different major version; install the matching torch wheel (TORCH_CUDA_INDEX) or toolkit"
    return 1
  fi
  "$PY" -c 'import moespec, numpy, pandas, psutil, pytest; import pynvml' \
    || { skip_py "moespec or its dependencies (numpy, pandas, psutil, pytest, nvidia-ml-py) do not import under $PY"; return 1; }
}
if ! setup_python; then
  PY_OK=0
  FAILED+=("Python/torch environment ($PY_WHY); steps 4-6 not run")
fi

# --- 4. build the extension ---------------------------------------------------------------
step "4/7 build the CUDA extension (ninja, into build/)"
# A CXX that links libstdc++ statically into shared libraries makes every C++ exception of the ops
# (each bad-input check) crash the process (seen on a lent H200 machine, whose CXX was such a
# wrapper); moespec.kernels.build refuses it, and here the system g++ takes over when present.
if [ "$PY_OK" = 1 ]; then
  CXX_PROBLEM=$("$PY" -c 'from moespec.kernels import build; print(build.cxx_runtime_problem() or "")' || true)
  if [ -n "$CXX_PROBLEM" ] && [ -x /usr/bin/g++ ] && [ "${CXX:-}" != /usr/bin/g++ ]; then
    echo "gpu_check: $CXX_PROBLEM -- using CXX=/usr/bin/g++ CC=/usr/bin/gcc instead"
    export CXX=/usr/bin/g++ CC=/usr/bin/gcc
  fi
fi
echo "C++ compiler for the extensions: ${CXX:-c++}"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$COMPUTE_CAP}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
EXT_OK=0
if [ "$PY_OK" != 1 ]; then
  echo "skipped: no usable Python/torch"
elif MOESPEC_BUILD_VERBOSE=1 limited 600 "$PY" -c '
from moespec.kernels import build
build.load_cuda()
import torch
print("registered:", torch.ops.moespec.expert_slot, torch.ops.moespec.expert_dedup)
'; then
  EXT_OK=1
else
  FAILED+=("CUDA extension build (compiler output in the log); steps 5-6 not run")
fi

# --- 5. CUDA tests ------------------------------------------------------------------------
step "5/7 CUDA tests"
TESTS=${GPU_CHECK_TESTS:-tests/test_kernels_cuda.py tests/test_kernels_correctness.py tests/test_kernels_nonfinite.py tests/test_cuda_compile.py}
# shellcheck disable=SC2086
if [ "$EXT_OK" != 1 ]; then
  echo "skipped: no usable Python/torch or extension"
elif limited 420 "$PY" -m pytest -q -m cuda -rA --junitxml="$OUT_DIR/pytest_cuda.xml" $TESTS 2>&1 \
       | tee "$OUT_DIR/pytest_cuda.txt"; [ "${PIPESTATUS[0]}" -eq 0 ]; then :; else FAILED+=("CUDA tests"); fi

# --- 6. torch benchmark with the peers ----------------------------------------------------
step "6/7 torch benchmark (both paths, CUDA graphs, torch peers)"
BENCH_DIR="$OUT_DIR/bench"
if [ "${GPU_CHECK_SKIP_BENCH:-0}" = 1 ] || [ "$EXT_OK" != 1 ]; then
  echo "skipped (GPU_CHECK_SKIP_BENCH=1, or no usable Python/torch or extension)"
else
  # shellcheck disable=SC2086
  if limited 420 "$PY" benchmarks/bench_kernels_cuda.py --out "$BENCH_DIR" --reps "$REPS" --ns "$NS" --graph \
       ${GPU_CHECK_BENCH_ARGS:-}; then :; else FAILED+=("torch benchmark"); fi
  [ -f "$BENCH_DIR/rows.csv" ] && cp "$BENCH_DIR/rows.csv" "$OUT_DIR/bench_kernels_cuda.csv"
  echo "--- 6b the expert layers of a verify pass (OLMoE, bf16, eager and CUDA graph)"
  if limited 240 "$PY" benchmarks/bench_layers_cuda.py --out "$OUT_DIR/layers" --ns "$NS" --windows 4 \
       --reps "$([ "$QUICK" = 1 ] && echo 5 || echo 10)"; then :; else FAILED+=("layer-stack benchmark"); fi
fi

# --- 7. report ----------------------------------------------------------------------------
step "7/7 report"
REPORT="$OUT_DIR/REPORT.md"
SUMMARY_PY=${PY:-python3}
[ "$PY_OK" = 1 ] || SUMMARY_PY=python3
summary() {  # the goals and tables of one benchmark CSV (stdlib only)
  if [ -s "$1" ]; then
    "$SUMMARY_PY" benchmarks/bench_kernels_cuda.py --summarize "$1" | sed 's/^# /### /; s/^## /#### /' \
      || echo "(summary of $1 failed)"
  else
    echo "(not run or failed)"
  fi
}
{
  echo "# moespec GPU check"
  echo
  echo "- date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ); duration $(( $(date +%s) - T0 )) s"
  echo "- host: $(hostname)"
  echo "- GPU 0: $GPU_QUERY (clocks and power: nvidia_smi.txt)"
  if [ "$PY_OK" = 1 ]; then
    echo "- nvcc: CUDA $CUDA_VER; torch: $("$PY" -c 'import torch; print(torch.__version__)') (CUDA $TORCH_CUDA); C++ compiler for the extensions: ${CXX:-c++}"
  else
    echo "- nvcc: CUDA $CUDA_VER; torch: not usable ($PY_WHY)"
  fi
  if COMMIT=$(git rev-parse HEAD 2>/dev/null); then
    git diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT (with uncommitted changes)"
  else
    COMMIT="unknown (no git checkout)"
  fi
  echo "- commit: $COMMIT"
  echo "- measurements: $REPS repetitions, n in {$NS}"
  echo "- result: $([ ${#FAILED[@]} -eq 0 ] && echo 'all checks passed' || echo "FAILED: $(failed_list)")"
  echo
  echo "## Standalone harness (torch-free; every case on every path)"
  echo
  echo '```'
  if [ -s "$OUT_DIR/standalone_check.txt" ]; then grep -v '^ok  ' "$OUT_DIR/standalone_check.txt" || true; \
    echo "($(grep -c '^ok  ' "$OUT_DIR/standalone_check.txt") checks ok; all lines: standalone_check.txt)"; else echo "(not run)"; fi
  echo '```'
  echo
  echo "## Standalone benchmark: every preset, protocol rotate (bench_standalone.csv)"
  echo
  summary "$OUT_DIR/bench_standalone.csv"
  echo
  echo "## Cache protocols at OLMoE (bench_protocols.csv)"
  echo
  summary "$OUT_DIR/bench_protocols.csv"
  echo
  echo "## Tuning sweep of the fused path (bench_sweep.csv; table: bench_sweep.md)"
  echo
  if [ -s "$OUT_DIR/bench_sweep.md" ]; then grep '^|' "$OUT_DIR/bench_sweep.md" || true; else echo "(not run or failed)"; fi
  echo
  echo "## CUDA tests"
  echo
  echo '```'
  if [ -s "$OUT_DIR/pytest_cuda.txt" ]; then tail -n 40 "$OUT_DIR/pytest_cuda.txt"; else echo "(not run)"; fi
  echo '```'
  echo
  echo "## Expert layers of a verify pass (layers/rows.csv)"
  echo
  if [ -s "$OUT_DIR/layers/report.md" ]; then sed 's/^# /### /' "$OUT_DIR/layers/report.md"; else echo "(not run or failed)"; fi
  echo
  if [ -f "$BENCH_DIR/report.md" ]; then
    echo "## Torch benchmark with the peers (bench_kernels_cuda.csv; provenance: bench/provenance.json)"
    echo
    sed 's/^# /### /; s/^## /#### /' "$BENCH_DIR/report.md"
  else
    echo "## Torch benchmark"
    echo
    if [ -s "$OUT_DIR/bench_kernels_cuda.csv" ]; then summary "$OUT_DIR/bench_kernels_cuda.csv"; else echo "(not run or failed)"; fi
  fi
} > "$REPORT"
echo "wrote $REPORT ($(( $(date +%s) - T0 )) s in all)"
if [ ${#FAILED[@]} -ne 0 ]; then
  echo "gpu_check: FAILED: $(failed_list)"
  exit 1
fi
echo "gpu_check: all checks passed"
