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
#include <cuda_runtime.h>

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
__host__ __device__ inline float bits_to_float(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
#endif
}

__host__ __device__ inline uint32_t float_to_bits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  return u;
#endif
}

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
__host__ __device__ inline int act_quant(float v, float inv) {
  float q = rintf(v * inv);  // round half to even
  q = q < -127.f ? -127.f : (q > 127.f ? 127.f : q);
  return (int)q;
}

#ifdef __CUDACC__
// ---- storage formats ---------------------------------------------------------------------
// CH: values per lane per chunk (16 bytes for f32 / bf16, one 32-value block = 32 bytes for int8);
// U: chunks per loop iteration (all their loads issued before any is used).
struct FmtF32 {
  using T = float;
  static constexpr int CH = 4, U = 2;
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
  static constexpr int CH = 8, U = 2;
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
  static constexpr int CH = kQBlock, U = 1;
  static constexpr bool kInt8 = true;
};

// One weight row of one expert: values and (int8 only) its K/32 scales.
template <class F>
struct RowRef {
  const typename F::T* w;
  const float* s;
};

// Shared-memory bytes of the staged activations of T tokens of length K.
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
// Ends with __syncthreads(). Every thread of the block calls it.
template <class F, bool VEC, class Load>
__device__ inline void stage_acts(void* smem, int T, int K, Load load) {
  if constexpr (F::kInt8) {
    int8_t* xq = reinterpret_cast<int8_t*>(smem);
    float* xsa = reinterpret_cast<float*>(xq + (size_t)T * K);
    const int nblk = K / kQBlock, lane = threadIdx.x & 31;
    // one warp per (token, block): lane = position in the block
    for (int wb = threadIdx.x >> 5; wb < T * nblk; wb += blockDim.x >> 5) {
      const int t = wb / nblk, b = wb - t * nblk, k = b * kQBlock + lane;
      const float v = load(t, k);
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
      xs[VEC ? xs_index<F>(t, k, K) : idx] = F::round_act(load(t, k));
    }
  }
  __syncthreads();
}

// The micro-kernel: NW weight rows dotted with the staged activations of T <= TMAX tokens. Each
// lane loads each of its weight chunks once, into registers, and applies it to every token of the
// tile; per-lane partial sums are then reduced across the warp (every lane ends with the totals).
// Per token the sequence of operations depends neither on T nor on TMAX.
template <class F, int NW, int TMAX, bool VEC>
__device__ __forceinline__ void dot_tile(const RowRef<F> (&rows)[NW], const void* __restrict__ smem,
                                         int K, int T, int lane, float (&acc)[NW][TMAX]) {
#pragma unroll
  for (int j = 0; j < NW; ++j)
#pragma unroll
    for (int t = 0; t < TMAX; ++t) acc[j][t] = 0.f;

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
        const int4 a0 = xq4[(t * 2 + 0) * nch + c];
        const int4 a1 = xq4[(t * 2 + 1) * nch + c];
        const float sa = xsa[t * nch + c];
#pragma unroll
        for (int j = 0; j < NW; ++j) {
          int isum = 0;
          isum = __dp4a(raw[j][0].x, a0.x, isum);
          isum = __dp4a(raw[j][0].y, a0.y, isum);
          isum = __dp4a(raw[j][0].z, a0.z, isum);
          isum = __dp4a(raw[j][0].w, a0.w, isum);
          isum = __dp4a(raw[j][1].x, a1.x, isum);
          isum = __dp4a(raw[j][1].y, a1.y, isum);
          isum = __dp4a(raw[j][1].z, a1.z, isum);
          isum = __dp4a(raw[j][1].w, a1.w, isum);
          acc[j][t] = fmaf((float)isum, sw[j] * sa, acc[j][t]);
        }
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
#pragma unroll
          for (int j = 0; j < NW; ++j)
#pragma unroll
            for (int i = 0; i < CH; ++i) acc[j][t] = fmaf(wv[j][i], xv[i], acc[j][t]);
        }
      }
    }
  } else {
    // Scalar path (f32/bf16 with a reduction length or a pointer that rules out 16-byte loads):
    // lane handles values k = lane + 32 i; activations in plain [T][K] layout.
    const float* xs = reinterpret_cast<const float*>(smem);
    for (int k = lane; k < K; k += 32) {
      float wv[NW];
#pragma unroll
      for (int j = 0; j < NW; ++j) wv[j] = F::load1(rows[j].w, k);
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t >= T) break;
        const float xv = xs[t * K + k];
#pragma unroll
        for (int j = 0; j < NW; ++j) acc[j][t] = fmaf(wv[j], xv, acc[j][t]);
      }
    }
  }

  // Warp reduction: butterfly, so every lane holds every total.
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
#endif  // __CUDACC__

}  // namespace moespec_cuda

#endif  // MOESPEC_EXPERT_COMMON_CUH
