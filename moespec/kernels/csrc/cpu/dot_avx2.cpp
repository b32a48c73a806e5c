// Dot kernels of the AVX2 + FMA path.
#include "dot_generic.h"

namespace moespec {

static TGT_AVX2 inline float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int T>
static TGT_AVX2 void dot_f32_avx2(const float* w, int64_t K, const ActRef* a, float* out) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    __m256 wv = _mm256_loadu_ps(w + k);
    for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a[t].f + k), acc[t]);
  }
  for (int t = 0; t < T; ++t) {
    float s = hsum256(acc[t]);
    for (int64_t kk = k; kk < K; ++kk) s += w[kk] * a[t].f[kk];
    out[t] = s;
  }
}

template <int T>
static TGT_AVX2 void dot_bf16_avx2(const uint16_t* w, int64_t K, const ActRef* a, float* out) {
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {  // bf16 -> f32 is a 16-bit shift; x is kept as f32 of its bf16 value
    __m256 wv = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(w + k))), 16));
    for (int t = 0; t < T; ++t) acc[t] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a[t].f + k), acc[t]);
  }
  for (int t = 0; t < T; ++t) {
    float s = hsum256(acc[t]);
    for (int64_t kk = k; kk < K; ++kk) s += bf16_to_f32(w[kk]) * a[t].f[kk];
    out[t] = s;
  }
}

template <int T>
static TGT_AVX2 void dot_i8_avx2(const uint8_t* w, const float* ws, int64_t K, const ActRef* a, float* out) {
  dot_i8_portable<T>(w, ws, K, a, out);  // the portable loop, auto-vectorized for AVX2
}

MOESPEC_ROWS_FNS(avx2)

}  // namespace moespec
