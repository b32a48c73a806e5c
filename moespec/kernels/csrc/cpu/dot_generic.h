// Portable dot micro-kernels: one row x T tokens in plain C++. dot_portable.cpp compiles them for
// the baseline ISA, dot_avx2.cpp inlines them into AVX2 code (the int8 path there is this loop,
// auto-vectorized).
#pragma once

#include "dot.h"

namespace moespec {

// Portable micro-kernels (also compiled for AVX2 by inlining into target("avx2") wrappers).
template <int T>
static inline __attribute__((always_inline)) void dot_f32_portable(const float* w, int64_t K, const ActRef* a, float* out) {
  float acc[T][8] = {};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int t = 0; t < T; ++t) {
      const float* x = (const float*)a[t].f + k;
      for (int l = 0; l < 8; ++l) acc[t][l] += w[k + l] * x[l];
    }
  for (int t = 0; t < T; ++t) {
    float s = 0.f;
    for (int l = 0; l < 8; ++l) s += acc[t][l];
    for (int64_t kk = k; kk < K; ++kk) s += w[kk] * a[t].f[kk];
    out[t] = s;
  }
}

template <int T>
static inline __attribute__((always_inline)) void dot_bf16_portable(const uint16_t* w, int64_t K, const ActRef* a, float* out) {
  float acc[T][8] = {};
  float wf[8];
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    for (int l = 0; l < 8; ++l) wf[l] = bf16_to_f32(w[k + l]);
    for (int t = 0; t < T; ++t) {
      const float* x = a[t].f + k;
      for (int l = 0; l < 8; ++l) acc[t][l] += wf[l] * x[l];
    }
  }
  for (int t = 0; t < T; ++t) {
    float s = 0.f;
    for (int l = 0; l < 8; ++l) s += acc[t][l];
    for (int64_t kk = k; kk < K; ++kk) s += bf16_to_f32(w[kk]) * a[t].f[kk];
    out[t] = s;
  }
}

template <int T>
static inline __attribute__((always_inline)) void dot_i8_portable(const uint8_t* w, const float* ws, int64_t K, const ActRef* a, float* out) {
  const int64_t nblk = K / BLK;
  float acc[T] = {};
  for (int64_t g = 0; g * GRP < nblk; ++g) {
    const int64_t G = std::min<int64_t>(GRP, nblk - g * GRP);
    const uint8_t* wg = w + g * GRP * BLK;
    for (int t = 0; t < T; ++t) {
      const int8_t* xg = (const int8_t*)a[t].q + g * GRP * BLK;
      int32_t isum[GRP];
      for (int64_t j = 0; j < G; ++j) isum[j] = a[t].c[g * GRP + j];
      for (int i = 0; i < 8; ++i)
        for (int64_t j = 0; j < G; ++j)
          for (int c = 0; c < 4; ++c) {
            int64_t o = i * 4 * G + j * 4 + c;
            isum[j] += (int32_t)wg[o] * (int32_t)xg[o];
          }
      for (int64_t j = 0; j < G; ++j) acc[t] += (float)isum[j] * (ws[g * GRP + j] * a[t].s[g * GRP + j]);
    }
  }
  for (int t = 0; t < T; ++t) out[t] = acc[t];
}

// Single-row paths (portable, AVX2): loop over the rows, one micro-kernel call per row.
#define MOESPEC_ROWS_FN(NAME, WT, KERNEL, ARGS)                                                                \
  void NAME(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out) { \
    for (int r = 0; r < nrows; ++r) {                                                                          \
      const WT* wr = (const WT*)w + r * K;                                                                     \
      const float* wsr = ws ? ws + r * (K / BLK) : nullptr;                                                    \
      float sums[TMAX];                                                                                        \
      (void)wsr;                                                                                               \
      MOESPEC_SWITCH_T(KERNEL, ARGS)                                                                           \
      for (int t = 0; t < T; ++t) out[t][r] = sums[t];                                                         \
    }                                                                                                          \
  }

// The three formats' entry points dot_<fmt>_<ISA>_fn of a single-row path whose micro-kernels are
// dot_<fmt>_<ISA><T>.
#define MOESPEC_ROWS_FNS(ISA)                                                          \
  MOESPEC_ROWS_FN(dot_f32_##ISA##_fn, float, dot_f32_##ISA, (wr, K, a, sums))          \
  MOESPEC_ROWS_FN(dot_bf16_##ISA##_fn, uint16_t, dot_bf16_##ISA, (wr, K, a, sums))     \
  MOESPEC_ROWS_FN(dot_i8_##ISA##_fn, uint8_t, dot_i8_##ISA, (wr, wsr, K, a, sums))

}  // namespace moespec
