// Activation staging (activations.h): the conversions, scalar and AVX-512, and silu.
#include <cmath>
#include <limits>

#include "activations.h"

namespace moespec {

// Phase 2 and the activation conversion, vectorized for the AVX-512 path (docs/kernels.md: the
// scalar loops cost a few percent of a one-token call).

// e^x for 16 floats: x = n ln2 + r, |r| <= ln2/2, e^r by its degree-7 Taylor polynomial
// (truncation < 6e-9 relative, below float rounding), 2^n applied with vscalefps (which gives
// inf / 0 beyond the float range). x is first clamped to [-110, 100], beyond which e^x is 0 or inf
// in float anyway: without it, |x| above ~1e7 broke the range reduction (n ln2 no longer exact),
// and silu of an activation of 1e15 came out with the wrong sign, of 1e20 as 0 instead of
// overflowing (issue 17). max(lo, x) and min(hi, x) return x when it is NaN, which passes through.
static inline TGT_512 __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(100.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);  // ln2 split: hi exact in float
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// g[r] = silu(g[r]) * u[r] = g / (1 + e^-g) * u, r < K.
static inline float silu_mul1(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }
static TGT_512 void silu_mul_avx512(float* g, const float* u, int64_t K) {
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 gv = _mm512_loadu_ps(g + k);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv));
    _mm512_storeu_ps(g + k, _mm512_mul_ps(_mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f), e)), _mm512_loadu_ps(u + k)));
  }
  for (; k < K; ++k) g[k] = silu_mul1(g[k], u[k]);
}

// bf16 bits (round to nearest even, quiet NaN: as f32_to_bf16) and their float values, 16 at a time.
static TGT_512 void to_bf16_avx512(const float* v, int64_t K, uint16_t* b, float* f) {
  int64_t k = 0;
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), qnan = _mm512_set1_epi32(0x40);
  for (; k + 16 <= K; k += 16) {
    const __m512 x = _mm512_loadu_ps(v + k);
    const __m512i u = _mm512_castps_si512(x);
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(bias, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    const __m512i h = _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16), qnan));
    _mm256_storeu_si256((__m256i*)(b + k), _mm512_cvtepi32_epi16(h));
    _mm512_storeu_ps(f + k, _mm512_castsi512_ps(_mm512_slli_epi32(h, 16)));
  }
  for (; k < K; ++k) {
    b[k] = f32_to_bf16(v[k]);
    f[k] = bf16_to_f32(b[k]);
  }
}

// One row of K values (K a multiple of 16 blocks of 32) quantized per block of 32 into the
// interleaved int8 layout, with the block scales and offset corrections: the same values as the
// scalar loop in Acts::set_row and moespec.kernels.quantize_blocks (round half to even, clamp to
// +-127; a block holding NaN or +-inf gets values 0 and scale NaN, so that every product with it
// is NaN: the non-finite rule of docs/kernels.md). Step i of a group of 16 blocks holds word i
// (values 4i..4i+3) of each block: one 16-lane gather per step from the group's 512 quantized bytes.
static TGT_512 void quantize_i8_avx512(const float* v, int64_t K, int8_t* qr, float* sr, int32_t* cr) {
  alignas(64) int8_t tmp[GRP * BLK];
  const __m512 lim = _mm512_set1_ps(127.0f), nlim = _mm512_set1_ps(-127.0f);
  const __m512i words = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32(BLK));
  for (int64_t g = 0; g < K / (GRP * BLK); ++g) {
    for (int j = 0; j < GRP; ++j) {
      const int64_t blk = g * GRP + j;
      const __m512 a0 = _mm512_loadu_ps(v + blk * BLK), a1 = _mm512_loadu_ps(v + blk * BLK + 16);
      // |x| <= FLT_MAX is false for NaN and +-inf (ordered compare)
      const __m512 fmax = _mm512_set1_ps(3.40282347e38f);
      const bool finite = (_mm512_cmp_ps_mask(_mm512_abs_ps(a0), fmax, _CMP_LE_OQ) &
                           _mm512_cmp_ps_mask(_mm512_abs_ps(a1), fmax, _CMP_LE_OQ)) == 0xFFFF;
      // |x| as the first operand: vmaxps returns the second one when the first is NaN
      const __m512 m = _mm512_max_ps(_mm512_abs_ps(a1), _mm512_max_ps(_mm512_abs_ps(a0), _mm512_setzero_ps()));
      const float amax = _mm512_reduce_max_ps(m);
      const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
      const float inv = finite && scale > 0.f ? 1.0f / scale : 0.f;
      const __m512 iv = _mm512_set1_ps(inv);
      const int rnd = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      const __m512i q0 = finite ? _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(a0, iv), rnd), nlim), lim))
                                : _mm512_setzero_si512();
      const __m512i q1 = finite ? _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(_mm512_mul_ps(a1, iv), rnd), nlim), lim))
                                : _mm512_setzero_si512();
      _mm_store_si128((__m128i*)(tmp + j * BLK), _mm512_cvtepi32_epi8(q0));
      _mm_store_si128((__m128i*)(tmp + j * BLK + 16), _mm512_cvtepi32_epi8(q1));
      sr[blk] = scale;
      cr[blk] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
    for (int i = 0; i < 8; ++i)
      _mm512_storeu_si512((void*)(qr + g * GRP * BLK + i * 4 * GRP),
                          _mm512_i32gather_epi32(_mm512_add_epi32(words, _mm512_set1_epi32(4 * i)), tmp, 1));
  }
}

void Acts::init(int fmt_, int64_t R, int64_t K_, bool vec_) {
  fmt = fmt_;
  K = K_;
  vec = vec_;
  if (fmt == I8) {
    qstride = round_up(K, 64) + 64;
    sstride = round_up(K / BLK, GRP);
    grown(q, R * qstride);
    grown(s, R * sstride);
    grown(c, R * sstride);
  } else {
    grown(f, R * K);
    if (fmt == BF16) grown(b, R * K);
  }
  refs.resize(R);
  for (int64_t r = 0; r < R; ++r) {
    if (fmt == I8)
      refs[r] = ActRef{q.data() + r * qstride, nullptr, s.data() + r * sstride, c.data() + r * sstride};
    else if (fmt == BF16)
      refs[r] = ActRef{b.data() + r * K, f.data() + r * K, nullptr, nullptr};
    else
      refs[r] = ActRef{f.data() + r * K, f.data() + r * K, nullptr, nullptr};
  }
}

void Acts::set_row(int64_t r, const float* v) {
  if (fmt == F32) {
    std::memcpy(f.data() + r * K, v, K * sizeof(float));
  } else if (fmt == BF16 && vec) {
    to_bf16_avx512(v, K, b.data() + r * K, f.data() + r * K);
  } else if (fmt == BF16) {
    for (int64_t k = 0; k < K; ++k) {
      uint16_t h = f32_to_bf16(v[k]);
      b[r * K + k] = h;
      f[r * K + k] = bf16_to_f32(h);
    }
  } else if (vec && (K / BLK) % GRP == 0) {
    quantize_i8_avx512(v, K, q.data() + r * qstride, s.data() + r * sstride, c.data() + r * sstride);
  } else {
    const int64_t nblk = K / BLK;
    int8_t* qr = q.data() + r * qstride;
    for (int64_t blk = 0; blk < nblk; ++blk) {
      float amax = 0.f;
      bool finite = true;
      for (int i = 0; i < BLK; ++i) {
        const float a = std::fabs(v[blk * BLK + i]);
        finite = finite && a <= std::numeric_limits<float>::max();  // false for NaN and inf
        amax = std::max(amax, a);
      }
      // a block holding NaN or +-inf: values 0, scale NaN (the non-finite rule, docs/kernels.md)
      const float scale = finite ? amax / 127.0f : std::numeric_limits<float>::quiet_NaN();
      const float inv = finite && scale > 0.f ? 1.0f / scale : 0.f;
      int32_t sum = 0;
      for (int i = 0; i < BLK; ++i) {
        float qv = finite ? std::nearbyint(v[blk * BLK + i] * inv) : 0.f;
        qv = std::min(127.f, std::max(-127.f, qv));
        int8_t qi = (int8_t)qv;
        sum += qi;
        qr[i8_offset(blk * BLK + i, nblk)] = qi;
      }
      s[r * sstride + blk] = scale;
      c[r * sstride + blk] = -128 * sum;
    }
    // padding of the last group: its lanes meet masked-out (zero) weights, and 0 * scale must
    // stay 0 (a stale value could be inf or NaN)
    std::fill(s.begin() + r * sstride + nblk, s.begin() + (r + 1) * sstride, 0.f);
    std::fill(c.begin() + r * sstride + nblk, c.begin() + (r + 1) * sstride, 0);
  }
}

void silu_mul(float* g, const float* u, int64_t K, bool avx512) {
  if (avx512)
    silu_mul_avx512(g, u, K);
  else
    for (int64_t r = 0; r < K; ++r) g[r] = silu_mul1(g[r], u[r]);
}

}  // namespace moespec
