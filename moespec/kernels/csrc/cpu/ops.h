// The extension's entry points, as registration.cpp exposes them (torch.ops.moespec.* and the
// extension module's functions); docs/kernels.md, "Op schemas".
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

namespace moespec {

// driver.cpp: the expert operation, per-slot (dedup false) or deduplicating (dedup true).
at::Tensor expert_op(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                     const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                     const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                     const c10::optional<at::Tensor>& sd, bool dedup);

// The registered ops (registration.cpp): expert_cpu<false> is expert_slot, expert_cpu<true> expert_dedup.
template <bool Dedup>
at::Tensor expert_cpu(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                      const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                      const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                      const c10::optional<at::Tensor>& sd) {
  return expert_op(x, ids, gates, wg, wu, wd, sg, su, sd, Dedup);
}

// dense.cpp: the dense linear y = x W^T [n, N] on the same dot kernels (w [N, K] f32, bf16, plain int8 or
// packed uint8; s: int8 block scales [N, K/32]).
at::Tensor dense_cpu(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& s);

// int8_layout.cpp: plain int8 [N, R, K] -> interleaved uint8 (+128) of the same shape; the int8
// activation layout the kernels build from x [R, K] (q, scales, corrections), for tests.
at::Tensor pack_int8_cpu(const at::Tensor& qin);
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_acts_int8_cpu(const at::Tensor& x);

// isa.cpp: which ISA path the CPU kernels take for a format ("f32", "bf16", "int8_b32").
std::string cpu_isa(const std::string& fmt);

// Instrumentation: the stage clock (stage_clock.h), the micro-kernels' pace (microbench.cpp), the
// memory read probe (read_probe.cpp).
double microkernel_ns(const std::string& fmt, int64_t T, int64_t nrows, int64_t K, int64_t reps);
std::tuple<int64_t, int64_t, double> read_probe(const at::Tensor& buf, const std::string& pattern, int64_t matrix_bytes,
                                                int64_t threads, int64_t fmas_per_line, int64_t prefetch_bytes);

}  // namespace moespec
