// expert_common.cuh: storage formats, activation staging and the multi-token dot-product
// micro-kernel shared by the per-slot and the deduplicating CUDA kernels (plain CUDA C++).
//
// Numerics follow docs/kernels.md exactly, as the CPU kernels do:
//   f32      weights and activations float32, float32 accumulation;
//   bf16     activations (x, then h) rounded to bfloat16 (nearest even) before the products,
//            float32 accumulation (bf16 x bf16 products are exact in float32);
//   int8_b32 activations quantized per block of 32 along the reduction dimension
//            (sa = max|a| / 127, qa = rint(a * (1 / sa)) clamped to +-127, sa = 0 for a zero
//            block), block sums of q_w * q_a exact in int32 (dp4a), then
//            acc += float(isum) * (s_w * sa).
//
// Why one micro-kernel for both kernels: the per-slot kernel is the deduplicating one with a tile
// of one token, so both compute every (token, slot) pair with the same floating-point operations
// in the same order, and their outputs agree bitwise. They differ only in weight traffic.
#ifndef MOESPEC_EXPERT_COMMON_CUH
#define MOESPEC_EXPERT_COMMON_CUH

#include <math.h>
#include <stdint.h>
#include <type_traits>
#include <cuda_runtime.h>

#include "async_copy.cuh"

namespace moespec_cuda {

constexpr int kWarps = 8;                 // warps per block
constexpr int kThreads = kWarps * 32;
constexpr int kGuRows = 2;                // gate/up rows per warp group (x2 matrices = 4 dots)
constexpr int kDownRows = 4;              // down rows per warp group
constexpr int kGuRowsPerIter = kWarps * kGuRows;      // 16 gate/up rows per block and row iteration
constexpr int kDownRowsPerIter = kWarps * kDownRows;  // 32 down rows per block and row iteration
constexpr int kMaxRowIters = 8;           // row iterations per block: chosen at launch, 1..8
constexpr int kMinBlocksPerSm = 4;        // ... as many as leave at least this many blocks per SM
constexpr int kQBlock = 32;               // int8-block format: one scale per 32 values

// ---- scalar conversions (host and device: the standalone harness reuses them) --------------
// The 32 bits of a float as an unsigned integer, or back (the device's intrinsics; a copy on the host).
template <typename To, typename From>
__host__ __device__ inline To bits_as(From v) {
  static_assert(sizeof(To) == 4 && sizeof(From) == 4, "bits_as: 32-bit values");
#ifdef __CUDA_ARCH__
  if constexpr (std::is_same<To, float>::value) return __uint_as_float(v);
  else return __float_as_uint(v);
#else
  To out;
  __builtin_memcpy(&out, &v, 4);
  return out;
#endif
}

__host__ __device__ inline float bits_to_float(uint32_t u) { return bits_as<float>(u); }
__host__ __device__ inline uint32_t float_to_bits(float f) { return bits_as<uint32_t>(f); }

__host__ __device__ inline float bf16_bits_to_float(uint32_t bits16) {
  return bits_to_float(bits16 << 16);  // bf16 is the top half of an IEEE float32: exact
}

// Round to nearest even, NaN kept NaN (as torch and the CPU kernels round float -> bfloat16).
__host__ __device__ inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

__host__ __device__ inline float round_bf16(float f) { return bf16_bits_to_float(float_to_bf16_bits(f)); }

// int8 activation quantization of one value given its block's amax (docs/kernels.md).
__host__ __device__ inline float act_scale(float amax) { return amax / 127.0f; }
__host__ __device__ inline float act_inv(float scale) { return scale > 0.f ? 1.0f / scale : 0.f; }
// NaN (from a non-finite value in the block) becomes 0 instead of an undefined conversion; the
// kernels then write NaN over that token's whole output row (non-finite inputs, docs/cuda.md).
__host__ __device__ inline int act_quant(float v, float inv) {
  float q = rintf(v * inv);  // round half to even
  q = q < -127.f ? -127.f : (q > 127.f ? 127.f : q);
  return q == q ? (int)q : 0;
}

#ifdef __CUDACC__
// ---- storage formats ---------------------------------------------------------------------
// CH: values per lane per chunk (16 bytes for f32 / bf16, one 32-value block = 32 bytes for int8);
// kPiece: bytes of one chunk of one weight row; U: chunks per loop iteration of the legacy
// micro-kernel (all their loads issued before any is used).
struct FmtF32 {
  using T = float;
  static constexpr int CH = 4, U = 2, kPiece = 16;
  static constexpr bool kInt8 = false;
  __device__ static inline float round_act(float v) { return v; }
  __device__ static inline void unpack(const uint4& r, float (&w)[CH]) {
    w[0] = __uint_as_float(r.x); w[1] = __uint_as_float(r.y);
    w[2] = __uint_as_float(r.z); w[3] = __uint_as_float(r.w);
  }
  __device__ static inline float load1(const T* row, int k) { return __ldg(row + k); }
};

struct FmtBF16 {
  using T = uint16_t;
  static constexpr int CH = 8, U = 2, kPiece = 16;
  static constexpr bool kInt8 = false;
  __device__ static inline float round_act(float v) { return round_bf16(v); }
  __device__ static inline void unpack(const uint4& r, float (&w)[CH]) {
    const uint32_t v[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      w[2 * i] = __uint_as_float(v[i] << 16);              // element 2i (low half)
      w[2 * i + 1] = __uint_as_float(v[i] & 0xffff0000u);  // element 2i + 1 (high half)
    }
  }
  __device__ static inline float load1(const T* row, int k) { return bf16_bits_to_float(__ldg(row + k)); }
};

struct FmtI8B32 {
  using T = int8_t;
  static constexpr int CH = kQBlock, U = 1, kPiece = kQBlock;
  static constexpr bool kInt8 = true;
};

// One weight row of one expert: values and (int8 only) its K/32 scales.
template <class F>
struct RowRef {
  const typename F::T* w;
  const float* s;
};

// ---- the arithmetic of one chunk (shared by every path, so that all compute the same bits) ----
// f32 / bf16: acc[j][t] += w[j][i] * x[i] for i = 0..CH-1, one fused multiply-add each, in order.
template <int NW, int CH, int TMAX>
__device__ __forceinline__ void fma_chunk(const float (&wv)[NW][CH], const float (&xv)[CH], int t,
                                          float (&acc)[NW][TMAX]) {
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int i = 0; i < CH; ++i) acc[j][t] = fmaf(wv[j][i], xv[i], acc[j][t]);
}

// int8: the exact int32 sum of one 32-value block (weights w0|w1, activations a0|a1), 8 dp4a.
__device__ __forceinline__ int dp4a_block(const int4& w0, const int4& w1, const int4& a0, const int4& a1) {
  int isum = 0;
  isum = __dp4a(w0.x, a0.x, isum);
  isum = __dp4a(w0.y, a0.y, isum);
  isum = __dp4a(w0.z, a0.z, isum);
  isum = __dp4a(w0.w, a0.w, isum);
  isum = __dp4a(w1.x, a1.x, isum);
  isum = __dp4a(w1.y, a1.y, isum);
  isum = __dp4a(w1.z, a1.z, isum);
  isum = __dp4a(w1.w, a1.w, isum);
  return isum;
}

// int8: acc[j][t] += isum_j * (s_w[j] * s_a) for one block of every row.
template <int NW, int TMAX>
__device__ __forceinline__ void dp4a_chunk(const int4 (&raw)[NW][2], const float (&sw)[NW], const int4& a0,
                                           const int4& a1, float sa, int t, float (&acc)[NW][TMAX]) {
#pragma unroll
  for (int j = 0; j < NW; ++j)
    acc[j][t] = fmaf((float)dp4a_block(raw[j][0], raw[j][1], a0, a1), sw[j] * sa, acc[j][t]);
}

// Butterfly over the warp: every lane ends with the totals of the first T tokens.
template <int NW, int TMAX>
__device__ __forceinline__ void warp_reduce(float (&acc)[NW][TMAX], int T) {
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int t = 0; t < TMAX; ++t) {
      if (t >= T) break;
      float v = acc[j][t];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      acc[j][t] = v;
    }
}

template <int NW, int TMAX>
__device__ __forceinline__ void zero_acc(float (&acc)[NW][TMAX]) {
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int t = 0; t < TMAX; ++t) acc[j][t] = 0.f;
}

// Shared-memory bytes of the staged activations of T tokens of length K (legacy layouts).
template <class F>
__host__ __device__ inline size_t act_smem_bytes(int T, int K) {
  return F::kInt8 ? (size_t)T * K + 4 * (size_t)T * (K / kQBlock) : 4 * (size_t)T * K;
}

// Layouts in shared memory.
// f32/bf16, vector path: token t's K floats as CH/4 planes of float4, plane q holding values
// 4q..4q+3 of every chunk, so 32 lanes reading consecutive chunks read consecutive float4s
// (no bank conflicts). Scalar path: plain [T][K].
// int8: quantized values as 2 planes of 16-byte pieces ([t][plane][chunk]) then the float
// block scales [T][K/32].
template <class F>
__device__ inline int xs_index(int t, int k, int K) {
  const int nch = K / F::CH;
  const int c = k / F::CH, q = (k % F::CH) / 4, r = k % 4;
  return ((t * (F::CH / 4) + q) * nch + c) * 4 + r;
}
__device__ inline int xq_index(int t, int k, int K) {
  const int nch = K / kQBlock;
  const int c = k / kQBlock, q = (k % kQBlock) / 16, r = k % 16;
  return ((t * 2 + q) * nch + c) * 16 + r;
}

// Stage T rows of activations (value of token t at k: load(t, k)) in the format's precision.
// flags (shared memory, may be null): flags[t] set to 1 when token t has a non-finite value
// (the caller zeroes them and reads them after the barrier this ends with). Every thread of the
// block calls it.
template <class F, bool VEC, class Load>
__device__ inline void stage_acts(void* smem, int T, int K, Load load, int* flags) {
  if constexpr (F::kInt8) {
    int8_t* xq = reinterpret_cast<int8_t*>(smem);
    float* xsa = reinterpret_cast<float*>(xq + (size_t)T * K);
    const int nblk = K / kQBlock, lane = threadIdx.x & 31;
    // one warp per (token, block): lane = position in the block
    for (int wb = threadIdx.x >> 5; wb < T * nblk; wb += blockDim.x >> 5) {
      const int t = wb / nblk, b = wb - t * nblk, k = b * kQBlock + lane;
      const float v = load(t, k);
      if (flags && !isfinite(v)) flags[t] = 1;
      float amax = fabsf(v);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
      const float sa = act_scale(amax);
      xq[xq_index(t, k, K)] = (int8_t)act_quant(v, act_inv(sa));
      if (lane == 0) xsa[t * nblk + b] = sa;
    }
  } else {
    float* xs = reinterpret_cast<float*>(smem);
    for (int idx = threadIdx.x; idx < T * K; idx += blockDim.x) {
      const int t = idx / K, k = idx - t * K;
      const float v = load(t, k);
      if (flags && !isfinite(v)) flags[t] = 1;
      xs[VEC ? xs_index<F>(t, k, K) : idx] = F::round_act(v);
    }
  }
  __syncthreads();
}

// The legacy micro-kernel: NW weight rows dotted with the staged activations of T <= TMAX tokens.
// Each lane loads each of its weight chunks once, into registers, and applies it to every token
// of the tile; per-lane partial sums are then reduced across the warp (every lane ends with the
// totals). Per token the sequence of operations depends neither on T nor on TMAX, and it is the
// one of the fused path's ring consumer (ring_dot): lane L takes chunks L, L + 32, L + 64, ...
template <class F, int NW, int TMAX, bool VEC>
__device__ __forceinline__ void dot_tile(const RowRef<F> (&rows)[NW], const void* __restrict__ smem,
                                         int K, int T, int lane, float (&acc)[NW][TMAX]) {
  zero_acc(acc);
  if constexpr (F::kInt8) {
    // One 32-value block per lane per step: two 16-byte loads per row, 8 dp4a per token.
    const int nch = K / kQBlock;
    const int4* xq4 = reinterpret_cast<const int4*>(smem);
    const float* xsa = reinterpret_cast<const float*>(reinterpret_cast<const int8_t*>(smem) + (size_t)T * K);
    for (int c = lane; c < nch; c += 32) {
      int4 raw[NW][2];
      float sw[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        const int4* p = reinterpret_cast<const int4*>(rows[j].w) + 2 * c;
        raw[j][0] = __ldg(p);
        raw[j][1] = __ldg(p + 1);
        sw[j] = __ldg(rows[j].s + c);
      }
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t >= T) break;
        dp4a_chunk(raw, sw, xq4[(t * 2 + 0) * nch + c], xq4[(t * 2 + 1) * nch + c], xsa[t * nch + c], t, acc);
      }
    }
  } else if constexpr (VEC) {
    constexpr int CH = F::CH, NQ = CH / 4, U = F::U;
    const int nch = K / CH;
    const float4* xs4 = reinterpret_cast<const float4*>(smem);
    for (int c0 = lane; c0 < nch; c0 += 32 * U) {
      uint4 raw[U][NW];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
        if (c < nch) {
#pragma unroll
          for (int j = 0; j < NW; ++j) raw[u][j] = __ldg(reinterpret_cast<const uint4*>(rows[j].w) + c);
        }
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int c = c0 + 32 * u;
        if (c >= nch) break;
        float wv[NW][CH];
#pragma unroll
        for (int j = 0; j < NW; ++j) F::unpack(raw[u][j], wv[j]);
#pragma unroll
        for (int t = 0; t < TMAX; ++t) {
          if (t >= T) break;
          float xv[CH];
#pragma unroll
          for (int q = 0; q < NQ; ++q) {
            const float4 v = xs4[(t * NQ + q) * nch + c];
            xv[4 * q] = v.x; xv[4 * q + 1] = v.y; xv[4 * q + 2] = v.z; xv[4 * q + 3] = v.w;
          }
          fma_chunk(wv, xv, t, acc);
        }
      }
    }
  } else {
    // Scalar path (f32/bf16 with a reduction length or a pointer that rules out 16-byte loads):
    // lane handles values k = lane + 32 i; activations in plain [T][K] layout.
    const float* xs = reinterpret_cast<const float*>(smem);
    for (int k = lane; k < K; k += 32) {
      float wv[NW][1];
#pragma unroll
      for (int j = 0; j < NW; ++j) wv[j][0] = F::load1(rows[j].w, k);
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t >= T) break;
        const float xv[1] = {xs[t * K + k]};
        fma_chunk(wv, xv, t, acc);
      }
    }
  }
  warp_reduce(acc, T);
}

// ---- the fused path: a per-warp ring of cp.async stages -------------------------------------
// Each warp streams its own weight rows through S stages of shared memory: stage g holds, for
// every one of its NW rows, U chunks per lane (chunks c = 32 (U g' + u) + lane of the row, g' the
// stage's index within the row). A lane copies and later reads only its own pieces, so the ring
// needs no barrier; issuing stage g + S - 1 before consuming stage g keeps S - 1 stages (NW x U x
// 512 bytes each, 2x for int8) in flight per warp while the warp computes.
// Slot layout: [u][j][lane] pieces of F::kPiece bytes, then (int8) [u][j][lane] float scales.
template <class F, int NW, int U>
struct Ring {
  static constexpr int kStageBytes = U * NW * 32 * (F::kPiece + (F::kInt8 ? 4 : 0));
  char* base;  // this warp's S slots

  __device__ char* piece(int slot, int u, int j, int lane) const {
    return base + (size_t)slot * kStageBytes + ((u * NW + j) * 32 + lane) * F::kPiece;
  }
  __device__ float* scale(int slot, int u, int j, int lane) const {
    return reinterpret_cast<float*>(base + (size_t)slot * kStageBytes + U * NW * 32 * F::kPiece) +
           (u * NW + j) * 32 + lane;
  }
  // Copies of chunks c0 + 32 u (u < U, c < nch) of every row into `slot`, committed as one group.
  __device__ __forceinline__ void issue(int slot, const RowRef<F> (&rows)[NW], int c0, int nch, int lane) const {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u;
      if (c >= nch) break;
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        const char* src = reinterpret_cast<const char*>(rows[j].w) + (size_t)c * F::kPiece;
        char* dst = piece(slot, u, j, lane);
        cp_async16(dst, src);
        if constexpr (F::kInt8) {
          cp_async16(dst + 16, src + 16);
          cp_async4(scale(slot, u, j, lane), rows[j].s + c);
        }
      }
    }
    cp_async_commit();
  }
  // An empty group past the end of the stream, so that group counting stays uniform.
  __device__ __forceinline__ void issue_none() const { cp_async_commit(); }
};

// Consume one ring stage: chunks c0 + 32 u of NW rows against T tokens' activations; act(t, c, ...)
// fills the activation chunk of token t (f32 / bf16: CH floats; int8: a0, a1 and the scale).
template <class F, int NW, int U, int TMAX, class Act>
__device__ __forceinline__ void ring_dot(const Ring<F, NW, U>& ring, int slot, int c0, int nch, int T, int lane,
                                         Act act, float (&acc)[NW][TMAX]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = c0 + 32 * u;
    if (c >= nch) break;
    if constexpr (F::kInt8) {
      int4 raw[NW][2];
      float sw[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) {
        const int4* p = reinterpret_cast<const int4*>(ring.piece(slot, u, j, lane));
        raw[j][0] = p[0];
        raw[j][1] = p[1];
        sw[j] = *ring.scale(slot, u, j, lane);
      }
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t >= T) break;
        int4 a0, a1;
        float sa;
        act(t, c, a0, a1, sa);
        dp4a_chunk(raw, sw, a0, a1, sa, t, acc);
      }
    } else {
      float wv[NW][F::CH];
#pragma unroll
      for (int j = 0; j < NW; ++j) F::unpack(*reinterpret_cast<const uint4*>(ring.piece(slot, u, j, lane)), wv[j]);
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t >= T) break;
        float xv[F::CH];
        act(t, c, xv);
        fma_chunk(wv, xv, t, acc);
      }
    }
  }
}

// Fused path: shared-memory bytes of T tokens' staged activations of length K: f32 floats, bf16
// 16-bit patterns (exactly the rounded values), int8 the legacy planes and scales.
template <class F>
__host__ __device__ inline size_t act_ring_bytes(int T, int K) {
  return F::kInt8 ? act_smem_bytes<F>(T, K) : (size_t)T * K * sizeof(typename F::T);
}

// Fused path: stage T rows of x (row t at xrow(t), K values, K a multiple of the chunk) with
// 16-byte loads, four in flight per thread, in the layouts act_ring_bytes describes; flags[t] = 1
// for a token with a non-finite value. int8: four lanes per 32-value block (8 values each), the
// block's amax by two shuffles. Ends with __syncthreads(). Every thread of the block calls it.
template <class F, class Row>
__device__ inline void stage_x_vec(void* smem, int T, int K, Row xrow, int* flags) {
  constexpr int kUnroll = 4;
  const int tid = threadIdx.x, nthr = blockDim.x;
  if constexpr (F::kInt8) {
    // unit = 8 consecutive values (two float4); a quad of lanes covers one block
    const int upt = K / 8, total = T * upt, nblk = K / kQBlock, lane = tid & 31;
    int8_t* xq = reinterpret_cast<int8_t*>(smem);
    float* xsa = reinterpret_cast<float*>(xq + (size_t)T * K);
    for (int b0 = tid - lane; b0 < total; b0 += kUnroll * nthr) {  // warp-uniform trip count
      float4 v[kUnroll][2];
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) {
        const int u = b0 + lane + r * nthr;
        if (u < total) {
          const float4* src = reinterpret_cast<const float4*>(xrow(u / upt) + 8 * (u % upt));
          v[r][0] = __ldg(src);
          v[r][1] = __ldg(src + 1);
        } else {
          v[r][0] = v[r][1] = float4{0.f, 0.f, 0.f, 0.f};
        }
      }
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) {
        const int u = b0 + lane + r * nthr;
        const float e[8] = {v[r][0].x, v[r][0].y, v[r][0].z, v[r][0].w, v[r][1].x, v[r][1].y, v[r][1].z, v[r][1].w};
        float amax = 0.f;
        bool bad = false;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          amax = fmaxf(amax, fabsf(e[i]));
          bad |= !isfinite(e[i]);
        }
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
        if (u < total) {
          const int t = u / upt, k = 8 * (u % upt);
          if (bad) flags[t] = 1;
          const float sa = act_scale(amax), inv = act_inv(sa);
          uint32_t w[2] = {0u, 0u};
#pragma unroll
          for (int i = 0; i < 8; ++i) w[i / 4] |= (uint32_t)(uint8_t)(int8_t)act_quant(e[i], inv) << (8 * (i % 4));
          *reinterpret_cast<uint2*>(xq + xq_index(t, k, K)) = uint2{w[0], w[1]};
          if ((u & 3) == 0) xsa[t * nblk + k / kQBlock] = sa;
        }
      }
    }
  } else {
    // unit = 4 consecutive values (one float4)
    const int upt = K / 4, total = T * upt;
    for (int b0 = tid; b0 < total; b0 += kUnroll * nthr) {
      float4 v[kUnroll];
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) {
        const int u = b0 + r * nthr;
        if (u < total) v[r] = __ldg(reinterpret_cast<const float4*>(xrow(u / upt) + 4 * (u % upt)));
      }
#pragma unroll
      for (int r = 0; r < kUnroll; ++r) {
        const int u = b0 + r * nthr;
        if (u >= total) break;
        const int t = u / upt, k = 4 * (u % upt);
        if (!isfinite(v[r].x) || !isfinite(v[r].y) || !isfinite(v[r].z) || !isfinite(v[r].w)) flags[t] = 1;
        if constexpr (sizeof(typename F::T) == 4) {
          *reinterpret_cast<float4*>(reinterpret_cast<float*>(smem) + (size_t)t * K + k) = v[r];
        } else {
          const uint32_t lo = (uint32_t)float_to_bf16_bits(v[r].x) | (uint32_t)float_to_bf16_bits(v[r].y) << 16;
          const uint32_t hi = (uint32_t)float_to_bf16_bits(v[r].z) | (uint32_t)float_to_bf16_bits(v[r].w) << 16;
          *reinterpret_cast<uint2*>(reinterpret_cast<uint16_t*>(smem) + (size_t)t * K + k) = uint2{lo, hi};
        }
      }
    }
  }
  __syncthreads();
}
#endif  // __CUDACC__

}  // namespace moespec_cuda

#endif  // MOESPEC_EXPERT_COMMON_CUH
