// The int8 layout as ops: weights packed into the interleaved layout (pack_int8_cpu) and, for
// tests, the kernels' int8 activations (quantize_acts_int8_cpu); docs/kernels.md, "CPU int8 layout".
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "activations.h"
#include "dot.h"
#include "ops.h"

namespace moespec {

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

}  // namespace moespec
