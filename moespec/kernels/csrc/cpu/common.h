// Formats, layouts and scalar helpers shared by every part of the CPU extension
// (docs/kernels.md, "CPU extension"; the files of this folder are listed there).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

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

// Targets of the ISA paths (function attributes: the extension is compiled for the baseline ISA
// and picks a path at run time, dot.h).
#define TGT_AVX2 __attribute__((target("avx2,fma")))
#define TGT_512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define TGT_512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx2,fma")))
#define TGT_512VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")))

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

// An integer setting from the environment (tuning knobs read at each call), dflt when unset.
static inline int64_t env_int(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : dflt;
}
// Whether v[0..n) holds no NaN and no +-inf: the largest exponent field must stay below all ones
// (an integer max reduction, which the compiler vectorizes).
static inline bool all_finite(const float* v, int64_t n) {
  uint32_t top = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof bits);
    top = std::max(top, bits & 0x7f800000u);
  }
  return top != 0x7f800000u;
}

// Bytes per weight value of a format.
static inline int64_t element_bytes(int fmt) { return fmt == F32 ? 4 : (fmt == BF16 ? 2 : 1); }

// A format's code from its name ("f32", "bf16", "int8_b32"); who names the caller in the error
// (isa.cpp).
int format_code(const std::string& fmt, const char* who);

}  // namespace moespec
