// The dot micro-kernels' own pace (benchmarks/bench_microkernel.py; docs/kernels.md, "The
// micro-kernels' own pace").
#include <c10/util/Exception.h>

#include <cmath>
#include <vector>

#include "activations.h"
#include "dot.h"
#include "ops.h"
#include "stage_clock.h"

namespace moespec {

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

}  // namespace moespec
