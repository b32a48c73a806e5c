// expert_params.cuh: what every kernel of one call shares: the launch parameters, the routing of
// pairs to tiles, and the per-token checks (invalid ids, non-finite inputs) that decide which
// output rows become NaN. Plain CUDA C++.
#ifndef MOESPEC_EXPERT_PARAMS_CUH
#define MOESPEC_EXPERT_PARAMS_CUH

#include "moespec_cuda.h"
#include "expert_common.cuh"

namespace moespec_cuda {

struct Params {
  int n, m, N, H, I, P, tile;
  int iters_gu, iters_dn;  // row iterations per block (rows per block = rows per iteration x iters)
  int ring_gu, ring_dn;    // fused path: cp.async stages per warp ring
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
  float* h;    // legacy: [P, I] float32 gate/up output per pair
  void* hs;    // fused (same memory as h): h in the format's precision: float32 [P, I] | bf16
               // bits [P, I] | int8 [P, I] followed by float32 scales [P, I/32]
  float* o;    // legacy: [P, H] down output per pair
  int* tiles;  // legacy dedup tile table: [0] = number of tiles; tile w at 1 + w*(2+TILE_MAX): e, cnt, pairs
  int* flags;  // [P]: 1 when the pair's token has a non-finite value in x (written by gate/up)
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
// within an expert, `tile` pairs per tile). id(q): pair q's expert or -1 (load_id from global
// memory, or ids the block staged in shared memory). Every thread of the block must call it.
template <class Id>
__device__ inline void resolve_dedup_tile(const Params& p, int w, int* hist, Tile& ts, Id id) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int e = tid; e < p.N; e += blockDim.x) hist[e] = 0;
  if (tid == 0) { ts.e = -1; ts.cnt = 0; ts.total = 0; }
  __syncthreads();
  for (int q = tid; q < p.P; q += blockDim.x) {
    const int e = id(q);
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
      const bool match = q < p.P && id(q) == e;
      const unsigned b = __ballot_sync(0xffffffffu, match);
      const int rank = seen + __popc(b & ((1u << lane) - 1u));
      if (match && rank >= lo && rank < hi) ts.pairs[rank - lo] = q;
      seen += __popc(b);
    }
  }
  __syncthreads();
}

// The gate/up block's tile: per-slot, pair w; dedup, the w-th (expert, token group). Every thread
// calls it; it ends with a barrier. Zeroes flags[0..MOESPEC_TILE_MAX) (shared memory) for the
// staging that follows. sids: null (dedup reads the ids from global memory, several dependent
// rounds) or shared memory for P ints, into which the ids are staged first (one round).
template <bool DEDUP>
__device__ inline void resolve_tile(const Params& p, int w, int* hist, Tile& ts, int* flags, int* sids = nullptr) {
  if (threadIdx.x < MOESPEC_TILE_MAX) flags[threadIdx.x] = 0;
  if constexpr (DEDUP) {
    if (sids) {
      for (int q = threadIdx.x; q < p.P; q += blockDim.x) sids[q] = load_id(p, q);
      __syncthreads();
      resolve_dedup_tile(p, w, hist, ts, [&](int q) { return sids[q]; });
    } else {
      resolve_dedup_tile(p, w, hist, ts, [&](int q) { return load_id(p, q); });
    }
  } else {
    if (threadIdx.x == 0) { ts.e = load_id(p, w); ts.cnt = 1; ts.pairs[0] = w; ts.total = p.P; }
    __syncthreads();
  }
}

// Whether token t's output row is NaN: an expert id outside [0, N), a non-finite gate, or a
// non-finite value in x (flags, written by gate/up for the valid pairs only).
__device__ inline bool token_is_bad(const Params& p, int t) {
  for (int s = 0; s < p.m; ++s) {
    const int q = t * p.m + s;
    if (load_id(p, q) < 0) return true;
    if (p.gates && !isfinite(__ldg(p.gates + q))) return true;
  }
  for (int s = 0; s < p.m; ++s)
    if (__ldcg(p.flags + t * p.m + s)) return true;  // L2: written by the previous kernel
  return false;
}

__device__ inline float nan_value() { return __int_as_float(0x7fc00000); }

}  // namespace moespec_cuda

#endif  // MOESPEC_EXPERT_PARAMS_CUH
