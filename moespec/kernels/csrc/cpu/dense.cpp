// The dense linear y = x W^T of the weights a pass reads once outside the experts (attention
// projections, the LM head: docs/engine.md, "The byte-faithful subjects"), on the expert
// operation's dot kernels (dot.h), activation layouts (activations.h) and threads (thread_pool.h):
// W's rows in blocks of about MOESPEC_CPU_ITEM_BYTES, one contiguous share of the blocks per thread
// (a lane), each row streamed once for every token of the pass (up to TMAX per kernel call).
#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>

#include <limits>
#include <memory>

#include "activations.h"
#include "dot.h"
#include "ops.h"
#include "thread_pool.h"

namespace moespec {

at::Tensor dense_cpu(const at::Tensor& x, const at::Tensor& w_in, const c10::optional<at::Tensor>& s) {
  TORCH_CHECK(x.device().is_cpu() && w_in.device().is_cpu(), "moespec dense: every tensor must be on the CPU");
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(0) >= 1,
              "x: expected a contiguous float32 [n, K] tensor with n >= 1, found ", x.scalar_type(), " ", x.sizes());
  const auto dt = w_in.scalar_type();
  TORCH_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kChar || dt == at::kByte,
              "w: expected float32, bfloat16, int8 (plain) or uint8 (pack_int8_cpu layout), found ", dt);
  TORCH_CHECK(w_in.dim() == 2 && w_in.is_contiguous(), "w: expected a contiguous [N, K] matrix, found ", w_in.sizes());
  const int fmt = dt == at::kFloat ? F32 : (dt == at::kBFloat16 ? BF16 : I8);
  const int64_t n = x.size(0), K = x.size(1), N = w_in.size(0);
  TORCH_CHECK(w_in.size(1) == K, "x: K = ", K, " does not match the weights' K = ", w_in.size(1));
  if (fmt == I8) {
    TORCH_CHECK(K % BLK == 0, "int8 weights need K a multiple of 32; found K = ", K);
    TORCH_CHECK(s.has_value() && s->device().is_cpu() && s->scalar_type() == at::kFloat && s->is_contiguous() &&
                    s->dim() == 2 && s->size(0) == N && s->size(1) == K / BLK,
                "int8 weights need contiguous float32 scales [", N, ", ", K / BLK, "]");
  } else {
    TORCH_CHECK(!s.has_value(), "scales are only taken with int8 weights");
  }
  // Plain int8 is accepted but repacked here, every call; callers keep the packed copy instead.
  const at::Tensor w = dt == at::kChar ? pack_int8_cpu(w_in.view({1, N, K})).view({N, K}) : w_in;
  const int64_t esize = element_bytes(fmt);
  const int isa = isa_for(fmt);
  const DotFn dot = dot_for(fmt, isa);

  // The calling thread's workspace (driver.cpp's Workspace holds the expert op's own), taken by
  // reference: inside the lambda below a thread_local name would denote the *worker's* instance.
  thread_local Acts caller_acts;
  Acts& ax = caller_acts;
  ax.init(fmt, n, K, isa == AVX512);
  const float* xp = x.data_ptr<float>();
  for (int64_t t = 0; t < n; ++t) ax.set_row(t, xp + t * K);
  at::Tensor y = at::detail::empty_cpu({n, N}, at::kFloat, false, c10::nullopt);
  float* yp = y.data_ptr<float>();
  const uint8_t* W = (const uint8_t*)w.data_ptr();
  const float* S = fmt == I8 ? s->data_ptr<float>() : nullptr;

  const int64_t rows = std::max<int64_t>(1, env_int("MOESPEC_CPU_ITEM_BYTES", 256 * 1024) / (K * esize));
  const int64_t items = (N + rows - 1) / rows;
  const int nt = std::max(1, std::min<int>(at::get_num_threads(), (int)std::max<int64_t>(1, items / 4)));
  std::vector<std::vector<int64_t>> lanes(nt);
  for (int l = 0; l < nt; ++l)
    for (int64_t j = l * items / nt; j < (l + 1) * items / nt; ++j) lanes[l].push_back(j);
  auto job = std::make_shared<Job>(std::move(lanes), std::vector<int64_t>(items, -1), 0);
  job->item = [&](int64_t it) {
    const int64_t r0 = it * rows, r1 = std::min(N, r0 + rows);
    ActRef refs[TMAX];
    float* outs[TMAX];
    for (int64_t t0 = 0; t0 < n; t0 += TMAX) {
      const int T = (int)std::min<int64_t>(TMAX, n - t0);
      for (int j = 0; j < T; ++j) refs[j] = ax.refs[t0 + j], outs[j] = yp + (t0 + j) * N + r0;
      dot_rows(dot, W, S, esize, K, r0, r1 - r0, refs, T, outs);
    }
  };
  run_job(job, nt);
  // The non-finite rule of the expert operation (docs/kernels.md): a token whose x row holds NaN or
  // +-inf, or whose float32 result overflowed, gets its whole output row NaN.
  for (int64_t t = 0; t < n; ++t)
    if (!all_finite(yp + t * N, N) || !all_finite(xp + t * K, K))
      std::fill(yp + t * N, yp + (t + 1) * N, std::numeric_limits<float>::quiet_NaN());
  return y;
}

}  // namespace moespec
