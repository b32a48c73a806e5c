// expert_kernels.cu: per-slot and deduplicating CUDA kernels of the MoE expert operation, and
// their C launch API (moespec_cuda.h). Plain CUDA C++: no torch headers.
//
// Data flow of one call (both kernels, three launches):
//   1. gate_up_kernel: blocks over (tile, block of 16 x iters intermediate rows). A tile is one
//      (token, slot) pair for the per-slot kernel, or up to `tile` pairs routed to the same
//      expert for the dedup kernel. The block stages its tokens' activations in shared memory;
//      each warp streams gate and up rows once into registers and dots them with every token of
//      the tile, writing h[pair, i] = silu(gate_i . x) * (up_i . x) (fp32 scratch).
//   2. down_kernel: blocks over (tile, block of 32 x iters hidden rows); o[pair, j] = down_j . h[pair].
//      iters (1..8, per phase) is chosen at launch: the most row iterations that still leave four
//      blocks per SM, so that large grids stage each tile's activations fewer times.
//   3. combine_kernel: y[t, j] = sum_s g_ts * o[t*m + s, j], slots summed in order 0..m-1.
// The dedup kernel's routing prep (grouping pairs by expert) runs inside each gate/up block:
// a shared-memory histogram of ids, a warp scan over experts to find the block's (expert, tile)
// and a ballot pass that lists that expert's pairs in pair order; blocks of the first row block
// write the tile table that the down kernel reads. No extra launch, no host round trip.
#include "moespec_cuda.h"
#include "expert_common.cuh"

#include <limits.h>

#include <map>
#include <mutex>
#include <utility>

namespace moespec_cuda {

struct Params {
  int n, m, N, H, I, P, tile;
  int iters_gu, iters_dn;  // row iterations per block (rows per block = rows per iteration x iters)
  const float* x;
  const int64_t* ids;
  const float* gates;
  const void* wg;
  const void* wu;
  const void* wd;
  const float* sg;
  const float* su;
  const float* sd;
  float* y;
  float* h;    // [P, I] gate/up output per pair
  float* o;    // [P, H] down output per pair
  int* tiles;  // dedup tile table: [0] = number of tiles; tile w at 1 + w*(2+TILE_MAX): e, cnt, pairs
};

constexpr int kDescInts = 2 + MOESPEC_TILE_MAX;

// Expert id of pair q, or -1 if outside [0, N) (never used to address memory then).
__device__ inline int load_id(const Params& p, int q) {
  const long long e = (long long)__ldg(reinterpret_cast<const long long*>(p.ids) + q);
  return (e >= 0 && e < (long long)p.N) ? (int)e : -1;
}

__device__ inline float silu(float g) { return g / (1.f + expf(-g)); }

// The pairs one block works on.
struct Tile {
  int e;       // expert, -1: nothing to do
  int k;       // index of this tile among its expert's tiles
  int cnt;     // tokens in the tile
  int total;   // number of dedup tiles in the pass
  int pairs[MOESPEC_TILE_MAX];
};

// Dedup routing prep for tile w: group pairs by expert (experts in id order, pairs in pair order
// within an expert, `tile` pairs per tile). Every thread of the block must call it.
__device__ void resolve_dedup_tile(const Params& p, int w, int* hist, Tile& ts) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < p.N; e += blockDim.x) hist[e] = 0;
  if (tid == 0) { ts.e = -1; ts.cnt = 0; ts.total = 0; }
  __syncthreads();
  for (int q = tid; q < p.P; q += blockDim.x) {
    const int e = load_id(p, q);
    if (e >= 0) atomicAdd(&hist[e], 1);
  }
  __syncthreads();
  if (warp == 0) {
    // Exclusive scan of tiles per expert; lane L owns experts [L*per, (L+1)*per).
    const int per = (p.N + 31) / 32;
    const int e0 = min(lane * per, p.N), e1 = min(e0 + per, p.N);
    int local = 0;
    for (int e = e0; e < e1; ++e) local += (hist[e] + p.tile - 1) / p.tile;
    int incl = local;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    int base = incl - local;
    const int total = __shfl_sync(0xffffffffu, incl, 31);
    if (lane == 0) ts.total = total;
    for (int e = e0; e < e1; ++e) {
      const int nt = (hist[e] + p.tile - 1) / p.tile;
      if (w >= base && w < base + nt) {
        ts.e = e;
        ts.k = w - base;
        ts.cnt = min(p.tile, hist[e] - ts.k * p.tile);
      }
      base += nt;
    }
  }
  __syncthreads();
  if (ts.e < 0) return;  // block-uniform
  if (warp == 0) {
    // Stable listing: rank of each matching pair = matches before it (ballot + popc).
    const int e = ts.e, lo = ts.k * p.tile, hi = lo + ts.cnt;
    int seen = 0;
    for (int q0 = 0; q0 < p.P && seen < hi; q0 += 32) {
      const int q = q0 + lane;
      const bool match = q < p.P && load_id(p, q) == e;
      const unsigned b = __ballot_sync(0xffffffffu, match);
      const int rank = seen + __popc(b & ((1u << lane) - 1u));
      if (match && rank >= lo && rank < hi) ts.pairs[rank - lo] = q;
      seen += __popc(b);
    }
  }
  __syncthreads();
}

template <class F, int TMAX, bool VEC, bool DEDUP>
__global__ void __launch_bounds__(kThreads) gate_up_kernel(Params p) {
  extern __shared__ int4 smem4[];
  void* xs = smem4;  // staged activations (act_smem_bytes<F>(tile, H)), then the dedup histogram
  __shared__ Tile ts;
  const int w = blockIdx.x, rb = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int K = p.H;

  if constexpr (DEDUP) {
    int* hist = reinterpret_cast<int*>(reinterpret_cast<char*>(xs) + act_smem_bytes<F>(p.tile, K));
    resolve_dedup_tile(p, w, hist, ts);
    if (rb == 0) {  // publish the tile table for down_kernel
      if (w == 0 && tid == 0) p.tiles[0] = ts.total;
      if (ts.e >= 0) {
        int* d = p.tiles + 1 + (size_t)w * kDescInts;
        if (tid == 0) { d[0] = ts.e; d[1] = ts.cnt; }
        if (tid < ts.cnt) d[2 + tid] = ts.pairs[tid];
      }
    }
  } else {
    if (tid == 0) { ts.e = load_id(p, w); ts.cnt = 1; ts.pairs[0] = w; }
    __syncthreads();
  }
  if (ts.e < 0) return;  // block-uniform: no tile, or an invalid id (combine writes NaN)
  const int e = ts.e, T = ts.cnt;

  stage_acts<F, VEC>(xs, T, K, [&](int t, int k) {
    return __ldg(p.x + (size_t)(ts.pairs[t] / p.m) * K + k);
  });

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

  stage_acts<F, VEC>(xs, T, K, [&](int t, int k) { return p.h[(size_t)ts.pairs[t] * K + k]; });

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

// y[t, j] = sum_s g_ts o[t*m+s, j]; NaN where a slot's id is outside [0, N).
__global__ void __launch_bounds__(256) combine_kernel(Params p) {
  const size_t total = (size_t)p.n * p.H;
  for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (size_t)gridDim.x * blockDim.x) {
    const int t = (int)(idx / p.H), j = (int)(idx - (size_t)t * p.H);
    float acc = 0.f;
    bool bad = false;
    for (int s = 0; s < p.m; ++s) {
      const int q = t * p.m + s;
      if (load_id(p, q) < 0) { bad = true; continue; }
      const float g = p.gates ? __ldg(p.gates + q) : 1.f;
      acc = fmaf(g, p.o[(size_t)q * p.H + j], acc);
    }
    p.y[idx] = bad ? __int_as_float(0x7fc00000) : acc;
  }
}

// ---- host side ----------------------------------------------------------------------------
constexpr size_t kAlign = 256;
constexpr size_t kStaticSmemReserve = 1024;  // Tile and compiler-reserved static shared memory
inline size_t align_up(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

int check_args(const moespec_expert_args* a, int kernel) {
  if (!a) return MOESPEC_ERR_NULL;
  if (kernel != MOESPEC_SLOT && kernel != MOESPEC_DEDUP) return MOESPEC_ERR_FORMAT;
  if (a->w_fmt < MOESPEC_W_F32 || a->w_fmt > MOESPEC_W_I8B32) return MOESPEC_ERR_FORMAT;
  if (a->n < 0 || a->m < 1 || a->N < 1 || a->H < 1 || a->I < 1) return MOESPEC_ERR_SHAPE;
  if ((long long)a->n * a->m > INT_MAX / 2) return MOESPEC_ERR_SHAPE;
  if (a->w_fmt == MOESPEC_W_I8B32 && (a->H % kQBlock || a->I % kQBlock)) return MOESPEC_ERR_INT8_SHAPE;
  if ((a->I + kGuRowsPerIter - 1) / kGuRowsPerIter > 65535 ||
      (a->H + kDownRowsPerIter - 1) / kDownRowsPerIter > 65535)
    return MOESPEC_ERR_GRID;
  return MOESPEC_OK;
}

// Shared-memory bytes one token's activations of length K take in format w_fmt.
size_t act_bytes_per_token(int w_fmt, int K) {
  switch (w_fmt) {
    case MOESPEC_W_F32: return act_smem_bytes<FmtF32>(1, K);
    case MOESPEC_W_BF16: return act_smem_bytes<FmtBF16>(1, K);
    default: return act_smem_bytes<FmtI8B32>(1, K);
  }
}

// Tokens per tile: 1 for per-slot; for dedup MOESPEC_TILE_MAX, fewer only where a full tile's
// activations (plus the expert histogram) would not fit in the device's shared memory.
int tile_size(const moespec_expert_args* a, int kernel, int* tile) {
  int dev = 0, optin = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
  if (err != cudaSuccess) return (int)err;
  const size_t smem = (size_t)optin > kStaticSmemReserve ? (size_t)optin - kStaticSmemReserve : 0;
  const size_t hist = kernel == MOESPEC_DEDUP ? 4 * (size_t)a->N : 0;
  if (smem < hist) return MOESPEC_ERR_SMEM;
  size_t t = kernel == MOESPEC_DEDUP ? MOESPEC_TILE_MAX : 1;
  const size_t t_gu = (smem - hist) / act_bytes_per_token(a->w_fmt, a->H);
  const size_t t_dn = smem / act_bytes_per_token(a->w_fmt, a->I);
  if (t_gu < t) t = t_gu;
  if (t_dn < t) t = t_dn;
  if (t < 1) return MOESPEC_ERR_SMEM;
  *tile = (int)t;
  return MOESPEC_OK;
}

// Blocks along the tile axis: P pairs for per-slot; for dedup an upper bound on the tiles,
// sum_e ceil(c_e / tile) <= (P + U (tile - 1)) / tile with U <= min(N, P) distinct experts
// (blocks past the actual count exit at once).
size_t max_tiles(const moespec_expert_args* a, int kernel, int tile) {
  const size_t P = (size_t)a->n * a->m;
  if (kernel == MOESPEC_SLOT) return P;
  const size_t U = P < (size_t)a->N ? P : (size_t)a->N;
  const size_t bound = (P + U * (tile - 1)) / tile;
  return bound < P ? bound : P;
}

// Row iterations per block: every block stages (rounds / quantizes) its tile's activations once,
// so longer blocks amortize that; but the grid must keep every SM busy. Doubles the iterations
// while the grid still has at least kMinBlocksPerSm blocks per SM.
int row_iters(size_t tiles, int rows, int rows_per_iter, int sms) {
  int r = 1;
  while (r < kMaxRowIters) {
    const size_t blocks = tiles * (size_t)((rows + rows_per_iter * 2 * r - 1) / (rows_per_iter * 2 * r));
    if (blocks < (size_t)kMinBlocksPerSm * sms) break;
    r *= 2;
  }
  return r;
}

struct Workspace {
  size_t h, o, tiles, total;
};

Workspace layout(const moespec_expert_args* a, int kernel, int tile) {
  const size_t P = (size_t)a->n * a->m;
  Workspace w;
  w.h = 0;
  w.o = align_up(w.h + 4 * P * a->I);
  w.tiles = align_up(w.o + 4 * P * a->H);
  w.total = align_up(w.tiles + 4 * (1 + max_tiles(a, kernel, tile) * kDescInts));
  return w;
}

inline bool aligned16(const void* ptr) { return ((uintptr_t)ptr & 15u) == 0; }

// Above 48 KiB of dynamic shared memory a kernel must opt in, once per device: remembered per
// (kernel, device), so that repeated calls (and CUDA graph capture) make no attribute calls.
template <class Kern>
cudaError_t allow_smem(Kern kern, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, size_t> raised;
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = raised[{reinterpret_cast<const void*>(kern), dev}];
  if (have >= smem) return cudaSuccess;
  err = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess) have = smem;
  return err;
}

template <class Kern>
cudaError_t launch(Kern kern, dim3 grid, size_t smem, cudaStream_t stream, const Params& p) {
  cudaError_t err = allow_smem(kern, smem);
  if (err != cudaSuccess) return err;
  kern<<<grid, kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

template <class F, int TMAX, bool DEDUP, bool VEC_GU, bool VEC_DN>
int run(const Params& p, size_t ntiles, cudaStream_t stream) {
  const size_t smem_gu = act_smem_bytes<F>(p.tile, p.H) + (DEDUP ? 4 * (size_t)p.N : 0);
  const size_t smem_dn = act_smem_bytes<F>(p.tile, p.I);
  const dim3 grid_gu((unsigned)ntiles, (p.I + kGuRowsPerIter * p.iters_gu - 1) / (kGuRowsPerIter * p.iters_gu));
  const dim3 grid_dn((unsigned)ntiles, (p.H + kDownRowsPerIter * p.iters_dn - 1) / (kDownRowsPerIter * p.iters_dn));
  cudaError_t err = launch(gate_up_kernel<F, TMAX, VEC_GU, DEDUP>, grid_gu, smem_gu, stream, p);
  if (err == cudaSuccess) err = launch(down_kernel<F, TMAX, VEC_DN, DEDUP>, grid_dn, smem_dn, stream, p);
  if (err == cudaSuccess) {
    size_t blocks = ((size_t)p.n * p.H + 255) / 256;
    if (blocks > 4096) blocks = 4096;  // grid-stride loop covers the rest
    combine_kernel<<<(unsigned)blocks, 256, 0, stream>>>(p);
    err = cudaGetLastError();
  }
  return (int)err;
}

template <class F, int TMAX, bool DEDUP>
int run_vec(const moespec_expert_args* a, const Params& p, size_t ntiles, cudaStream_t stream) {
  if constexpr (F::kInt8) {
    // int8 has only the vector path (K is a multiple of 32, so every row is 32-byte aligned
    // when the matrix is 16-byte aligned; scales are read as floats).
    if (!aligned16(a->w_gate) || !aligned16(a->w_up) || !aligned16(a->w_down)) return MOESPEC_ERR_ALIGN;
    return run<F, TMAX, DEDUP, true, true>(p, ntiles, stream);
  } else {
    // 16-byte vector loads need whole chunks per row and aligned matrices; else the scalar path.
    const bool gu = p.H % F::CH == 0 && aligned16(a->w_gate) && aligned16(a->w_up);
    const bool dn = p.I % F::CH == 0 && aligned16(a->w_down);
    if (gu && dn) return run<F, TMAX, DEDUP, true, true>(p, ntiles, stream);
    if (gu) return run<F, TMAX, DEDUP, true, false>(p, ntiles, stream);
    if (dn) return run<F, TMAX, DEDUP, false, true>(p, ntiles, stream);
    return run<F, TMAX, DEDUP, false, false>(p, ntiles, stream);
  }
}

template <class F>
int run_fmt(const moespec_expert_args* a, int kernel, const Params& p, cudaStream_t stream) {
  const size_t ntiles = max_tiles(a, kernel, p.tile);
  return kernel == MOESPEC_DEDUP ? run_vec<F, MOESPEC_TILE_MAX, true>(a, p, ntiles, stream)
                                 : run_vec<F, 1, false>(a, p, ntiles, stream);
}

}  // namespace moespec_cuda

using namespace moespec_cuda;

extern "C" int moespec_cuda_workspace_bytes(const moespec_expert_args* a, int kernel, size_t* bytes) {
  int tile = 0;
  int st = check_args(a, kernel);
  if (!st) st = tile_size(a, kernel, &tile);
  if (st) return st;
  if (!bytes) return MOESPEC_ERR_NULL;
  *bytes = layout(a, kernel, tile).total;
  return MOESPEC_OK;
}

extern "C" int moespec_cuda_dedup_tile(const moespec_expert_args* a, int* tile) {
  if (!tile) return MOESPEC_ERR_NULL;
  int st = check_args(a, MOESPEC_DEDUP);
  if (!st) st = tile_size(a, MOESPEC_DEDUP, tile);
  return st;
}

extern "C" int moespec_cuda_expert_forward(const moespec_expert_args* a, int kernel,
                                           cudaStream_t stream) {
  int st = check_args(a, kernel);
  if (st) return st;
  if (a->n == 0) return MOESPEC_OK;  // empty pass: nothing to write
  if (!a->x || !a->ids || !a->w_gate || !a->w_up || !a->w_down || !a->y || !a->workspace)
    return MOESPEC_ERR_NULL;
  if (a->w_fmt == MOESPEC_W_I8B32 && (!a->s_gate || !a->s_up || !a->s_down)) return MOESPEC_ERR_NULL;
  int tile = 0, dev = 0, sms = 1;
  st = tile_size(a, kernel, &tile);
  if (st) return st;
  cudaError_t err = cudaGetDevice(&dev);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  if (err != cudaSuccess) return (int)err;
  const Workspace ws = layout(a, kernel, tile);
  if (a->workspace_bytes < ws.total) return MOESPEC_ERR_WORKSPACE;

  Params p;
  p.n = a->n; p.m = a->m; p.N = a->N; p.H = a->H; p.I = a->I; p.P = a->n * a->m; p.tile = tile;
  const size_t ntiles = max_tiles(a, kernel, tile);
  p.iters_gu = row_iters(ntiles, a->I, kGuRowsPerIter, sms);
  p.iters_dn = row_iters(ntiles, a->H, kDownRowsPerIter, sms);
  p.x = a->x;
  p.ids = a->ids;
  p.gates = a->gates;
  p.wg = a->w_gate; p.wu = a->w_up; p.wd = a->w_down;
  p.sg = a->s_gate; p.su = a->s_up; p.sd = a->s_down;
  p.y = a->y;
  char* base = static_cast<char*>(a->workspace);
  p.h = reinterpret_cast<float*>(base + ws.h);
  p.o = reinterpret_cast<float*>(base + ws.o);
  p.tiles = reinterpret_cast<int*>(base + ws.tiles);

  switch (a->w_fmt) {
    case MOESPEC_W_F32: return run_fmt<FmtF32>(a, kernel, p, stream);
    case MOESPEC_W_BF16: return run_fmt<FmtBF16>(a, kernel, p, stream);
    default: return run_fmt<FmtI8B32>(a, kernel, p, stream);
  }
}

extern "C" const char* moespec_cuda_status_string(int status) {
  switch (status) {
    case MOESPEC_OK: return "success";
    case MOESPEC_ERR_SHAPE: return "moespec_cuda: n, m, N, H or I out of range (need n >= 0, m, N, H, I >= 1)";
    case MOESPEC_ERR_FORMAT: return "moespec_cuda: unknown kernel or weight format";
    case MOESPEC_ERR_NULL: return "moespec_cuda: a required pointer is NULL (int8-block needs all scales)";
    case MOESPEC_ERR_INT8_SHAPE: return "moespec_cuda: int8-block format needs H and I multiples of 32";
    case MOESPEC_ERR_WORKSPACE: return "moespec_cuda: workspace smaller than moespec_cuda_workspace_bytes()";
    case MOESPEC_ERR_SMEM: return "moespec_cuda: H or I too large: one token's activations do not fit in shared memory";
    case MOESPEC_ERR_GRID: return "moespec_cuda: H or I too large for the launch grid";
    case MOESPEC_ERR_ALIGN: return "moespec_cuda: int8-block weights must be 16-byte aligned (fresh contiguous tensors are)";
    default: return status > 0 ? cudaGetErrorString((cudaError_t)status) : "moespec_cuda: unknown status";
  }
}
