// moespec expert operation on CPU: per-slot and deduplicating kernels (paper 1, Section 1).
//
// Defines the op schemas (TORCH_LIBRARY(moespec, m)) and the CPU implementations; CUDA
// implementations are added elsewhere with TORCH_LIBRARY_IMPL(moespec, CUDA, m).
//
// One driver serves both kernels. The pass's (token, slot) pairs ("assignments", a = t*m + s) are
// split into groups, each group one expert read:
//   * per-slot: one group per assignment, in token order -> n*m expert reads (llama.cpp mul_mv_id);
//   * dedup:    one group per distinct expert holding all of its assignments -> U expert reads.
// For every weight row a group streams once, a multi-token micro-kernel accumulates the dot
// products of up to TMAX = 9 tokens in registers (the row is loaded once, each token's activation
// chunk is an L1 hit). Work items are (group, matrix, block of rows), dealt into one lane per
// thread (a contiguous share of every matrix's rows); a thread takes its own lane in order and then
// steals from the others, so each streams long contiguous runs and a descheduled thread does not
// stall the rest. Helpers come from torch's OpenMP team or from a pool of our own (see
// use_openmp_team).
//
// ISA paths are chosen at run time from the CPU flags (AVX-512 [+BF16, +VNNI], AVX2+FMA, portable);
// the environment variable MOESPEC_CPU_ISA=avx512|avx2|portable caps the level (tests use it to
// cover every path on one machine).

#include <torch/extension.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>

#include <immintrin.h>
#include <omp.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace moespec {

constexpr int TMAX = 9;      // tokens per micro-kernel call (registers: 9 int + 9 float accumulators)
constexpr int BLK = 32;      // int8 values per scale
constexpr int GRP = 16;      // int8 blocks per interleaved group (one 512-bit vector of int32 lanes)

enum Fmt { F32 = 0, BF16 = 1, I8 = 2 };
enum Isa { PORTABLE = 0, AVX2 = 1, AVX512 = 2 };

// Activations of one row (token or assignment) in the layout of the format.
struct ActRef {
  const void* q;          // f32: float*, bf16: uint16_t* (bf16 bits), int8: int8 interleaved
  const float* f;         // bf16: the same values as float (AVX2/portable paths); f32: = q
  const float* s;         // int8: block scales [nblk padded to 16], zero padded
  const int32_t* c;       // int8: -128 * (sum of the block's int8 values) [nblk padded to 16]
};

// Tuning knob, read from the environment at each call (benchmarks use it to compare settings;
// the default is the measured best): bytes of one matrix's rows per work item. (A software-prefetch
// knob was removed: every distance from 512 B to 8 KiB measured slower, and its run-time check in
// the inner loop cost time itself.)
static int64_t g_item_bytes = 256 * 1024;
static int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}

// out[t][r] = row r . activation t, for nrows <= ROWS_PER_CALL consecutive rows of a matrix (row r
// at w + r * K elements, int8 scales at ws + r * K / 32) and T <= TMAX tokens; out[t] points at
// token t's destination for the first row. One call covers a block of rows, the row loop inside
// the ISA-specific function (one indirect call per 64 rows).
constexpr int ROWS_PER_CALL = 64;
using DotFn = void (*)(const void* w, const float* ws, int nrows, int64_t K, const ActRef* acts, int T, float* const* out);

// ------------------------------------------------------------------------------------------------
// Scalar helpers
static inline uint16_t f32_to_bf16(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                            // round to nearest even
  return (uint16_t)(u >> 16);
}
static inline float bf16_to_f32(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}
// Byte offset of value k of a row in the interleaved int8 layout (docs/kernels.md).
static inline int64_t i8_offset(int64_t k, int64_t nblk) {
  int64_t b = k / BLK, g = b / GRP, j = b % GRP, w = k % BLK;
  int64_t G = std::min<int64_t>(GRP, nblk - g * GRP);
  return g * GRP * BLK + (w / 4) * 4 * G + j * 4 + (w % 4);
}
static inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// ------------------------------------------------------------------------------------------------
// Portable micro-kernels (also compiled for AVX2 by inlining into target("avx2") wrappers).
template <int T>
static inline __attribute__((always_inline)) void dot_f32_generic(const float* w, int64_t K, const ActRef* a, float* out) {
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
static inline __attribute__((always_inline)) void dot_bf16_generic(const uint16_t* w, int64_t K, const ActRef* a, float* out) {
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
static inline __attribute__((always_inline)) void dot_i8_generic(const uint8_t* w, const float* ws, int64_t K, const ActRef* a, float* out) {
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

// ------------------------------------------------------------------------------------------------
// AVX2 + FMA micro-kernels.
#define TGT_AVX2 __attribute__((target("avx2,fma")))

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
  dot_i8_generic<T>(w, ws, K, a, out);  // the portable loop, auto-vectorized for AVX2
}

// ------------------------------------------------------------------------------------------------
// AVX-512 micro-kernels.
#define TGT_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define TGT_512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#define TGT_512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")))

// Micro-kernels: one row x T tokens. The row streams once, T accumulators (or U independent chains
// for one or two tokens) stay in registers, each token's activation chunk is the FMA's memory
// operand (an L1 hit). A kernel leaves its T accumulators unreduced in part[t][q] (q = the row's
// place in a block of 16 rows); finish_rows() then adds up 16 rows at once (hsum16). Rows side by
// side (2-4 rows per pass) measured 30-50% slower from DRAM on this Zen 4 VM than one row at a time,
// so there is no row blocking.
// bf16 runs on 256-bit vectors, f32 on 256-bit for one token and 512-bit for more (each row's partial
// sums are widened to 512 bits for hsum16), int8 on 512-bit, as interleaved A/B runs chose on this
// Zen 4 VM: 256-bit vectors raised bf16 from 0.89-0.93 to 0.97-0.99 of the read (slow regime) and
// from 0.70-0.79 to 0.81-0.91 (fast), f32 with one token by 0.03-0.06 (fast); with more tokens f32 did
// better on 512-bit FMAs (fewer loads per weight byte once the FMAs set the pace); int8 on 256-bit
// vpdpbusd measured no better (docs/kernels.md, "Vector width").
constexpr int RB = 16;  // rows per horizontal-sum block

// part[t][q] -> out[t][r0 + q] for q < nr: lane i of hsum16 is the sum of the 16 lanes of its i-th
// input. A shuffle tree (4 levels, 15 pairings of 3 instructions) costs ~3 instructions per row;
// _mm512_reduce_add_ps per row cost ~8 dependent ones, 10-25% of the work of a 1-2 KiB int8/bf16
// row. The tree leaves lane L holding input kOrder[L]; kOrder is an involution, so feeding input
// kOrder[i] into slot i puts row i in lane i.
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

// Float vectors of 8 (256-bit) or 16 (512-bit) lanes for the f32 micro-kernel.
struct F32x8 {
  using V = __m256;
  static constexpr int L = 8;
  static TGT_512 V zero() { return _mm256_setzero_ps(); }
  static TGT_512 V load(const float* p) { return _mm256_loadu_ps(p); }
  static TGT_512 V loadz(int n, const float* p) { return _mm256_maskz_loadu_ps((__mmask8)((1u << n) - 1), p); }
  static TGT_512 V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static TGT_512 V add(V a, V b) { return _mm256_add_ps(a, b); }
  static TGT_512 __m512 widen(V a) { return _mm512_zextps256_ps512(a); }
};
struct F32x16 {
  using V = __m512;
  static constexpr int L = 16;
  static TGT_512 V zero() { return _mm512_setzero_ps(); }
  static TGT_512 V load(const float* p) { return _mm512_loadu_ps(p); }
  static TGT_512 V loadz(int n, const float* p) { return _mm512_maskz_loadu_ps((__mmask16)((1u << n) - 1), p); }
  static TGT_512 V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static TGT_512 V add(V a, V b) { return _mm512_add_ps(a, b); }
  static TGT_512 __m512 widen(V a) { return a; }
};

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
      // The weight stream gets its own load instruction, x is the FMA's memory operand. With
      // the weight folded into the FMA instead (what GCC chose for T = 1 while x was pinned to a
      // register), one thread streaming from DRAM on this Zen 4 VM reached 0.89 of torch.sum over
      // the same bytes (OLMoE f32, n = 1, min over 80 calls); with its own load 0.93-0.98.
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
// next; whole rows of T f32 activations do not fit (T x 8 KiB at K = 2048 against a 32 KiB L1) and
// every activation load came from L2. One thread, 16 rows of K = 2048 in L2 (microkernel_ns), one
// interleaved run, ns per 64 weight bytes and token at T = 4 / 6 / 7 / 9: whole rows 0.56 / 0.68 /
// 0.69 / 0.74, chunks of 256: 0.43 / 0.41 / 0.44 / 0.51, of 512: 0.41 / 0.40 / 0.42 / 0.50, of 1024:
// 0.41 / 0.41 / 0.44 / 0.52. From DRAM the chunks interleave 16 row streams, which costs where the
// stream and not the arithmetic sets the pace: OLMoE f32 dedup on sticky-routing windows against
// whole rows, one A/B run each (new/old, paired per round): chunks from T = 4, two threads, n = 16
// 0.955; from T = 6, two threads, n = 8 / 16 / 32 0.99 / 1.03 / 1.08, one thread with strong reuse
// (rho(2) = 0.8) 1.06 / 1.05 / 1.12. bf16 gained nothing from chunks in L2 (whole rows 0.43-0.64,
// chunks 0.44-0.66), and int8 activations (a byte each) fit whole.
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

// ------------------------------------------------------------------------------------------------
// Dispatch tables: DotFn per (format, ISA), switching on the token count T at run time.
#define MOESPEC_SWITCH_T(CALL)               \
  switch (T) {                               \
    case 1: CALL(1); break;                  \
    case 2: CALL(2); break;                  \
    case 3: CALL(3); break;                  \
    case 4: CALL(4); break;                  \
    case 5: CALL(5); break;                  \
    case 6: CALL(6); break;                  \
    case 7: CALL(7); break;                  \
    case 8: CALL(8); break;                  \
    default: CALL(9); break;                 \
  }

// Single-row paths (portable, AVX2): loop over the rows.
#define MOESPEC_ROWS_FN(NAME, WT, SCALED)                                                              \
  static void NAME(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out) { \
    for (int r = 0; r < nrows; ++r) {                                                                          \
      const WT* wr = (const WT*)w + r * K;                                                                     \
      const float* wsr = ws ? ws + r * (K / BLK) : nullptr;                                                    \
      float sums[TMAX];                                                                                        \
      (void)wsr;                                                                                               \
      MOESPEC_SWITCH_T(SCALED)                                                                                 \
      for (int t = 0; t < T; ++t) out[t][r] = sums[t];                                                         \
    }                                                                                                          \
  }
#define C_F32P(N) dot_f32_generic<N>(wr, K, a, sums)
#define C_BF16P(N) dot_bf16_generic<N>(wr, K, a, sums)
#define C_I8P(N) dot_i8_generic<N>(wr, wsr, K, a, sums)
#define C_F32A(N) dot_f32_avx2<N>(wr, K, a, sums)
#define C_BF16A(N) dot_bf16_avx2<N>(wr, K, a, sums)
#define C_I8A(N) dot_i8_avx2<N>(wr, wsr, K, a, sums)
MOESPEC_ROWS_FN(dot_f32_portable_fn, float, C_F32P)
MOESPEC_ROWS_FN(dot_bf16_portable_fn, uint16_t, C_BF16P)
MOESPEC_ROWS_FN(dot_i8_portable_fn, uint8_t, C_I8P)
MOESPEC_ROWS_FN(dot_f32_avx2_fn, float, C_F32A)
MOESPEC_ROWS_FN(dot_bf16_avx2_fn, uint16_t, C_BF16A)
MOESPEC_ROWS_FN(dot_i8_avx2_fn, uint8_t, C_I8A)

#define C_F32X(N) rows_f32_avx512<N>(w, ws, nrows, K, a, o)
#define C_BF16X(N) rows_bf16_avx512<N>(w, ws, nrows, K, a, o)
#define C_I8X(N) rows_i8_avx512<N>(w, ws, nrows, K, a, o)
static void dot_f32_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* o) {
  MOESPEC_SWITCH_T(C_F32X)
}
static void dot_bf16_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* o) {
  MOESPEC_SWITCH_T(C_BF16X)
}
static void dot_i8_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* o) {
  MOESPEC_SWITCH_T(C_I8X)
}

static int isa_cap() {
  const char* env = std::getenv("MOESPEC_CPU_ISA");
  if (!env || !*env) return AVX512;
  std::string v(env);
  if (v == "portable") return PORTABLE;
  if (v == "avx2") return AVX2;
  if (v == "avx512") return AVX512;
  TORCH_CHECK(false, "MOESPEC_CPU_ISA must be avx512, avx2 or portable; found '", v, "'");
  return AVX512;
}

// Whether MOESPEC_CPU_ISA leaves the AVX-512 level allowed (read_probe.cpp's loops follow the cap).
bool isa_cap_allows_avx512() { return isa_cap() >= AVX512; }

// The ISA path used for a format on this CPU (highest the CPU has and the cap allows).
static int isa_for(int fmt) {
  __builtin_cpu_init();
  int cap = isa_cap();
  bool a512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  if (fmt == BF16) a512 = a512 && __builtin_cpu_supports("avx512bf16");
  if (fmt == I8) a512 = a512 && __builtin_cpu_supports("avx512vnni");
  bool a2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (cap >= AVX512 && a512) return AVX512;
  if (cap >= AVX2 && a2) return AVX2;
  return PORTABLE;
}

static DotFn dot_for(int fmt, int isa) {
  static const DotFn table[3][3] = {
      {dot_f32_portable_fn, dot_f32_avx2_fn, dot_f32_avx512_fn},
      {dot_bf16_portable_fn, dot_bf16_avx2_fn, dot_bf16_avx512_fn},
      {dot_i8_portable_fn, dot_i8_avx2_fn, dot_i8_avx512_fn}};
  return table[fmt][isa];
}

// Bytes per weight value of a format.
static int64_t element_bytes(int fmt) { return fmt == F32 ? 4 : (fmt == BF16 ? 2 : 1); }

// A format's code from its name ("f32", "bf16", "int8_b32"); who names the caller in the error.
static int format_code(const std::string& fmt, const char* who) {
  const int f = fmt == "f32" ? F32 : (fmt == "bf16" ? BF16 : (fmt == "int8_b32" ? I8 : -1));
  TORCH_CHECK(f >= 0, who, ": format must be f32, bf16 or int8_b32; found '", fmt, "'");
  return f;
}

// Rows [row0, row0 + nrows) of a weight matrix W with K values per row (element size esize; the
// int8 block scales S, or null) against T activations, in micro-kernel calls of up to ROWS_PER_CALL
// rows; out[t] receives token t's result of row row0, the following rows after it.
static void dot_rows(DotFn dot, const uint8_t* W, const float* S, int64_t esize, int64_t K, int64_t row0,
                     int64_t nrows, const ActRef* refs, int T, float* const* out) {
  float* o[TMAX];
  for (int64_t r = 0; r < nrows; r += ROWS_PER_CALL) {
    for (int t = 0; t < T; ++t) o[t] = out[t] + r;
    dot(W + (row0 + r) * K * esize, S ? S + (row0 + r) * (K / BLK) : nullptr,
        (int)std::min<int64_t>(ROWS_PER_CALL, nrows - r), K, refs, T, o);
  }
}

// ------------------------------------------------------------------------------------------------
// Phase 2 and the activation conversion, vectorized for the AVX-512 path (the scalar loops cost
// 2-4 % of a one-token call, done by one thread while the other streams).

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

// Scratch vectors on 64-byte (cache-line) boundaries: the micro-kernels load activations in whole
// vectors, and with malloc's 16-byte alignment a 64-byte load straddles two cache lines (every
// int8 activation load; every other 32-byte bf16 one), which measured 1.5x slower in the bf16
// micro-kernel in the processes where the buffer landed off a 32-byte boundary.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

// v with room for at least size elements (scratch buffers only grow); its data.
template <class V>
static auto* grown(V& v, int64_t size) {
  if ((int64_t)v.size() < size) v.resize(size);
  return v.data();
}

// Activations of R rows of length K in the format's layout.
struct Acts {
  int fmt = F32;
  int64_t K = 0, qstride = 0, sstride = 0;
  AlignedVector<float> f;     // f32 values (f32: the values; bf16: the bf16-rounded values)
  AlignedVector<uint16_t> b;  // bf16 bits
  AlignedVector<int8_t> q;    // int8 interleaved (+64 bytes slack for full-vector loads)
  AlignedVector<float> s;     // int8 block scales, zero padded to a multiple of 16
  AlignedVector<int32_t> c;   // int8 offset corrections, zero padded
  std::vector<ActRef> refs;

  bool vec = false;            // the AVX-512 conversions (when the kernels run the AVX-512 path)

  // Room for R rows of length K. The buffers only grow (they live in a per-thread Workspace):
  // set_row writes every value a kernel reads, so nothing needs clearing here.
  void init(int fmt_, int64_t R, int64_t K_, bool vec_) {
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

  // Convert one row of float values (the precision rules of docs/kernels.md).
  void set_row(int64_t r, const float* v) {
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
};

// Scratch memory of one calling thread, kept between calls instead of allocated per call (the
// larger buffers, e.g. W_down h at n = 9: 72 x 2048 floats, came as fresh pages to fault in and
// went back to the OS after the call). It grows to the largest pass seen and is not shrunk.
struct Workspace {
  Acts ax, ah;                      // activations x [n, H] and h [n*m, I] in the format's layout
  AlignedVector<float> gbuf, ubuf;  // W_gate x, W_up x per assignment [n*m, I]
  AlignedVector<float> obuf;        // W_down h per assignment [n*m, H]
};
static Workspace& workspace() {
  thread_local Workspace ws;
  return ws;
}

// ------------------------------------------------------------------------------------------------
// Input checks (the Python layer checks first; these keep a direct op call from crashing).
static void check_inputs(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                         const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                         const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                         const c10::optional<at::Tensor>& sd, int fmt) {
  TORCH_CHECK(x.device().is_cpu() && ids.device().is_cpu() && wg.device().is_cpu() && wu.device().is_cpu() &&
                  wd.device().is_cpu(), "moespec CPU op: every tensor must be on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(0) >= 1,
              "x: expected a contiguous float32 [n, H] tensor with n >= 1, found ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong && ids.is_contiguous() && ids.size(0) == x.size(0),
              "ids: expected a contiguous int64 [n, m] tensor with n = ", x.size(0), ", found ", ids.scalar_type(),
              " ", ids.sizes());
  TORCH_CHECK(wg.dim() == 3 && wu.sizes() == wg.sizes() && wd.dim() == 3, "w_gate, w_up: [N, I, H]; w_down: [N, H, I]");
  const int64_t N = wg.size(0), I = wg.size(1), H = wg.size(2);
  TORCH_CHECK(x.size(1) == H, "x: hidden size ", x.size(1), " does not match the weights' H = ", H);
  TORCH_CHECK(wd.size(0) == N && wd.size(1) == H && wd.size(2) == I, "w_down: expected [", N, ", ", H, ", ", I,
              "], found ", wd.sizes());
  TORCH_CHECK(wg.scalar_type() == wu.scalar_type() && wg.scalar_type() == wd.scalar_type(),
              "w_gate, w_up, w_down must share a dtype");
  TORCH_CHECK(wg.is_contiguous() && wu.is_contiguous() && wd.is_contiguous(), "expert weights must be contiguous");
  TORCH_CHECK(ids.size(1) >= 1 && ids.size(1) <= N, "ids: m = ", ids.size(1), " must be in [1, N = ", N, "]");
  if (gates.has_value()) {
    const auto& g = *gates;
    TORCH_CHECK(g.device().is_cpu() && g.scalar_type() == at::kFloat && g.is_contiguous() && g.sizes() == ids.sizes(),
                "gates: expected a contiguous float32 CPU tensor shaped like ids ", ids.sizes(), ", found ",
                g.scalar_type(), " ", g.sizes());
  }
  if (fmt == I8) {
    TORCH_CHECK(H % BLK == 0 && I % BLK == 0, "int8 weights need H and I multiples of 32; found H = ", H, ", I = ", I);
    TORCH_CHECK(sg.has_value() && su.has_value() && sd.has_value(), "int8 weights need s_gate, s_up and s_down");
    const std::vector<std::pair<const at::Tensor*, std::vector<int64_t>>> want = {
        {&*sg, {N, I, H / BLK}}, {&*su, {N, I, H / BLK}}, {&*sd, {N, H, I / BLK}}};
    for (const auto& p : want)
      TORCH_CHECK(p.first->device().is_cpu() && p.first->scalar_type() == at::kFloat && p.first->is_contiguous() &&
                      p.first->sizes() == at::IntArrayRef(p.second),
                  "int8 scales: expected contiguous float32 ", at::IntArrayRef(p.second), ", found ",
                  p.first->scalar_type(), " ", p.first->sizes());
  } else {
    TORCH_CHECK(!sg.has_value() && !su.has_value() && !sd.has_value(), "scales are only taken with int8 weights");
  }
  const int64_t* id = ids.data_ptr<int64_t>();
  const int64_t n = ids.size(0), m = ids.size(1);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t s = 0; s < m; ++s) {
      TORCH_CHECK(id[t * m + s] >= 0 && id[t * m + s] < N, "ids[", t, ", ", s, "] = ", id[t * m + s],
                  " is outside [0, ", N, ")");
      for (int64_t s2 = 0; s2 < s; ++s2)
        TORCH_CHECK(id[t * m + s2] != id[t * m + s], "ids: token ", t, " selects expert ", id[t * m + s], " twice");
    }
}

// pack_int8_cpu: plain int8 [N, R, K] -> interleaved uint8 (+128) of the same shape.
at::Tensor pack_int8_cpu(const at::Tensor& qin) {
  TORCH_CHECK(qin.device().is_cpu() && qin.scalar_type() == at::kChar, "pack_int8_cpu: expected an int8 CPU tensor, found ",
              qin.scalar_type(), " on ", qin.device());
  TORCH_CHECK(qin.dim() >= 1 && qin.size(-1) % BLK == 0, "pack_int8_cpu: last dimension must be a multiple of 32");
  at::Tensor q = qin.contiguous();
  at::Tensor out = at::empty(q.sizes(), q.options().dtype(at::kByte));
  const int64_t K = q.size(-1), rows = q.numel() / std::max<int64_t>(K, 1), nblk = K / BLK;
  const int8_t* src = q.data_ptr<int8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, rows, 256, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      for (int64_t k = 0; k < K; ++k) dst[r * K + i8_offset(k, nblk)] = (uint8_t)((int32_t)src[r * K + k] + 128);
  });
  return out;
}

// ------------------------------------------------------------------------------------------------
// Work queue with persistent helper threads. An OpenMP parallel region ends in a join that waits
// for every thread of the team, also one that the OS has not yet scheduled: on a shared,
// oversubscribed CPU that costs a whole time slice (measured here: a tiny op took 16 ms with two
// OpenMP threads, 12 us with one). Here the calling thread works through the items itself and
// returns as soon as every item is done; a helper that wakes up late finds no item left and
// touches nothing of the finished call (everything it reads before claiming an item lives in the
// Job, which it holds through a shared_ptr).
//
// Items come in lanes, one per thread: each thread takes its own lane's items in order (a lane is
// a contiguous share of the rows of every matrix, so each thread streams long contiguous runs, as
// a parallel torch.sum does), and when its lane is empty, or its next item must wait, it takes the
// next item of another lane. An item may depend on a flag (a phase-3 item on its group's h); it is
// claimed only once the flag is set.
struct Job {
  std::vector<std::vector<int64_t>> lanes;       // item ids per lane, in order
  std::unique_ptr<std::atomic<int64_t>[]> next;  // next position per lane
  std::vector<int64_t> dep;                      // per item id: the flag it waits for, or -1
  std::unique_ptr<std::atomic<int>[]> flags;     // set by items (through Job::set)
  std::atomic<int64_t> done{0};
  std::atomic<int> seats{0};
  int64_t items = 0;
  std::function<void(int64_t)> item;

  Job(std::vector<std::vector<int64_t>> lanes_, std::vector<int64_t> dep_, int64_t nflags)
      : lanes(std::move(lanes_)), next(new std::atomic<int64_t>[lanes.size()]), dep(std::move(dep_)),
        flags(new std::atomic<int>[std::max<int64_t>(1, nflags)]) {
    for (size_t l = 0; l < lanes.size(); ++l) next[l].store(0, std::memory_order_relaxed), items += (int64_t)lanes[l].size();
    for (int64_t f = 0; f < nflags; ++f) flags[f].store(0, std::memory_order_relaxed);
  }
  void set(int64_t flag) { flags[flag].store(1, std::memory_order_release); }
  // Claim one item, own lane first; -1 when every lane is empty, -2 when the items left must wait.
  int64_t claim(size_t home) {
    bool left = false;
    for (size_t k = 0; k < lanes.size(); ++k) {
      const size_t l = (home + k) % lanes.size();
      int64_t i = next[l].load(std::memory_order_acquire);
      while (i < (int64_t)lanes[l].size()) {
        left = true;
        const int64_t id = lanes[l][i];
        if (dep[id] >= 0 && !flags[dep[id]].load(std::memory_order_acquire)) break;
        if (next[l].compare_exchange_weak(i, i + 1, std::memory_order_acq_rel)) return id;
      }
    }
    return left ? -2 : -1;
  }
  void work(size_t home) {
    for (int spins = 0;;) {
      const int64_t id = claim(home);
      if (id == -1) return;
      if (id == -2) {  // the flag's item runs on another thread
        if (++spins < 64) _mm_pause(); else sched_yield();
        continue;
      }
      spins = 0;
      item(id);
      done.fetch_add(1, std::memory_order_acq_rel);
    }
  }
};

class Pool {
 public:
  static Pool& get() {
    static Pool* pool = new Pool();  // never destroyed: helpers are detached and outlive main()
    return *pool;
  }
  // Run every item of job with the caller (lane 0) plus up to helpers other threads (lanes 1..).
  void run(const std::shared_ptr<Job>& job, int helpers) {
    job->seats.store(helpers, std::memory_order_relaxed);
    if (helpers > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      while ((int)threads_ < helpers) {
        std::thread(&Pool::loop, this).detach();
        ++threads_;
      }
      job_ = job;
      ++gen_;
      cv_.notify_all();
    }
    job->work(0);
    for (int spins = 0; job->done.load(std::memory_order_acquire) < job->items; ++spins) {
      if (spins < 256) _mm_pause(); else sched_yield();  // an item still held by a helper
    }
    if (helpers > 0) {
      std::lock_guard<std::mutex> lk(mu_);
      if (job_ == job) job_.reset();
    }
  }

 private:
  void loop() {
    uint64_t seen = 0;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return gen_ != seen; });
        seen = gen_;
        job = job_;
      }
      if (!job) continue;
      const int seat = job->seats.fetch_sub(1, std::memory_order_relaxed);
      if (seat > 0) job->work((size_t)seat);
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::shared_ptr<Job> job_;
  uint64_t gen_ = 0;
  size_t threads_ = 0;
};

// Which threads help the caller. torch's OpenMP workers (the same libgomp) keep spinning for a
// while after each parallel torch op unless OMP_WAIT_POLICY=passive; a helper of our own pool then
// shares a core with a spinning worker, while an OpenMP team reuses that awake worker at once. On
// an oversubscribed machine the team's closing join can wait for a descheduled member (see Pool),
// which our pool never does. MOESPEC_CPU_THREADS=openmp|pool chooses; the default (auto) takes the
// OpenMP team unless OMP_WAIT_POLICY is passive.
static bool use_openmp_team() {
  auto lower = [](const char* v) {
    std::string s = v ? v : "";
    for (auto& ch : s) ch = (char)std::tolower((unsigned char)ch);
    return s;
  };
  const std::string mode = lower(std::getenv("MOESPEC_CPU_THREADS"));
  if (mode == "openmp") return true;
  if (mode == "pool") return false;
  TORCH_CHECK(mode.empty() || mode == "auto", "MOESPEC_CPU_THREADS must be openmp, pool or auto; found '", mode, "'");
  return lower(std::getenv("OMP_WAIT_POLICY")) != "passive";
}

// ------------------------------------------------------------------------------------------------
// Stage clock: where the time of one call goes (docs/kernels.md, "Where a call's time goes";
// moespec.kernels.call_stages). Off unless switched on; then the driver records steady_clock
// times (CLOCK_MONOTONIC on Linux, the clock of Python's time.monotonic_ns) at its stage
// boundaries into the calling thread's last record. Off, it costs one relaxed load per call.
struct StageTimes {
  int64_t entry = 0;       // the driver's first line
  int64_t setup_done = 0;  // inputs checked, groups, work items and activations ready
  int64_t first_item = 0;  // the first work item starts (on any thread)
  int64_t work_done = 0;   // every work item done
  int64_t exit = 0;        // the output combined (step 4), returning
};
static std::atomic<bool> g_stage_clock{false};
static thread_local StageTimes g_last_stages;
static inline int64_t clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
void set_stage_clock(bool on) { g_stage_clock.store(on, std::memory_order_relaxed); }
// The calling thread's last record as [entry, setup_done, first_item, work_done, exit] (ns), then
// cleared: zeros when no call completed with the clock on since the last read.
std::vector<int64_t> take_last_stages() {
  const StageTimes st = g_last_stages;
  g_last_stages = StageTimes{};
  return {st.entry, st.setup_done, st.first_item, st.work_done, st.exit};
}

// Whether v[0..n) holds no NaN and no +-inf: the largest exponent field must stay below all ones
// (an integer max reduction, which the compiler vectorizes).
static bool all_finite(const float* v, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof bits);
    top = std::max(top, bits & 0x7f800000u);
  }
  return top != 0x7f800000u;
}

// ------------------------------------------------------------------------------------------------
// The driver shared by both kernels.
struct Group {
  int64_t expert;
  int64_t first;  // into the assignment list
  int64_t count;
};

static at::Tensor expert_op(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                            const at::Tensor& wg_in, const at::Tensor& wu_in, const at::Tensor& wd_in,
                            const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                            const c10::optional<at::Tensor>& sd, bool dedup) {
  const bool clock_on = g_stage_clock.load(std::memory_order_relaxed);
  StageTimes st;
  if (clock_on) st.entry = clock_ns();
  std::atomic<int64_t> first_item{0};
  const auto dt = wg_in.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kChar || dt == at::kByte,
              "expert weights: expected float32, bfloat16, int8 (plain) or uint8 (pack_int8_cpu layout), found ", dt);
  const int fmt = dt == at::kFloat ? F32 : (dt == at::kBFloat16 ? BF16 : I8);
  check_inputs(x, ids, gates, wg_in, wu_in, wd_in, sg, su, sd, fmt);
  // Plain int8 is accepted but repacked here, every call; callers keep the packed copy instead.
  at::Tensor wg = dt == at::kChar ? pack_int8_cpu(wg_in) : wg_in;
  at::Tensor wu = dt == at::kChar ? pack_int8_cpu(wu_in) : wu_in;
  at::Tensor wd = dt == at::kChar ? pack_int8_cpu(wd_in) : wd_in;

  const int64_t n = x.size(0), H = x.size(1), m = ids.size(1), I = wg.size(1), A = n * m;
  const int64_t esize = element_bytes(fmt);
  const int isa = isa_for(fmt);
  const DotFn dot = dot_for(fmt, isa);
  const int64_t* id = ids.data_ptr<int64_t>();

  // Groups: per-slot -> one per assignment in token order; dedup -> one per distinct expert.
  std::vector<int64_t> assign(A);
  std::vector<Group> groups;
  if (!dedup) {
    for (int64_t a = 0; a < A; ++a) {
      assign[a] = a;
      groups.push_back({id[a], a, 1});
    }
  } else {
    for (int64_t a = 0; a < A; ++a) assign[a] = a;
    std::stable_sort(assign.begin(), assign.end(), [&](int64_t p, int64_t q) { return id[p] < id[q]; });
    for (int64_t i = 0; i < A; ++i) {
      if (i == 0 || id[assign[i]] != id[assign[i - 1]]) groups.push_back({id[assign[i]], i, 0});
      groups.back().count++;
    }
  }

  Workspace& ws = workspace();
  Acts& ax = ws.ax;
  Acts& ah = ws.ah;
  ax.init(fmt, n, H, isa == AVX512);
  ah.init(fmt, A, I, isa == AVX512);
  const float* xp = x.data_ptr<float>();
  float* const gbuf = grown(ws.gbuf, A * I);
  float* const ubuf = grown(ws.ubuf, A * I);
  float* const obuf = grown(ws.obuf, A * H);
  // the output straight from the CPU allocator (at::zeros went through the dispatcher and a fill:
  // ~20 us per call once the caches are cold); step 4 writes every value
  at::Tensor y = at::detail::empty_cpu({n, H}, at::kFloat, false, c10::nullopt);
  float* yp = y.data_ptr<float>();
  const float* gp = gates.has_value() ? gates->data_ptr<float>() : nullptr;

  const uint8_t* Wg = (const uint8_t*)wg.data_ptr();
  const uint8_t* Wu = (const uint8_t*)wu.data_ptr();
  const uint8_t* Wd = (const uint8_t*)wd.data_ptr();
  const float* Sg = fmt == I8 ? sg->data_ptr<float>() : nullptr;
  const float* Su = fmt == I8 ? su->data_ptr<float>() : nullptr;
  const float* Sd = fmt == I8 ? sd->data_ptr<float>() : nullptr;

  // Work items: (group, matrix, block of rows of ~g_item_bytes): phase 1 = gate and up rows,
  // phase 3 = down rows. There is no barrier: on a shared, oversubscribed CPU a barrier waits for a
  // descheduled thread for a whole time slice, so each thread only waits where data is missing.
  // The thread finishing a group's last phase-1 item prepares the group's h (phase 2) and sets the
  // group's flag; the group's phase-3 items are claimed only after that. Lane l (one per thread)
  // holds the l-th contiguous share of every matrix's row blocks, phase 1 of all groups first.
  g_item_bytes = env_int("MOESPEC_CPU_ITEM_BYTES", 256 * 1024);
  const int64_t rows1 = std::max<int64_t>(1, g_item_bytes / (H * esize));
  const int64_t rows2 = std::max<int64_t>(1, g_item_bytes / (I * esize));
  const int64_t ng = (int64_t)groups.size();
  const int64_t nb1 = (I + rows1 - 1) / rows1, nb2 = (H + rows2 - 1) / rows2;
  const int64_t items1 = ng * 2 * nb1, items = items1 + ng * nb2;  // phase-1 id = (g*2 + mat)*nb1 + block
  const int nt = std::max(1, std::min<int>(at::get_num_threads(), (int)std::max<int64_t>(1, items / 4)));
  std::vector<std::vector<int64_t>> lanes(nt);
  std::vector<int64_t> dep(items, -1);
  // Groups by token count, most first; even lanes take them in that order, odd lanes in reverse, so
  // that a thread on a group whose arithmetic outlasts its reads (several tokens) runs beside one
  // that only streams.
  std::vector<int64_t> order(ng);
  for (int64_t g = 0; g < ng; ++g) order[g] = g;
  std::stable_sort(order.begin(), order.end(), [&](int64_t p, int64_t q) { return groups[p].count > groups[q].count; });
  for (int l = 0; l < nt; ++l) {
    auto group_at = [&](int64_t k) { return order[l % 2 ? ng - 1 - k : k]; };
    for (int64_t k = 0; k < ng; ++k)
      for (int64_t mat = 0, g = group_at(k); mat < 2; ++mat)
        for (int64_t j = l * nb1 / nt; j < (l + 1) * nb1 / nt; ++j) lanes[l].push_back((g * 2 + mat) * nb1 + j);
    for (int64_t k = 0; k < ng; ++k)
      for (int64_t j = l * nb2 / nt, g = group_at(k); j < (l + 1) * nb2 / nt; ++j) lanes[l].push_back(items1 + g * nb2 + j);
  }
  for (int64_t it = items1; it < items; ++it) dep[it] = (it - items1) / nb2;
  auto job = std::make_shared<Job>(std::move(lanes), std::move(dep), ng);
  std::vector<std::atomic<int64_t>> done1(ng);
  for (int64_t g = 0; g < ng; ++g) done1[g].store(0, std::memory_order_relaxed);
  for (int64_t t = 0; t < n; ++t) ax.set_row(t, xp + t * H);  // n <= a few rows: serial

  Job* jp = job.get();
  job->item = [&, jp](int64_t it) {
    if (clock_on && first_item.load(std::memory_order_relaxed) == 0) {
      int64_t none = 0;
      first_item.compare_exchange_strong(none, clock_ns(), std::memory_order_relaxed);
    }
    ActRef refs[TMAX];
    float* outs[TMAX];
    if (it < items1) {
      // 1. gate or up rows for every assignment of the group: g = W_gate x, u = W_up x
      const int64_t gi = it / (2 * nb1), mat = (it / nb1) % 2;
      const Group& G = groups[gi];
      const int64_t r0 = (it % nb1) * rows1, r1 = std::min(I, r0 + rows1);
      const uint8_t* W = mat == 0 ? Wg : Wu;
      const float* S = mat == 0 ? Sg : Su;
      float* dst = mat == 0 ? gbuf : ubuf;
      for (int64_t t0 = 0; t0 < G.count; t0 += TMAX) {
        const int T = (int)std::min<int64_t>(TMAX, G.count - t0);
        for (int j = 0; j < T; ++j) refs[j] = ax.refs[assign[G.first + t0 + j] / m];
        for (int j = 0; j < T; ++j) outs[j] = dst + assign[G.first + t0 + j] * I + r0;
        dot_rows(dot, W, S, esize, H, G.expert * I + r0, r1 - r0, refs, T, outs);
      }
      if (done1[gi].fetch_add(1, std::memory_order_acq_rel) == 2 * nb1 - 1) {
        // 2. h = silu(g) * u in the format's activation layout, for the group's assignments
        for (int64_t j = 0; j < G.count; ++j) {
          const int64_t a = assign[G.first + j];
          float* g = gbuf + a * I;
          const float* u = ubuf + a * I;
          if (isa == AVX512)
            silu_mul_avx512(g, u, I);
          else
            for (int64_t r = 0; r < I; ++r) g[r] = silu_mul1(g[r], u[r]);
          ah.set_row(a, g);
        }
        jp->set(gi);
      }
    } else {
      // 3. down rows: o_a = W_down h_a (claimed only once the group's h is ready)
      const int64_t gi = (it - items1) / nb2;
      const Group& G = groups[gi];
      const int64_t r0 = ((it - items1) % nb2) * rows2, r1 = std::min(H, r0 + rows2);
      for (int64_t t0 = 0; t0 < G.count; t0 += TMAX) {
        const int T = (int)std::min<int64_t>(TMAX, G.count - t0);
        for (int j = 0; j < T; ++j) refs[j] = ah.refs[assign[G.first + t0 + j]];
        for (int j = 0; j < T; ++j) outs[j] = obuf + assign[G.first + t0 + j] * H + r0;
        dot_rows(dot, Wd, Sd, esize, I, G.expert * H + r0, r1 - r0, refs, T, outs);
      }
    }
  };
  if (clock_on) st.setup_done = clock_ns();
  if (nt > 1 && use_openmp_team()) {
#pragma omp parallel num_threads(nt)
    job->work((size_t)omp_get_thread_num());
  } else {
    Pool::get().run(job, nt - 1);
  }
  if (clock_on) st.work_done = clock_ns();
  // 4. y_t = sum_s g_ts o_{t*m+s} (n*m*H flops: serial), then the non-finite rule (docs/kernels.md):
  // a token whose x row or gates hold NaN or +-inf, or whose float32 computation overflowed (a
  // non-finite value anywhere in y_t), gets y_t all NaN; every other row is untouched.
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t s = 0; s < m; ++s) {
      const float gt = gp ? gp[t * m + s] : 1.0f;
      const float* o = obuf + (t * m + s) * H;
      if (s == 0)
        for (int64_t r = 0; r < H; ++r) yp[t * H + r] = gt * o[r];
      else
        for (int64_t r = 0; r < H; ++r) yp[t * H + r] += gt * o[r];
    }
    if (!all_finite(yp + t * H, H) || !all_finite(xp + t * H, H) || (gp && !all_finite(gp + t * m, m)))
      std::fill(yp + t * H, yp + (t + 1) * H, std::numeric_limits<float>::quiet_NaN());
  }
  if (clock_on) {
    st.first_item = first_item.load(std::memory_order_relaxed);
    st.exit = clock_ns();
    g_last_stages = st;
  }
  return y;
}

at::Tensor expert_slot_cpu(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                           const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                           const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                           const c10::optional<at::Tensor>& sd) {
  return expert_op(x, ids, gates, wg, wu, wd, sg, su, sd, false);
}

at::Tensor expert_dedup_cpu(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                            const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                            const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                            const c10::optional<at::Tensor>& sd) {
  return expert_op(x, ids, gates, wg, wu, wd, sg, su, sd, true);
}

// The int8 activation layout the CPU kernels build from x [R, K] (K a multiple of 32), on the ISA
// path in use: (q int8 [R, K] interleaved, scales float32 [R, K/32], corrections int32 [R, K/32]).
// For tests: the AVX-512 and scalar quantizers must agree exactly with moespec.kernels.quantize_blocks.
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_acts_int8_cpu(const at::Tensor& x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.is_contiguous() && x.dim() == 2 &&
                  x.size(1) % BLK == 0,
              "quantize_acts_int8_cpu: expected a contiguous float32 CPU [R, K] tensor with K a multiple of 32, found ",
              x.scalar_type(), " ", x.sizes());
  const int64_t R = x.size(0), K = x.size(1), nblk = K / BLK;
  Acts a;
  a.init(I8, R, K, isa_for(I8) == AVX512);
  for (int64_t r = 0; r < R; ++r) a.set_row(r, x.data_ptr<float>() + r * K);
  at::Tensor q = at::empty({R, K}, x.options().dtype(at::kChar));
  at::Tensor sc = at::empty({R, nblk}, x.options());
  at::Tensor co = at::empty({R, nblk}, x.options().dtype(at::kInt));
  for (int64_t r = 0; r < R; ++r) {
    std::memcpy(q.data_ptr<int8_t>() + r * K, a.q.data() + r * a.qstride, K);
    std::memcpy(sc.data_ptr<float>() + r * nblk, a.s.data() + r * a.sstride, nblk * sizeof(float));
    std::memcpy(co.data_ptr<int32_t>() + r * nblk, a.c.data() + r * a.sstride, nblk * sizeof(int32_t));
  }
  return {q, sc, co};
}

// Micro-kernel throughput (benchmarks/bench_microkernel.py): one thread runs the dot micro-kernel
// of format fmt on the ISA path in use over nrows x K random weights for T tokens, reps passes
// (after one untimed pass); returns nanoseconds per 64 weight bytes. With the rows in L1 or L2
// this is the arithmetic's own pace, without the memory stream.
double microkernel_ns(const std::string& fmt, int64_t T, int64_t nrows, int64_t K, int64_t reps) {
  const int f = format_code(fmt, "microkernel_ns");
  TORCH_CHECK(T >= 1 && T <= TMAX, "microkernel_ns: T must be in [1, ", TMAX, "]; found ", T);
  TORCH_CHECK(nrows >= 1 && reps >= 1, "microkernel_ns: nrows and reps must be >= 1; found ", nrows, ", ", reps);
  TORCH_CHECK(K >= BLK && K % BLK == 0, "microkernel_ns: K must be a positive multiple of 32; found ", K);
  const int isa = isa_for(f);
  const int64_t esize = element_bytes(f);
  AlignedVector<uint8_t> w(nrows * K * esize + 64);  // 64-byte aligned, as torch's weights
  uint32_t state = 12345u;  // small LCG: weights in range for every format (f32 and bf16 in [-1, 1))
  for (int64_t i = 0; i < nrows * K; ++i) {
    state = state * 1664525u + 1013904223u;
    const float v = (float)(state >> 8) / 8388608.0f - 1.0f;
    if (f == F32) ((float*)w.data())[i] = v;
    else if (f == BF16) ((uint16_t*)w.data())[i] = f32_to_bf16(v);
    else w[i] = (uint8_t)(state >> 24);
  }
  AlignedVector<float> ws(nrows * (K / BLK), 1.0f / 127.0f);
  std::vector<float> xv(T * K), out(T * nrows);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.37f * (float)i);
  Acts a;
  a.init(f, T, K, isa == AVX512);
  for (int64_t t = 0; t < T; ++t) a.set_row(t, xv.data() + t * K);
  const DotFn dot = dot_for(f, isa);
  float* o[TMAX];
  for (int64_t t = 0; t < T; ++t) o[t] = out.data() + t * nrows;
  auto pass = [&] { dot_rows(dot, w.data(), f == I8 ? ws.data() : nullptr, esize, K, 0, nrows, a.refs.data(), (int)T, o); };
  pass();
  const int64_t t0 = clock_ns();
  for (int64_t r = 0; r < reps; ++r) pass();
  const int64_t t1 = clock_ns();
  volatile float sink = out[0];  // keep the results live
  (void)sink;
  return (double)(t1 - t0) / ((double)reps * (double)(nrows * K * esize) / 64.0);
}

// Which ISA path the CPU kernels take for a format ("f32", "bf16", "int8_b32") here and now.
std::string cpu_isa(const std::string& fmt) {
  const int f = format_code(fmt, "cpu_isa");
  static const char* names[] = {"portable", "avx2", "avx512"};
  return names[isa_for(f)];
}

std::tuple<int64_t, int64_t, double> read_probe(const at::Tensor& buf, const std::string& pattern, int64_t matrix_bytes,
                                                int64_t threads, int64_t fmas_per_line, int64_t prefetch_bytes);  // read_probe.cpp

}  // namespace moespec

// Direct Python entry points to the same CPU implementations (moespec.kernels.build.load_cpu returns
// this module; expert_forward's cpp backend calls them). A torch.ops call goes through the boxed
// dispatcher, which matches the 9 arguments against the schema: from Python to the function's first
// line took ~45-50 us once the caches were cold (as after a benchmark's flush, or between layers)
// against ~16 us through pybind11, a few percent of a one-token call.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("expert_slot", &moespec::expert_slot_cpu, "per-slot kernel on CPU (same as torch.ops.moespec.expert_slot)");
  m.def("expert_dedup", &moespec::expert_dedup_cpu, "dedup kernel on CPU (same as torch.ops.moespec.expert_dedup)");
  m.def("set_stage_clock", &moespec::set_stage_clock, "switch the per-call stage clock on or off (all threads)");
  m.def("take_last_stages", &moespec::take_last_stages,
        "this thread's last call's stage times [entry, setup_done, first_item, work_done, exit] in ns "
        "(steady_clock), then cleared; zeros when none was recorded");
  m.def("clock_ns", &moespec::clock_ns, "the stage clock's time now (ns)");
  m.def("microkernel_ns", &moespec::microkernel_ns,
        "one thread's dot micro-kernel (format, T tokens) over nrows x K weights, reps passes: ns per 64 weight bytes");
  m.def("read_probe", &moespec::read_probe,
        "stream a CPU buffer once in a read pattern (halves, lanes, whole, side, fused) with the given threads, "
        "multiply-adds per 64-byte line and software-prefetch distance (bytes, 0 = none): (ns, bytes read, checksum); "
        "see read_probe.cpp");
}

TORCH_LIBRARY(moespec, m) {
  m.def("expert_slot(Tensor x, Tensor ids, Tensor? gates, Tensor w_gate, Tensor w_up, Tensor w_down, "
        "Tensor? s_gate, Tensor? s_up, Tensor? s_down) -> Tensor");
  m.def("expert_dedup(Tensor x, Tensor ids, Tensor? gates, Tensor w_gate, Tensor w_up, Tensor w_down, "
        "Tensor? s_gate, Tensor? s_up, Tensor? s_down) -> Tensor");
  m.def("pack_int8_cpu(Tensor q) -> Tensor");
  m.def("cpu_isa(str fmt) -> str", &moespec::cpu_isa);
  m.def("quantize_acts_int8_cpu(Tensor x) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(moespec, CPU, m) {
  m.impl("expert_slot", &moespec::expert_slot_cpu);
  m.impl("expert_dedup", &moespec::expert_dedup_cpu);
  m.impl("pack_int8_cpu", &moespec::pack_int8_cpu);
  m.impl("quantize_acts_int8_cpu", &moespec::quantize_acts_int8_cpu);
}
