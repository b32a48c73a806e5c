// fused_kernels.cuh: the two-launch path (docs/cuda.md, "The fused path"). Plain CUDA C++, sm_80+.
//
//   1. gate_up_ring_kernel: blocks over (tile, 16 x iters intermediate rows), as the legacy
//      gate/up kernel, but each warp streams its 2 gate + 2 up rows through a cp.async ring
//      (Ring), issuing the first stages *before* the block stages its activations, so that the
//      activation loads (L2) overlap the weights' first HBM round trip; activations are staged
//      with 16-byte loads, four in flight per thread. It writes h already in the precision the
//      down product uses (float32; bf16 bits; int8 blocks with their scales, which needs blocks
//      of 32 rows: iters is even for int8), and the non-finite flags of its pairs.
//   2. down_combine_kernel: one block per 2 x warps hidden rows, over *all* tiles of the pass
//      (per-slot: every pair; dedup: pairs grouped by expert, up to `tile` per tile): each warp
//      streams its 2 down rows of every tile's expert through its ring and reads the tiles'
//      activations from L2; the per-pair results stay in shared memory and the block then sums
//      each token's slots in order 0..m-1 and writes its rows of y. No third launch, no
//      atomics. Its prologue (tile list from the ids, the first weight stages) does not read
//      anything gate/up writes, so on sm_90 it is a programmatic dependent launch: pdl_wait()
//      comes after the prologue.
// Per (pair, row) the arithmetic is the legacy kernels' (same chunks per lane in the same order,
// same butterfly, same combine order), so the fused and legacy paths agree bitwise.
//
// The down kernel keeps every piece of shared state in dynamic shared memory: under the CPU
// emulation its blocks are alive together (parked at pdl_wait) while gate/up runs.
#ifndef MOESPEC_FUSED_KERNELS_CUH
#define MOESPEC_FUSED_KERNELS_CUH

#include "expert_params.cuh"

namespace moespec_cuda {

constexpr int kFusedGuRows = 2 * kGuRows;  // row streams per gate/up warp: 2 gate + 2 up rows
constexpr int kFusedDnRows = 2;            // down rows per warp
constexpr int kFusedMaxPairs = 1024;       // larger passes take the legacy path (per-pair results in smem)
constexpr int kMaxDnWarps = 8;

template <class F>
using GuRing = Ring<F, kFusedGuRows, 1>;
template <class F>
using DnRing = Ring<F, kFusedDnRows, F::kInt8 ? 1 : 2>;

__host__ __device__ inline size_t align16(size_t v) { return (v + 15) / 16 * 16; }

// Dynamic shared memory of the fused gate/up kernel: per-warp rings, the tile's activations,
// (int8) the block's h values before quantization, (dedup) the expert histogram and the pass's ids.
struct GuLayout {
  size_t acts, hbuf, hist, ids, total;
};
template <class F>
__host__ __device__ inline GuLayout gu_layout(int ring, int tile, int H, int N, int P, int rows_per_block, bool dedup) {
  GuLayout L;
  L.acts = (size_t)kWarps * ring * GuRing<F>::kStageBytes;
  L.hbuf = align16(L.acts + act_ring_bytes<F>(tile, H));
  L.hist = align16(L.hbuf + (F::kInt8 ? 4 * (size_t)tile * rows_per_block : 0));
  L.ids = L.hist + (dedup ? 4 * (size_t)N : 0);
  L.total = L.ids + (dedup ? 4 * (size_t)P : 0);
  return L;
}

// Dynamic shared memory of the down + combine kernel: per-warp rings, per-pair results of the
// block's rows, the tile list (expert, first position, count per tile; pairs by position; count),
// per-token NaN marks, (dedup) per-expert counts and cursors, and the pass's ids.
struct DnLayout {
  size_t obuf, tiles, bad, work, total;
};
template <class F>
__host__ __device__ inline DnLayout dn_layout(int ring, int warps, int P, int n, int N, bool dedup) {
  DnLayout L;
  L.obuf = (size_t)warps * ring * DnRing<F>::kStageBytes;
  L.tiles = align16(L.obuf + 4 * (size_t)P * warps * kFusedDnRows);
  L.bad = align16(L.tiles + 4 * (4 * (size_t)P + 1));
  L.work = align16(L.bad + 4 * (size_t)n);
  L.total = L.work + (dedup ? 8 * (size_t)N + 4 * (size_t)P : 0);
  return L;
}

// ---- 1. gate/up --------------------------------------------------------------------------
template <class F, int TMAX, bool DEDUP>
__global__ void __launch_bounds__(kThreads) gate_up_ring_kernel(Params p) {
  extern __shared__ int4 smem4[];
  __shared__ Tile ts;
  __shared__ int flags[MOESPEC_TILE_MAX];
  const int w = blockIdx.x, rb = blockIdx.y;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int K = p.H, S = p.ring_gu, rows_blk = kGuRowsPerIter * p.iters_gu, row0 = rb * rows_blk;
  char* sm = reinterpret_cast<char*>(smem4);
  const GuLayout L = gu_layout<F>(S, p.tile, K, p.N, p.P, rows_blk, DEDUP);
  const GuRing<F> ring{sm + (size_t)warp * S * GuRing<F>::kStageBytes};
  void* xs = sm + L.acts;

  pdl_launch_dependents();  // the down kernel may be scheduled once every gate/up block runs
  // dedup: the ids staged in shared memory first, one round instead of several dependent ones
  resolve_tile<DEDUP>(p, w, reinterpret_cast<int*>(sm + L.hist), ts, flags, reinterpret_cast<int*>(sm + L.ids));
  if (ts.e < 0) return;  // block-uniform: no tile, or an invalid id (the down kernel writes NaN)
  const int e = ts.e, T = ts.cnt;

  using W = typename F::T;
  const size_t mat = (size_t)p.I * K;
  const W* wg = reinterpret_cast<const W*>(p.wg) + (size_t)e * mat;
  const W* wu = reinterpret_cast<const W*>(p.wu) + (size_t)e * mat;
  const int nsb = K / kQBlock;
  const float* sg = F::kInt8 ? p.sg + (size_t)e * p.I * nsb : nullptr;
  const float* su = F::kInt8 ? p.su + (size_t)e * p.I * nsb : nullptr;
  // This warp's row iterations: rows row0 + 16 it + 2 warp + {0, 1} while inside I.
  int its = 0;
  while (its < p.iters_gu && row0 + its * kGuRowsPerIter + warp * kGuRows < p.I) ++its;
  const int nch = K / F::CH, spi = (nch + 31) / 32, nst = its * spi;
  auto rows_of = [&](int it, RowRef<F> (&rows)[kFusedGuRows]) {
    const int i0 = row0 + it * kGuRowsPerIter + warp * kGuRows;
#pragma unroll
    for (int r = 0; r < kGuRows; ++r) {
      const int i = min(i0 + r, p.I - 1);  // rows past the end recompute the last row, unwritten
      rows[2 * r] = {wg + (size_t)i * K, F::kInt8 ? sg + (size_t)i * nsb : nullptr};
      rows[2 * r + 1] = {wu + (size_t)i * K, F::kInt8 ? su + (size_t)i * nsb : nullptr};
    }
  };
  auto issue = [&](int g) {
    if (g < nst) {
      RowRef<F> rows[kFusedGuRows];
      rows_of(g / spi, rows);
      ring.issue(g % S, rows, (g % spi) * 32 + lane, nch, lane);
    } else {
      ring.issue_none();
    }
  };
  // Weights first: S - 1 stages in flight before the activations are even loaded.
  for (int g = 0; g < S - 1; ++g) issue(g);
  stage_x_vec<F>(xs, T, K, [&](int t) { return p.x + (size_t)(ts.pairs[t] / p.m) * K; }, flags);
  if (rb == 0 && tid < T) p.flags[ts.pairs[tid]] = flags[tid];

  const int4* xq4 = reinterpret_cast<const int4*>(xs);
  const float* xsa = reinterpret_cast<const float*>(reinterpret_cast<const int8_t*>(xs) + (size_t)T * K);
  float* hbuf = reinterpret_cast<float*>(sm + L.hbuf);
  float acc[kFusedGuRows][TMAX];
  for (int g = 0; g < nst; ++g) {
    issue(g + S - 1);
    cp_async_wait(S - 1);  // stage g has landed (this lane's copies; each lane reads only its own)
    const int it = g / spi, k = g % spi;
    if (k == 0) zero_acc(acc);
    if constexpr (F::kInt8) {
      ring_dot<F, kFusedGuRows, 1, TMAX>(ring, g % S, k * 32 + lane, nch, T, lane,
          [&](int t, int c, int4& a0, int4& a1, float& sa) {
            a0 = xq4[(t * 2 + 0) * nch + c];
            a1 = xq4[(t * 2 + 1) * nch + c];
            sa = xsa[t * nch + c];
          }, acc);
    } else {
      ring_dot<F, kFusedGuRows, 1, TMAX>(ring, g % S, k * 32 + lane, nch, T, lane,
          [&](int t, int c, float (&xv)[F::CH]) {
            if constexpr (F::CH == 4) {
              const float4 v = reinterpret_cast<const float4*>(xs)[(size_t)t * nch + c];
              xv[0] = v.x; xv[1] = v.y; xv[2] = v.z; xv[3] = v.w;
            } else {
              F::unpack(reinterpret_cast<const uint4*>(xs)[(size_t)t * nch + c], xv);
            }
          }, acc);
    }
    if (k == spi - 1) {
      warp_reduce(acc, T);
      const int i0 = row0 + it * kGuRowsPerIter + warp * kGuRows;
#pragma unroll
      for (int r = 0; r < kGuRows; ++r)
#pragma unroll
        for (int t = 0; t < TMAX; ++t)
          if (t < T && lane == ((r * TMAX + t) & 31) && i0 + r < p.I) {
            const float hv = silu(acc[2 * r][t]) * acc[2 * r + 1][t];
            const size_t at = (size_t)ts.pairs[t] * p.I + i0 + r;
            if constexpr (F::kInt8) hbuf[t * rows_blk + (i0 + r - row0)] = hv;
            else if constexpr (sizeof(W) == 4) static_cast<float*>(p.hs)[at] = hv;
            else static_cast<uint16_t*>(p.hs)[at] = float_to_bf16_bits(hv);
          }
    }
  }
  if constexpr (F::kInt8) {
    // Quantize the block's h rows in blocks of 32 (the block's rows are whole blocks: rows_blk is
    // a multiple of 32 and so is I), exactly as the legacy down kernel stages them.
    __syncthreads();
    const int nb = (min(p.I, row0 + rows_blk) - row0) / kQBlock;
    int8_t* hq = static_cast<int8_t*>(p.hs);
    float* hsc = reinterpret_cast<float*>(hq + (size_t)p.P * p.I);
    for (int wb = warp; wb < T * nb; wb += kWarps) {
      const int t = wb / nb, b = wb - t * nb;
      const float v = hbuf[t * rows_blk + b * kQBlock + lane];
      float amax = fabsf(v);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      const float sa = act_scale(amax);
      const int pair = ts.pairs[t], i = row0 + b * kQBlock + lane;
      hq[(size_t)pair * p.I + i] = (int8_t)act_quant(v, act_inv(sa));
      if (lane == 0) hsc[(size_t)pair * (p.I / kQBlock) + i / kQBlock] = sa;
    }
  }
}

// ---- 2. down + combine -------------------------------------------------------------------
// The pass's tiles in shared memory: te[w] expert (-1: skip), ts0[w] first position, tc[w]
// count, sorted[position] = pair, sorted[4P] (i.e. tl[4P]) the number of tiles. Per-slot: tile
// w = pair w. Dedup: experts in id order, `tile` pairs per tile; within an expert the pairs come
// in the order the shared-memory atomics hand out (results per pair do not depend on it).
// Reads only ids. Ends with a barrier.
template <bool DEDUP>
__device__ inline void build_tile_list(const Params& p, int* tl, int* work) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, P = p.P;
  int *te = tl, *ts0 = tl + P, *tc = tl + 2 * P, *sorted = tl + 3 * P;
  if constexpr (!DEDUP) {
    for (int q = tid; q < P; q += blockDim.x) {
      te[q] = load_id(p, q);
      ts0[q] = q;
      tc[q] = 1;
      sorted[q] = q;
    }
    if (tid == 0) tl[4 * P] = P;
    __syncthreads();
  } else {
    int *cnt = work, *cur = work + p.N, *sids = work + 2 * p.N;
    for (int e = tid; e < p.N; e += blockDim.x) cnt[e] = 0;
    for (int q = tid; q < P; q += blockDim.x) sids[q] = load_id(p, q);
    __syncthreads();
    for (int q = tid; q < P; q += blockDim.x) {
      const int e = sids[q];
      if (e >= 0) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (warp == 0) {
      // Exclusive scans of pairs and of tiles over experts; lane L owns experts [L*per, (L+1)*per).
      const int per = (p.N + 31) / 32;
      const int e0 = min(lane * per, p.N), e1 = min(e0 + per, p.N);
      int lp = 0, lt = 0;
      for (int e = e0; e < e1; ++e) {
        lp += cnt[e];
        lt += (cnt[e] + p.tile - 1) / p.tile;
      }
      int ip = lp, it = lt;
#pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const int vp = __shfl_up_sync(0xffffffffu, ip, off), vt = __shfl_up_sync(0xffffffffu, it, off);
        if (lane >= off) { ip += vp; it += vt; }
      }
      int bp = ip - lp, bt = it - lt;
      for (int e = e0; e < e1; ++e) {
        cur[e] = bp;
        for (int k = 0; k * p.tile < cnt[e]; ++k, ++bt) {
          te[bt] = e;
          ts0[bt] = bp + k * p.tile;
          tc[bt] = min(p.tile, cnt[e] - k * p.tile);
        }
        bp += cnt[e];
      }
      if (lane == 31) tl[4 * P] = it;
    }
    __syncthreads();
    for (int q = tid; q < P; q += blockDim.x) {
      const int e = sids[q];
      if (e >= 0) sorted[atomicAdd(&cur[e], 1)] = q;
    }
    __syncthreads();
  }
}

template <class F, int TMAX, bool DEDUP>
__global__ void __launch_bounds__(kMaxDnWarps * 32) down_combine_kernel(Params p) {
  extern __shared__ int4 smem4[];
  constexpr int U = F::kInt8 ? 1 : 2;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const int K = p.I, S = p.ring_dn, RB = nw * kFusedDnRows, j0 = blockIdx.x * RB, P = p.P;
  char* sm = reinterpret_cast<char*>(smem4);
  const DnLayout L = dn_layout<F>(S, nw, P, p.n, p.N, DEDUP);
  const DnRing<F> ring{sm + (size_t)warp * S * DnRing<F>::kStageBytes};
  float* obuf = reinterpret_cast<float*>(sm + L.obuf);  // [P][RB] per-pair results of the block's rows
  int* tl = reinterpret_cast<int*>(sm + L.tiles);
  int* bad = reinterpret_cast<int*>(sm + L.bad);

  build_tile_list<DEDUP>(p, tl, reinterpret_cast<int*>(sm + L.work));
  const int *te = tl, *ts0 = tl + P, *tc = tl + 2 * P, *sorted = tl + 3 * P;
  const int ntiles = tl[4 * P];
  const int nch = K / F::CH, spt = (nch + 32 * U - 1) / (32 * U), nst = ntiles * spt;

  using W = typename F::T;
  const int nsb = K / kQBlock;
  auto issue = [&](int g) {
    const int e = g < nst ? te[g / spt] : -1;
    if (e >= 0) {
      RowRef<F> rows[kFusedDnRows];
#pragma unroll
      for (int r = 0; r < kFusedDnRows; ++r) {
        const int j = min(j0 + warp * kFusedDnRows + r, p.H - 1);  // rows past H: computed, unused
        const size_t row = (size_t)e * p.H + j;
        rows[r] = {reinterpret_cast<const W*>(p.wd) + row * K, F::kInt8 ? p.sd + row * nsb : nullptr};
      }
      ring.issue(g % S, rows, (g % spt) * 32 * U + lane, nch, lane);
    } else {
      ring.issue_none();
    }
  };
  for (int g = 0; g < S - 1; ++g) issue(g);
  pdl_wait();  // from here on: gate/up's h and flags are complete and visible

  // Activations: h of the tile's pairs, in L2 (written by gate/up), read around L1.
  const int8_t* hq = static_cast<const int8_t*>(p.hs);
  const float* hsc = reinterpret_cast<const float*>(hq + (size_t)P * K);
  float acc[kFusedDnRows][TMAX];
  for (int g = 0; g < nst; ++g) {
    issue(g + S - 1);
    cp_async_wait(S - 1);
    const int w = g / spt, k = g % spt;
    if (te[w] < 0) continue;  // an invalid id: no tile (warp-uniform)
    const int T = tc[w];
    const int* pairs = sorted + ts0[w];
    if (k == 0) zero_acc(acc);
    if constexpr (F::kInt8) {
      ring_dot<F, kFusedDnRows, U, TMAX>(ring, g % S, k * 32 * U + lane, nch, T, lane,
          [&](int t, int c, int4& a0, int4& a1, float& sa) {
            const int4* src = reinterpret_cast<const int4*>(hq + (size_t)pairs[t] * K) + 2 * c;
            a0 = __ldcg(src);
            a1 = __ldcg(src + 1);
            sa = __ldcg(hsc + (size_t)pairs[t] * nsb + c);
          }, acc);
    } else {
      ring_dot<F, kFusedDnRows, U, TMAX>(ring, g % S, k * 32 * U + lane, nch, T, lane,
          [&](int t, int c, float (&xv)[F::CH]) {
            const uint4 r = __ldcg(reinterpret_cast<const uint4*>(static_cast<const W*>(p.hs) + (size_t)pairs[t] * K) + c);
            if constexpr (F::CH == 4) {
              xv[0] = __uint_as_float(r.x); xv[1] = __uint_as_float(r.y);
              xv[2] = __uint_as_float(r.z); xv[3] = __uint_as_float(r.w);
            } else {
              F::unpack(r, xv);
            }
          }, acc);
    }
    if (k == spt - 1) {
      warp_reduce(acc, T);
#pragma unroll
      for (int r = 0; r < kFusedDnRows; ++r)
#pragma unroll
        for (int t = 0; t < TMAX; ++t)
          if (t < T && lane == ((r * TMAX + t) & 31)) obuf[(size_t)pairs[t] * RB + warp * kFusedDnRows + r] = acc[r][t];
    }
  }
  for (int t = tid; t < p.n; t += blockDim.x) bad[t] = token_is_bad(p, t);
  __syncthreads();
  // y[t, j] = sum_s g_ts o[t*m + s, j], slots in order (the legacy combine's arithmetic).
  for (int idx = tid; idx < p.n * RB; idx += blockDim.x) {
    const int t = idx / RB, rr = idx - t * RB, j = j0 + rr;
    if (j >= p.H) continue;
    float acc1 = 0.f;
    if (bad[t]) {
      acc1 = nan_value();
    } else {
      for (int s = 0; s < p.m; ++s) {
        const int q = t * p.m + s;
        const float gt = p.gates ? __ldg(p.gates + q) : 1.f;
        acc1 = fmaf(gt, obuf[(size_t)q * RB + rr], acc1);
      }
    }
    p.y[(size_t)t * p.H + j] = acc1;
  }
}

}  // namespace moespec_cuda

#endif  // MOESPEC_FUSED_KERNELS_CUH
