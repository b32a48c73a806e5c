// The dot kernels: T <= TMAX activations against a block of consecutive weight rows, one
// implementation per format and ISA (dot_portable.cpp, dot_avx2.cpp, dot_avx512.cpp), the choice of
// the ISA path at run time (isa.cpp) and the row loop every caller uses (dot_rows).
#pragma once

#include "common.h"

namespace moespec {

// out[t][r] = row r . activation t, for nrows <= ROWS_PER_CALL consecutive rows of a matrix (row r
// at w + r * K elements, int8 scales at ws + r * K / 32) and T <= TMAX tokens; out[t] points at
// token t's destination for the first row. One call covers a block of rows, the row loop inside
// the ISA-specific function (one indirect call per 64 rows).
constexpr int ROWS_PER_CALL = 64;
using DotFn = void (*)(const void* w, const float* ws, int nrows, int64_t K, const ActRef* acts, int T, float* const* out);

// One function per (format, ISA path), switching on the token count T at run time.
void dot_f32_portable_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);
void dot_bf16_portable_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);
void dot_i8_portable_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);
void dot_f32_avx2_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);
void dot_bf16_avx2_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);
void dot_i8_avx2_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);
void dot_f32_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);
void dot_bf16_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);
void dot_i8_avx512_fn(const void* w, const float* ws, int nrows, int64_t K, const ActRef* a, int T, float* const* out);

// The ISA path used for a format on this CPU: the highest the CPU has and MOESPEC_CPU_ISA allows
// (isa.cpp).
int isa_for(int fmt);
// Whether MOESPEC_CPU_ISA leaves the AVX-512 level allowed (read_probe.cpp's loops follow the cap).
bool isa_cap_allows_avx512();
// The dot kernel of a format on an ISA path.
DotFn dot_for(int fmt, int isa);

// KERNEL<T> ARGS with the token count T (1..9) as a compile-time constant.
#define MOESPEC_SWITCH_T(KERNEL, ARGS)       \
  switch (T) {                               \
    case 1: KERNEL<1> ARGS; break;           \
    case 2: KERNEL<2> ARGS; break;           \
    case 3: KERNEL<3> ARGS; break;           \
    case 4: KERNEL<4> ARGS; break;           \
    case 5: KERNEL<5> ARGS; break;           \
    case 6: KERNEL<6> ARGS; break;           \
    case 7: KERNEL<7> ARGS; break;           \
    case 8: KERNEL<8> ARGS; break;           \
    default: KERNEL<9> ARGS; break;          \
  }

// Rows [row0, row0 + nrows) of a weight matrix W with K values per row (element size esize; the
// int8 block scales S, or null) against T activations, in micro-kernel calls of up to ROWS_PER_CALL
// rows; out[t] receives token t's result of row row0, the following rows after it.
static inline void dot_rows(DotFn dot, const uint8_t* W, const float* S, int64_t esize, int64_t K, int64_t row0,
                     int64_t nrows, const ActRef* refs, int T, float* const* out) {
  float* o[TMAX];
  for (int64_t r = 0; r < nrows; r += ROWS_PER_CALL) {
    for (int t = 0; t < T; ++t) o[t] = out[t] + r;
    dot(W + (row0 + r) * K * esize, S ? S + (row0 + r) * (K / BLK) : nullptr,
        (int)std::min<int64_t>(ROWS_PER_CALL, nrows - r), K, refs, T, o);
  }
}

}  // namespace moespec
