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
 * Two execution paths run either kernel (moespec_cuda_tuning.path; docs/cuda.md):
 *   legacy  three launches: gate/up, down, then a deterministic gate-weighted sum over slots;
 *   fused   two launches: gate/up (writing h already rounded / quantized), then down with the sum
 *           over slots in the same kernel; weights stream through per-warp cp.async rings
 *           (sm_80+), and on sm_90+ the down kernel is launched with programmatic dependent
 *           launch so that it starts, and fetches its first weights, while gate/up finishes.
 * Every (token, slot) pair goes through the same sequence of floating-point operations in both
 * kernels and both paths, so all four give bitwise the same result for the same inputs.
 *
 * Non-finite inputs: a NaN or infinity anywhere in x[t, :] or gates[t, :] makes y[t, :] all NaN
 * (in every format; int8 too, whose quantization would otherwise hide it); other rows are
 * unaffected.
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
  MOESPEC_ERR_ALIGN = -8,      /* int8-block weights not 16-byte aligned */
  MOESPEC_ERR_TUNING = -9      /* a tuning value out of range (moespec_cuda_set_tuning) */
};

/* Execution paths (moespec_cuda_tuning.path). */
enum moespec_path { MOESPEC_PATH_AUTO = 0, MOESPEC_PATH_LEGACY = 1, MOESPEC_PATH_FUSED = 2 };

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

/* Process-wide launch choices (0 / -1 fields: the default). Defaults come from the environment
 * at the first call (MOESPEC_CUDA_PATH=auto|legacy|fused, MOESPEC_CUDA_PDL=auto|0|1), else auto.
 * Not for changing while another thread launches. */
typedef struct moespec_cuda_tuning {
  int path;             /* enum moespec_path; AUTO: fused wherever it applies (see the plan) */
  int pdl;              /* -1 auto (on for sm_90+), 0 off, 1 on (ignored below sm_90) */
  int ring_gu, ring_dn; /* fused: cp.async ring depth per warp in stages, 2..8 (0: chosen for the
                           weight bytes in flight per SM, docs/cuda.md; a depth given here is kept
                           where one block can have its shared memory) */
  int dn_warps;         /* fused: warps per down block, 1..8 (0: 4) */
  int gu_blocks_per_sm; /* both: gate/up row iterations are the most that leave this many blocks
                           per SM (0: 4) */
} moespec_cuda_tuning;
int moespec_cuda_set_tuning(const moespec_cuda_tuning* t);
void moespec_cuda_get_tuning(moespec_cuda_tuning* t);

/* How a call with these arguments would run on the current device (no launch): the path, the
 * two main grids, their dynamic shared memory, ring depths and whether PDL is used. */
typedef struct moespec_cuda_plan {
  int path;              /* MOESPEC_PATH_LEGACY or MOESPEC_PATH_FUSED */
  int launches;          /* kernel launches per call: 3 legacy, 2 fused */
  int tile;              /* tokens per dedup tile (1 for per-slot) */
  int grid_gu_x, grid_gu_y, iters_gu;
  int grid_dn_x, grid_dn_y, iters_dn, threads_dn;
  int smem_gu, smem_dn;  /* dynamic shared memory per block, bytes */
  int ring_gu, ring_dn;  /* fused: stages per warp ring */
  int pdl;               /* 1: the down kernel is a programmatic dependent launch */
} moespec_cuda_plan;
int moespec_cuda_get_plan(const moespec_expert_args* a, int kernel, moespec_cuda_plan* plan);

/* A human-readable message for a status code (static storage). */
const char* moespec_cuda_status_string(int status);

#ifdef __cplusplus
}
#endif

#endif /* MOESPEC_CUDA_H */
