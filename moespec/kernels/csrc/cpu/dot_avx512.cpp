// Dot kernels of the AVX-512 path (f32: AVX-512F; bf16: + AVX512_BF16; int8: + AVX512_VNNI).
#include "dot.h"

namespace moespec {

// Micro-kernels: one row x T tokens. The row streams once, T accumulators (or U independent chains
// for one or two tokens) stay in registers, each token's activation chunk is the FMA's memory
// operand (an L1 hit). A kernel leaves its T accumulators unreduced in part[t][q] (q = the row's
// place in a block of 16 rows); finish_rows() then adds up 16 rows at once (hsum16). One row at a
// time: no row blocking. bf16 runs on 256-bit vectors, f32 on 256-bit for one token and 512-bit for
// more (each row's partial sums are widened to 512 bits for hsum16), int8 on 512-bit. Each of these
// choices was measured (docs/decisions.md, "Lab notes: the CPU kernels").
constexpr int RB = 16;  // rows per horizontal-sum block

// part[t][q] -> out[t][r0 + q] for q < nr: lane i of hsum16 is the sum of the 16 lanes of its i-th
// input. A shuffle tree (4 levels, 15 pairings of 3 instructions) costs ~3 instructions per row,
// _mm512_reduce_add_ps per row ~8 dependent ones (docs/kernels.md, "Horizontal sums"). The tree
// leaves lane L holding input kOrder[L]; kOrder is an involution, so feeding input kOrder[i] into
// slot i puts row i in lane i.
static constexpr int kOrder[RB] = {0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15};

static inline TGT_512 __m512 hsum16(const __m512* v) {
  __m512 s1[8], s2[4], s3[2];
  for (int i = 0; i < 8; ++i) {  // 128-bit chunks {0,1}+{2,3}: 8 partial sums of each input
    const __m512 a = v[kOrder[i]], b = v[kOrder[i + 8]];
    s1[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
  }
  for (int i = 0; i < 4; ++i)  // chunks {0,2}+{1,3}: 4 partial sums, one input per chunk
    s2[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[i], s1[i + 4], 0x88), _mm512_shuffle_f32x4(s1[i], s1[i + 4], 0xDD));
  for (int i = 0; i < 2; ++i)  // within chunks: 2 partial sums
    s3[i] = _mm512_add_ps(_mm512_shuffle_ps(s2[i], s2[i + 2], 0x44), _mm512_shuffle_ps(s2[i], s2[i + 2], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88), _mm512_shuffle_ps(s3[0], s3[1], 0xDD));
}

template <int T>
static inline __attribute__((always_inline)) TGT_512 void finish_rows(__m512 (&part)[T][RB], int nr, float* const* out, int r0) {
  const __mmask16 mk = nr == RB ? (__mmask16)0xffff : (__mmask16)((1u << nr) - 1);
  for (int t = 0; t < T; ++t) {
    for (int q = nr; q < RB; ++q) part[t][q] = _mm512_setzero_ps();
    _mm512_mask_storeu_ps(out[t] + r0, mk, hsum16(part[t]));
  }
}

// Independent accumulator chains: enough to cover the FMA latency when few tokens share a row.
template <int T> constexpr int chains() { return T == 1 ? 4 : (T <= 3 ? 2 : 1); }

// Float vectors of 8 (256-bit) or 16 (512-bit) lanes for the f32 micro-kernel: the same operations,
// spelled with each width's intrinsics (P: _mm256 or _mm512), and `widen` to 512 bits for the sums.
#define MOESPEC_F32_VECTOR(NAME, VEC, LANES, MASK, P, WIDEN)                                             \
  struct NAME {                                                                                          \
    using V = VEC;                                                                                       \
    static constexpr int L = LANES;                                                                      \
    static TGT_512 V zero() { return P##_setzero_ps(); }                                                 \
    static TGT_512 V load(const float* p) { return P##_loadu_ps(p); }                                    \
    static TGT_512 V loadz(int n, const float* p) { return P##_maskz_loadu_ps((MASK)((1u << n) - 1), p); } \
    static TGT_512 V fma(V a, V b, V c) { return P##_fmadd_ps(a, b, c); }                                \
    static TGT_512 V add(V a, V b) { return P##_add_ps(a, b); }                                          \
    static TGT_512 __m512 widen(V a) { return WIDEN; }                                                   \
  };
MOESPEC_F32_VECTOR(F32x8, __m256, 8, __mmask8, _mm256, _mm512_zextps256_ps512(a))
MOESPEC_F32_VECTOR(F32x16, __m512, 16, __mmask16, _mm512, a)
#undef MOESPEC_F32_VECTOR

// Adds up a token's U accumulators and keeps the sum, widened to 512 bits, as row q's partials.
template <class F, int U, int T>
static inline __attribute__((always_inline)) TGT_512 void keep_partials(const typename F::V (&acc)[U][T], __m512 (&part)[T][RB], int q) {
  for (int t = 0; t < T; ++t) {
    typename F::V s = acc[0][t];
    for (int u = 1; u < U; ++u) s = F::add(s, acc[u][t]);
    part[t][q] = F::widen(s);
  }
}

// f32: 256-bit FMAs for one token (streams faster, see above), 512-bit for more (fewer loads per
// weight byte once the FMAs, not the memory, set the pace).
template <int T>
static inline __attribute__((always_inline)) TGT_512 void dot_f32_avx512(const float* w, int64_t K, const ActRef* a, __m512 (&part)[T][RB], int q) {
  using F = typename std::conditional<T == 1, F32x8, F32x16>::type;
  constexpr int L = F::L, U = (T == 1 ? 2 : 1) * chains<T>();
  typename F::V acc[U][T];
  for (int u = 0; u < U; ++u)
    for (int t = 0; t < T; ++t) acc[u][t] = F::zero();
  int64_t k = 0;
  for (; k + L * U <= K; k += L * U) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      typename F::V wv = F::load(w + k + L * u);
      // The weight stream gets its own load instruction, x is the FMA's memory operand: with the
      // weight folded into the FMA (what GCC chose for T = 1) one thread streamed slower
      // (docs/decisions.md, "Lab notes").
      asm("" : "+v"(wv));
#pragma GCC unroll 9
      for (int t = 0; t < T; ++t) acc[u][t] = F::fma(wv, F::load(a[t].f + k + L * u), acc[u][t]);
    }
  }
  for (; k < K; k += L) {
    const int nk = (int)std::min<int64_t>(L, K - k);
    const typename F::V wv = F::loadz(nk, w + k);
    for (int t = 0; t < T; ++t) acc[0][t] = F::fma(wv, F::loadz(nk, a[t].f + k), acc[0][t]);
  }
  keep_partials<F, U, T>(acc, part, q);
}

template <int T>
static inline __attribute__((always_inline)) TGT_512BF16 void dot_bf16_avx512(const uint16_t* w, int64_t K, const ActRef* a, __m512 (&part)[T][RB], int q) {
  // vdpbf16ps on 256-bit vectors: 16 bf16 products per instruction, accumulated pairwise in fp32.
  constexpr int U = 2 * chains<T>();
  __m256 acc[U][T];
  for (int u = 0; u < U; ++u)
    for (int t = 0; t < T; ++t) acc[u][t] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 * U <= K; k += 16 * U) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      __m256i wi = _mm256_loadu_si256((const __m256i*)(w + k + 16 * u));
      asm("" : "+v"(wi));  // own load for the weight stream (see dot_f32_avx512)
#pragma GCC unroll 9
      for (int t = 0; t < T; ++t)
        acc[u][t] = _mm256_dpbf16_ps(acc[u][t], (__m256bh)wi,
                                     (__m256bh)_mm256_loadu_si256((const __m256i*)((const uint16_t*)a[t].q + k + 16 * u)));
    }
  }
  for (; k < K; k += 16) {
    const __mmask16 mk = K - k >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (K - k)) - 1);
    const __m256bh wv = (__m256bh)_mm256_maskz_loadu_epi16(mk, w + k);
    for (int t = 0; t < T; ++t)
      acc[0][t] = _mm256_dpbf16_ps(acc[0][t], wv, (__m256bh)_mm256_maskz_loadu_epi16(mk, (const uint16_t*)a[t].q + k));
  }
  keep_partials<F32x8, U, T>(acc, part, q);
}

// One group of G <= 16 int8 blocks (512 bytes when full) of one row for T tokens, added to facc.
// Interleaved layout: step i of a group holds 4 values of each of its G blocks, so int32 lane j of
// vpdpbusd accumulates block j whole; after 8 steps each lane is one block's sum, scaled once
// (w scale * activation scale) into the float accumulator. Weights are stored +128 (unsigned
// operand); the accumulator starts at -128 * sum(x block) to cancel that offset. FULL groups use
// plain loads, the last partial group masked ones.
template <int T, bool FULL>
static inline __attribute__((always_inline)) TGT_512VNNI void i8_group(const uint8_t* w, const float* ws, const ActRef* a,
                                                                      int64_t g, int64_t G, __m512 (&facc)[T]) {
  const __mmask16 ml = FULL ? (__mmask16)0xffff : (__mmask16)((1u << G) - 1);
  const __mmask64 mb = FULL ? ~0ull : ((1ull << (4 * G)) - 1);
  const int64_t o = g * GRP * BLK, step = FULL ? 4 * GRP : 4 * G;
  // S independent chains (even/odd steps) when few tokens leave vpdpbusd latency-bound.
  constexpr int S = T <= 2 ? 2 : 1;
  __m512i iacc[S][T];
  for (int t = 0; t < T; ++t) {
    iacc[0][t] = FULL ? _mm512_loadu_si512((const void*)(a[t].c + g * GRP)) : _mm512_maskz_loadu_epi32(ml, a[t].c + g * GRP);
    if (S > 1) iacc[S - 1][t] = _mm512_setzero_si512();
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    __m512i wv = FULL ? _mm512_loadu_si512((const void*)(w + o + i * step)) : _mm512_maskz_loadu_epi8(mb, w + o + i * step);
    asm("" : "+v"(wv));
#pragma GCC unroll 9
    for (int t = 0; t < T; ++t)
      iacc[i % S][t] = _mm512_dpbusd_epi32(iacc[i % S][t], wv, _mm512_loadu_si512((const void*)((const int8_t*)a[t].q + o + i * step)));
  }
  const __m512 sw = FULL ? _mm512_loadu_ps(ws + g * GRP) : _mm512_maskz_loadu_ps(ml, ws + g * GRP);
  for (int t = 0; t < T; ++t) {
    const __m512i s = S > 1 ? _mm512_add_epi32(iacc[0][t], iacc[S - 1][t]) : iacc[0][t];
    facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(sw, _mm512_loadu_ps(a[t].s + g * GRP)), facc[t]);
  }
}

template <int T>
static inline __attribute__((always_inline)) TGT_512VNNI void dot_i8_avx512(const uint8_t* w, const float* ws, int64_t K, const ActRef* a,
                                                                            __m512 (&part)[T][RB], int q) {
  const int64_t nblk = K / BLK, full = nblk / GRP;
  __m512 facc[T];
  for (int t = 0; t < T; ++t) facc[t] = _mm512_setzero_ps();
  for (int64_t g = 0; g < full; ++g) i8_group<T, true>(w, ws, a, g, GRP, facc);
  if (nblk % GRP) i8_group<T, false>(w, ws, a, full, nblk % GRP, facc);
  for (int t = 0; t < T; ++t) part[t][q] = facc[t];
}

// f32 with 6 or more tokens per row takes each block of RB rows in chunks of KCHUNK values (chunk 0
// of every row, then chunk 1, ...), so that the T activation chunks stay in L1 from one row to the
// next; whole rows of T f32 activations do not fit (T x 8 KiB at K = 2048 against a 32 KiB L1).
// bf16 gained nothing from chunks, and int8 activations (a byte each) fit whole. The measurements
// behind KCHUNK and the token threshold: docs/decisions.md, "Lab notes".
constexpr int64_t KCHUNK = 512;
template <class WT, int T>
constexpr bool chunked_rows() { return sizeof(WT) == 4 && T >= 6; }

// nrows consecutive rows in blocks of RB, the micro-kernel inlined per row (per row chunk when
// chunked_rows).
#define MOESPEC_ROWS_AVX512(NAME, TGT, WT, DOT, WS_ARG)                                                         \
  template <int T>                                                                                              \
  static TGT void NAME(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, float* const* out) { \
    (void)ws;                                                                                                   \
    for (int r0 = 0; r0 < nrows; r0 += RB) {                                                                    \
      const int nr = std::min(RB, nrows - r0);                                                                  \
      __m512 part[T][RB];                                                                                       \
      bool whole = true;                                                                                        \
      if constexpr (chunked_rows<WT, T>()) {                                                                    \
        if (K > KCHUNK) {                                                                                       \
          whole = false;                                                                                        \
          __m512 pc[T][RB];                                                                                     \
          ActRef ac[T];                                                                                         \
          for (int64_t k0 = 0; k0 < K; k0 += KCHUNK) {                                                          \
            const int64_t kn = std::min<int64_t>(KCHUNK, K - k0);                                               \
            for (int t = 0; t < T; ++t) ac[t] = ActRef{(const WT*)a[t].q + k0, a[t].f + k0, nullptr, nullptr};  \
            for (int q = 0; q < nr; ++q) {                                                                      \
              DOT<T>((const WT*)w + (r0 + q) * K + k0, kn, ac, pc, q);                                          \
              for (int t = 0; t < T; ++t) part[t][q] = k0 ? _mm512_add_ps(part[t][q], pc[t][q]) : pc[t][q];      \
            }                                                                                                   \
          }                                                                                                     \
        }                                                                                                       \
      }                                                                                                         \
      if (whole)                                                                                                \
        for (int q = 0; q < nr; ++q) {                                                                          \
          const int64_t r = r0 + q;                                                                             \
          DOT<T>((const WT*)w + r * K, WS_ARG K, a, part, q);                                                   \
        }                                                                                                       \
      finish_rows<T>(part, nr, out, r0);                                                                        \
    }                                                                                                           \
  }
#define MOESPEC_NO_WS
#define MOESPEC_I8_WS ws + r * (K / BLK),
MOESPEC_ROWS_AVX512(rows_f32_avx512, TGT_512, float, dot_f32_avx512, MOESPEC_NO_WS)
MOESPEC_ROWS_AVX512(rows_bf16_avx512, TGT_512BF16, uint16_t, dot_bf16_avx512, MOESPEC_NO_WS)
MOESPEC_ROWS_AVX512(rows_i8_avx512, TGT_512VNNI, uint8_t, dot_i8_avx512, MOESPEC_I8_WS)

void dot_f32_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* o) {
  MOESPEC_SWITCH_T(rows_f32_avx512, (w, ws, nrows, K, a, o))
}
void dot_bf16_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* o) {
  MOESPEC_SWITCH_T(rows_bf16_avx512, (w, ws, nrows, K, a, o))
}
void dot_i8_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* o) {
  MOESPEC_SWITCH_T(rows_i8_avx512, (w, ws, nrows, K, a, o))
}

}  // namespace moespec
