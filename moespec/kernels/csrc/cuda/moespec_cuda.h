/* moespec_cuda.h: C launch API of moespec's CUDA expert kernels (plain CUDA, no torch).
 *
 * The expert operation of one MoE layer (paper 1, Section 1): for every token t of a pass of n
 * tokens and each of its m slots s (expert e = ids[t, s], gate weight g_ts),
 *
 *     y_t = sum_s g_ts * W_down[e] ( silu(W_gate[e] x_t) * W_up[e] x_t ).
 *
 * Two kernels compute the same function with different weight traffic:
 *   MOESPEC_SLOT  per-slot: a GEMV grid over (token, slot) pairs; every pair reads its expert's
 *                 weights (like llama.cpp mul_mv_id / MMVQ): n*m expert reads per pass.
 *   MOESPEC_DEDUP deduplicating: blocks over (expert, token tile of <= MOESPEC_TILE_MAX tokens);
 *                 each distinct expert is read once per tile and applied to all its tokens
 *                 (U expert reads per pass when no expert has more than a tile of tokens).
 * Both run gate/up, then down, then a deterministic gate-weighted sum over slots (three launches
 * each), and both give bitwise the same result for the same inputs: every (token, slot) pair is
 * computed by the same sequence of floating-point operations whichever kernel runs it.
 *
 * Layouts (all row-major, contiguous), as docs/kernels.md fixes them for every backend:
 *   x      [n, H]  float32
 *   ids    [n, m]  int64; an id outside [0, N) is never used to address memory: that token's
 *                  output row becomes NaN (callers validate ids first and raise)
 *   gates  [n, m]  float32, or NULL for all ones
 *   w_gate, w_up [N, I, H]; w_down [N, H, I] in format w_fmt:
 *     MOESPEC_W_F32   float32
 *     MOESPEC_W_BF16  bfloat16 (raw 16-bit patterns)
 *     MOESPEC_W_I8B32 int8 values q with one float32 scale per 32 consecutive values along the
 *                     reduction (last) dimension: w = q * s; scales s_gate, s_up [N, I, H/32],
 *                     s_down [N, H, I/32]. H and I must be multiples of 32.
 *                     Activations are quantized per 32-block too (docs/kernels.md), so block
 *                     sums are exact int32 (dp4a). Weights must be 16-byte aligned.
 *   f32 keeps activations in float32; bf16 rounds x and h = silu(g)*u to bfloat16 before the
 *   products; accumulation is float32 throughout.
 *   y      [n, H]  float32, written completely.
 *   workspace: device memory of moespec_cuda_workspace_bytes() bytes (scratch; no state kept).
 * All calls are asynchronous on `stream`; nothing here synchronizes the device.
 */
#ifndef MOESPEC_CUDA_H
#define MOESPEC_CUDA_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MOESPEC_TILE_MAX 9 /* tokens per dedup tile: one weight row serves up to 9 tokens */

enum moespec_kernel { MOESPEC_SLOT = 0, MOESPEC_DEDUP = 1 };
enum moespec_wfmt { MOESPEC_W_F32 = 0, MOESPEC_W_BF16 = 1, MOESPEC_W_I8B32 = 2 };

/* Status codes: 0 success; negative: bad arguments (see moespec_cuda_status_string);
 * positive: a cudaError_t returned by the CUDA runtime. */
enum moespec_status {
  MOESPEC_OK = 0,
  MOESPEC_ERR_SHAPE = -1,      /* n, m, N, H or I out of range */
  MOESPEC_ERR_FORMAT = -2,     /* unknown kernel or weight format */
  MOESPEC_ERR_NULL = -3,       /* a required pointer is NULL */
  MOESPEC_ERR_INT8_SHAPE = -4, /* int8-block format needs H and I multiples of 32 */
  MOESPEC_ERR_WORKSPACE = -5,  /* workspace smaller than moespec_cuda_workspace_bytes() */
  MOESPEC_ERR_SMEM = -6,       /* H or I too large for one token's activations in shared memory */
  MOESPEC_ERR_GRID = -7,       /* H or I too large for the launch grid */
  MOESPEC_ERR_ALIGN = -8       /* int8-block weights not 16-byte aligned */
};

typedef struct moespec_expert_args {
  int n, m, N, H, I;
  const float* x;
  const int64_t* ids;
  const float* gates; /* NULL: all ones */
  int w_fmt; /* enum moespec_wfmt */
  const void* w_gate;
  const void* w_up;
  const void* w_down;
  const float* s_gate; /* int8-block scales; NULL for f32 / bf16 */
  const float* s_up;
  const float* s_down;
  float* y;
  void* workspace;
  size_t workspace_bytes;
} moespec_expert_args;

/* Bytes of scratch device memory (*bytes) the kernel needs for these shapes on the current
 * device. Returns a status; checks the shapes and formats (not the pointers). */
int moespec_cuda_workspace_bytes(const moespec_expert_args* a, int kernel, size_t* bytes);

/* Tokens per dedup tile (*tile) on the current device for these shapes: MOESPEC_TILE_MAX,
 * smaller only where a full tile's activations would not fit in shared memory. */
int moespec_cuda_dedup_tile(const moespec_expert_args* a, int* tile);

/* Launch the expert operation with kernel MOESPEC_SLOT or MOESPEC_DEDUP on `stream`. */
int moespec_cuda_expert_forward(const moespec_expert_args* a, int kernel, cudaStream_t stream);

/* A human-readable message for a status code (static storage). */
const char* moespec_cuda_status_string(int status);

#ifdef __cplusplus
}
#endif

#endif /* MOESPEC_CUDA_H */
