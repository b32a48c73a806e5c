// Memory read probe (benchmarks/bench_read_patterns.py; docs/kernels.md, "How the read pattern
// matters"): threads stream a buffer in one of the access patterns the CPU kernels use, with no
// arithmetic of their own beyond a running sum, so that a pattern's read rate can be set beside
// torch.sum's (the benchmarks' read reference) in one interleaved run.
//
//   halves  each thread reads one contiguous share of the buffer (as a parallel torch.sum does)
//   lanes   the buffer as consecutive "matrices" of matrix_bytes; thread t reads share t of each
//           matrix in turn (the CPU driver's lanes: a contiguous share of every matrix's rows)
//   whole   the same matrices dealt whole: thread t reads matrices t, t + threads, ...
//   side    the first 8/9 of the buffer in 512-byte units, each with the matching 64 bytes of the
//           last 1/9 (int8 weights with their block scales in a separate array: two streams)
//   fused   576-byte units (the same bytes as "side", in one stream)
//
// fmas_per_line adds that many dependent vector multiply-adds per 64-byte line (one chain for each
// line of a group of four, so four chains run side by side), to see whether arithmetic between the
// loads changes the read rate; prefetch_bytes adds a software prefetch of the line that far ahead.
// Loads are 512-bit where the CPU has AVX-512 and MOESPEC_CPU_ISA does not cap it (as for the
// kernels), else a portable loop.

#include <ATen/ATen.h>

#include <immintrin.h>
#include <omp.h>

#include <chrono>
#include <functional>
#include <cstdint>
#include <string>
#include <tuple>

#include "dot.h"  // isa_cap_allows_avx512: MOESPEC_CPU_ISA, as the kernels read it

namespace moespec {


namespace {

constexpr int64_t LINE = 64, UNIT = 512, SIDE = 64;

// Sum of the floats in [p, p + n) (n a multiple of 256), with f multiply-adds per 64-byte line, a
// prefetch pf bytes ahead (0: none) and, with side, 64 bytes of side per unit bytes of p.
__attribute__((target("avx512f"))) float stream_avx512(const uint8_t* p, int64_t n, int f, int64_t pf,
                                                       const uint8_t* side = nullptr, int64_t unit = 0) {
  __m512 a[4], m[4];
  for (int i = 0; i < 4; ++i) a[i] = m[i] = _mm512_setzero_ps();
  for (int64_t o = 0, u = 0; o < n; o += 4 * LINE) {
    for (int i = 0; i < 4; ++i) {  // line i of four: its own chain of f multiply-adds
      if (pf > 0) _mm_prefetch((const char*)p + o + i * LINE + pf, _MM_HINT_T0);
      const __m512 v = _mm512_loadu_ps(p + o + i * LINE);
      a[i] = _mm512_add_ps(a[i], v);
      for (int k = 0; k < f; ++k) m[i] = _mm512_fmadd_ps(v, v, m[i]);
    }
    if (side && (o + 4 * LINE) % unit == 0) a[0] = _mm512_add_ps(a[0], _mm512_loadu_ps(side + (u++) * SIDE));
  }
  for (int i = 0; i < 4; ++i) a[i] = _mm512_add_ps(a[i], m[i]);
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])));
}

float stream_generic(const uint8_t* p, int64_t n, int f, int64_t pf, const uint8_t* side = nullptr, int64_t unit = 0) {
  float a[16] = {}, m = 0.f;
  for (int64_t o = 0, u = 0; o < n; o += LINE) {
    if (pf > 0) __builtin_prefetch(p + o + pf);
    const float* v = (const float*)(p + o);
    for (int l = 0; l < 16; ++l) a[l] += v[l];
    for (int k = 0; k < f; ++k) m += v[k % 16] * v[(k + 1) % 16];
    if (side && (o + LINE) % unit == 0) {
      const float* sv = (const float*)(side + (u++) * SIDE);
      for (int l = 0; l < 16; ++l) a[l] += sv[l];
    }
  }
  float s = m;
  for (float v : a) s += v;
  return s;
}


float stream(const uint8_t* p, int64_t n, int f, int64_t pf, bool avx512, const uint8_t* side = nullptr,
             int64_t unit = 0) {
  return avx512 ? stream_avx512(p, n, f, pf, side, unit) : stream_generic(p, n, f, pf, side, unit);
}

}  // namespace

// Streams buf (a contiguous CPU tensor of at least 1 MiB) once in pattern with threads threads,
// prefetching each line's successor prefetch_bytes ahead (0: none; past a share's end is harmless,
// prefetches do not fault); returns (nanoseconds, bytes read, checksum). See the file comment.
std::tuple<int64_t, int64_t, double> read_probe(const at::Tensor& buf, const std::string& pattern, int64_t matrix_bytes,
                                                int64_t threads, int64_t fmas_per_line, int64_t prefetch_bytes) {
  TORCH_CHECK(buf.device().is_cpu() && buf.is_contiguous(), "read_probe: expected a contiguous CPU tensor");
  TORCH_CHECK(threads >= 1 && threads <= 256, "read_probe: threads must be in [1, 256]; found ", threads);
  TORCH_CHECK(fmas_per_line >= 0 && fmas_per_line <= 64, "read_probe: fmas_per_line must be in [0, 64]; found ",
              fmas_per_line);
  const int64_t total = buf.numel() * buf.element_size();
  TORCH_CHECK(total >= (1 << 20), "read_probe: the buffer must hold at least 1 MiB; found ", total, " bytes");
  const uint8_t* base = (const uint8_t*)buf.data_ptr();
  TORCH_CHECK(prefetch_bytes >= 0 && prefetch_bytes % LINE == 0 && prefetch_bytes <= (1 << 20),
              "read_probe: prefetch_bytes must be a multiple of 64 in [0, 1 MiB]; found ", prefetch_bytes);
  const int f = (int)fmas_per_line;
  const int64_t pf = prefetch_bytes;
  // the AVX-512 loop where the CPU has it and MOESPEC_CPU_ISA does not cap it, as for the kernels
  const bool v = __builtin_cpu_supports("avx512f") && isa_cap_allows_avx512();
  const int64_t T = threads;
  // every share a multiple of 4 KiB (and of the 512/576-byte units where they apply)
  auto share = [&](int64_t bytes, int64_t align) { return bytes / T / align * align; };
  int64_t bytes = 0;
  std::function<float(int64_t)> body;
  if (pattern == "halves") {
    const int64_t s = share(total, 4096);
    bytes = s * T;
    body = [&, s](int64_t t) { return stream(base + t * s, s, f, pf, v); };
  } else if (pattern == "lanes") {
    TORCH_CHECK(matrix_bytes >= 4096 * T && matrix_bytes <= total,
                "read_probe: matrix_bytes must be in [4096 x threads, buffer size]; found ", matrix_bytes);
    const int64_t nm = total / matrix_bytes, s = share(matrix_bytes, 256);
    bytes = nm * s * T;
    body = [&, nm, s](int64_t t) {
      float acc = 0.f;
      for (int64_t k = 0; k < nm; ++k) acc += stream(base + k * matrix_bytes + t * s, s, f, pf, v);
      return acc;
    };
  } else if (pattern == "whole") {
    TORCH_CHECK(matrix_bytes >= 4096 && matrix_bytes % 256 == 0 && matrix_bytes * T <= total,
                "read_probe: matrix_bytes must be a multiple of 256 in [4096, buffer size / threads]; found ", matrix_bytes);
    const int64_t nm = total / matrix_bytes / T * T;
    bytes = nm * matrix_bytes;
    body = [&, nm](int64_t t) {
      float acc = 0.f;
      for (int64_t k = t; k < nm; k += T) acc += stream(base + k * matrix_bytes, matrix_bytes, f, pf, v);
      return acc;
    };
  } else if (pattern == "side") {
    const int64_t units = share(total / (UNIT + SIDE), 8);  // per thread
    const uint8_t* side = base + units * T * UNIT;
    bytes = units * T * (UNIT + SIDE);
    body = [&, units, side](int64_t t) {
      return stream(base + t * units * UNIT, units * UNIT, f, pf, v, side + t * units * SIDE, UNIT);
    };
  } else if (pattern == "fused") {
    const int64_t units = share(total / (UNIT + SIDE), 8);
    bytes = units * T * (UNIT + SIDE);
    body = [&, units](int64_t t) { return stream(base + t * units * (UNIT + SIDE), units * (UNIT + SIDE), f, pf, v); };
  } else {
    TORCH_CHECK(false, "read_probe: pattern must be halves, lanes, whole, side or fused; found '", pattern, "'");
  }
  double checksum = 0.0;
  int ran = 0;
  const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads((int)T) reduction(+ : checksum, ran)
  {
    const int t = omp_get_thread_num();
    if (t < T && omp_get_num_threads() == T) {
      checksum += body(t);
      ran += 1;
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  TORCH_CHECK(ran == T, "read_probe: OpenMP gave fewer than ", T, " threads");
  return {std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count(), bytes, checksum};
}

}  // namespace moespec
