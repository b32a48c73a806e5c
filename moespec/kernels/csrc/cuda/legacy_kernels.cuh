// legacy_kernels.cuh: the three-launch path (the kernels measured on an H200, docs/cuda.md, plus
// the non-finite input rule). Plain CUDA C++.
//   1. gate_up_kernel: blocks over (tile, block of 16 x iters intermediate rows). A tile is one
//      (token, slot) pair for the per-slot kernel, or up to `tile` pairs routed to the same
//      expert for the dedup kernel. The block stages its tokens' activations in shared memory;
//      each warp streams gate and up rows once into registers and dots them with every token of
//      the tile, writing h[pair, i] = silu(gate_i . x) * (up_i . x) (fp32 scratch).
//   2. down_kernel: blocks over (tile, block of 32 x iters hidden rows); o[pair, j] = down_j . h[pair].
//   3. combine_kernel: y[t, j] = sum_s g_ts * o[t*m + s, j], slots summed in order 0..m-1.
// The dedup kernel's routing prep runs inside each gate/up block (resolve_dedup_tile); blocks of
// the first row block write the tile table that the down kernel reads, and the non-finite flags
// of their pairs.
#ifndef MOESPEC_LEGACY_KERNELS_CUH
#define MOESPEC_LEGACY_KERNELS_CUH

#include "expert_params.cuh"

namespace moespec_cuda {

template <class F, int TMAX, bool VEC, bool DEDUP>
__global__ void __launch_bounds__(kThreads) gate_up_kernel(Params p) {
  extern __shared__ int4 smem4[];
  void* xs = smem4;  // staged activations (act_smem_bytes<F>(tile, H)), then the dedup histogram
  __shared__ Tile ts;
  __shared__ int flags[MOESPEC_TILE_MAX];
  const int w = blockIdx.x, rb = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int K = p.H;

  int* hist = reinterpret_cast<int*>(reinterpret_cast<char*>(xs) + act_smem_bytes<F>(p.tile, K));
  resolve_tile<DEDUP>(p, w, hist, ts, flags);
  if constexpr (DEDUP) {
    if (rb == 0) {  // publish the tile table for down_kernel
      if (w == 0 && tid == 0) p.tiles[0] = ts.total;
      if (ts.e >= 0) {
        int* d = p.tiles + 1 + (size_t)w * kDescInts;
        if (tid == 0) { d[0] = ts.e; d[1] = ts.cnt; }
        if (tid < ts.cnt) d[2 + tid] = ts.pairs[tid];
      }
    }
  }
  if (ts.e < 0) return;  // block-uniform: no tile, or an invalid id (combine writes NaN)
  const int e = ts.e, T = ts.cnt;

  stage_acts<F, VEC>(xs, T, K, [&](int t, int k) {
    return __ldg(p.x + (size_t)(ts.pairs[t] / p.m) * K + k);
  }, flags);
  if (rb == 0 && tid < T) p.flags[ts.pairs[tid]] = flags[tid];

  using W = typename F::T;
  const size_t mat = (size_t)p.I * K;
  const W* wg = reinterpret_cast<const W*>(p.wg) + (size_t)e * mat;
  const W* wu = reinterpret_cast<const W*>(p.wu) + (size_t)e * mat;
  const int nsb = K / kQBlock;  // scale blocks per row (int8 only)
  const float* sg = F::kInt8 ? p.sg + (size_t)e * p.I * nsb : nullptr;
  const float* su = F::kInt8 ? p.su + (size_t)e * p.I * nsb : nullptr;

  for (int it = 0; it < p.iters_gu; ++it) {
    const int i0 = (rb * p.iters_gu + it) * kGuRowsPerIter + warp * kGuRows;
    if (i0 >= p.I) break;  // warp-uniform
    RowRef<F> rows[2 * kGuRows];
#pragma unroll
    for (int r = 0; r < kGuRows; ++r) {
      const int i = min(i0 + r, p.I - 1);  // rows past the end recompute the last row, unwritten
      rows[2 * r] = {wg + (size_t)i * K, F::kInt8 ? sg + (size_t)i * nsb : nullptr};
      rows[2 * r + 1] = {wu + (size_t)i * K, F::kInt8 ? su + (size_t)i * nsb : nullptr};
    }
    float acc[2 * kGuRows][TMAX];
    dot_tile<F, 2 * kGuRows, TMAX, VEC>(rows, xs, K, T, lane, acc);
#pragma unroll
    for (int r = 0; r < kGuRows; ++r)
#pragma unroll
      for (int t = 0; t < TMAX; ++t)
        if (t < T && lane == ((r * TMAX + t) & 31) && i0 + r < p.I)
          p.h[(size_t)ts.pairs[t] * p.I + i0 + r] = silu(acc[2 * r][t]) * acc[2 * r + 1][t];
  }
}

template <class F, int TMAX, bool VEC, bool DEDUP>
__global__ void __launch_bounds__(kThreads) down_kernel(Params p) {
  extern __shared__ int4 smem4[];
  void* xs = smem4;
  __shared__ Tile ts;
  const int w = blockIdx.x, rb = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int K = p.I;

  if (tid == 0) {
    if constexpr (DEDUP) {
      ts.e = -1;
      if (w < p.tiles[0]) {
        const int* d = p.tiles + 1 + (size_t)w * kDescInts;
        ts.e = d[0];
        ts.cnt = d[1];
        for (int t = 0; t < ts.cnt; ++t) ts.pairs[t] = d[2 + t];
      }
    } else {
      ts.e = load_id(p, w); ts.cnt = 1; ts.pairs[0] = w;
    }
  }
  __syncthreads();
  if (ts.e < 0) return;
  const int e = ts.e, T = ts.cnt;

  stage_acts<F, VEC>(xs, T, K, [&](int t, int k) { return p.h[(size_t)ts.pairs[t] * K + k]; }, nullptr);

  using W = typename F::T;
  const W* wd = reinterpret_cast<const W*>(p.wd) + (size_t)e * p.H * K;
  const int nsb = K / kQBlock;
  const float* sd = F::kInt8 ? p.sd + (size_t)e * p.H * nsb : nullptr;

  for (int it = 0; it < p.iters_dn; ++it) {
    const int j0 = (rb * p.iters_dn + it) * kDownRowsPerIter + warp * kDownRows;
    if (j0 >= p.H) break;
    RowRef<F> rows[kDownRows];
#pragma unroll
    for (int r = 0; r < kDownRows; ++r) {
      const int j = min(j0 + r, p.H - 1);
      rows[r] = {wd + (size_t)j * K, F::kInt8 ? sd + (size_t)j * nsb : nullptr};
    }
    float acc[kDownRows][TMAX];
    dot_tile<F, kDownRows, TMAX, VEC>(rows, xs, K, T, lane, acc);
#pragma unroll
    for (int r = 0; r < kDownRows; ++r)
#pragma unroll
      for (int t = 0; t < TMAX; ++t)
        if (t < T && lane == ((r * TMAX + t) & 31) && j0 + r < p.H)
          p.o[(size_t)ts.pairs[t] * p.H + j0 + r] = acc[r][t];
  }
}

// y[t, j] = sum_s g_ts o[t*m+s, j]; NaN for a token with an invalid id or a non-finite input.
__global__ void __launch_bounds__(256) combine_kernel(Params p) {
  const size_t total = (size_t)p.n * p.H;
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const int t = (int)(idx / p.H), j = (int)(idx - (size_t)t * p.H);
    if (token_is_bad(p, t)) {
      p.y[idx] = nan_value();
      continue;
    }
    float acc = 0.f;
    for (int s = 0; s < p.m; ++s) {
      const int q = t * p.m + s;
      const float g = p.gates ? __ldg(p.gates + q) : 1.f;
      acc = fmaf(g, p.o[(size_t)q * p.H + j], acc);
    }
    p.y[idx] = acc;
  }
}

}  // namespace moespec_cuda

#endif  // MOESPEC_LEGACY_KERNELS_CUH
