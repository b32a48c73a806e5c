// binding.cpp: CUDA implementations of torch.ops.moespec.expert_slot / expert_dedup.
//
// A thin layer over the plain CUDA kernels (moespec_cuda.h): it checks every tensor (device,
// dtype, shape, contiguity) with a message naming the argument, allocates the output and the
// scratch workspace through torch's caching allocator, and launches on the current stream. The
// op schemas are defined by the CPU extension (csrc/cpu/expert_ops.cpp, TORCH_LIBRARY), which is
// loaded first; argument layout as in docs/kernels.md.
//
// Expert id values are not checked here: that would need a device-to-host copy (a sync) on every
// call. expert_forward() checks them before the call; a direct op call with an id outside [0, N)
// gets NaN in that token's output row, never an out-of-bounds read.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <climits>

#include "moespec_cuda.h"

namespace {

void check_cuda_tensor(const at::Tensor& t, const char* name, const at::Device& dev) {
  TORCH_CHECK(t.is_cuda(), "moespec CUDA op: ", name, " must be a CUDA tensor, found it on ", t.device());
  TORCH_CHECK(t.device() == dev, "moespec CUDA op: ", name, " is on ", t.device(), " but x is on ", dev,
              "; all tensors must share one device");
  TORCH_CHECK(t.is_contiguous(), "moespec CUDA op: ", name, " must be contiguous (call .contiguous())");
}

int weight_format(at::ScalarType dt) {
  switch (dt) {
    case at::kFloat: return MOESPEC_W_F32;
    case at::kBFloat16: return MOESPEC_W_BF16;
    case at::kChar: return MOESPEC_W_I8B32;
    case at::kByte:
      TORCH_CHECK(false, "moespec CUDA op: uint8 weights are the CPU's packed int8 layout (pack_int8_cpu); "
                         "CUDA reads the plain int8 tensors of ExpertWeights");
    default:
      TORCH_CHECK(false, "moespec CUDA op: expert weights must be float32, bfloat16 or int8, found ", dt);
  }
  return -1;
}

void check_scale(const c10::optional<at::Tensor>& s, const char* name, at::IntArrayRef want, const at::Device& dev) {
  TORCH_CHECK(s.has_value(), "moespec CUDA op: int8 weights need ", name, " (float32 ", want, ")");
  check_cuda_tensor(*s, name, dev);
  TORCH_CHECK(s->scalar_type() == at::kFloat && s->sizes() == want, "moespec CUDA op: ", name,
              ": expected float32 ", want, ", found ", s->scalar_type(), " ", s->sizes());
}

at::Tensor expert_cuda(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                       const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                       const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                       const c10::optional<at::Tensor>& sd, int kernel) {
  const auto dev = x.device();
  check_cuda_tensor(x, "x", dev);
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "moespec CUDA op: x: expected float32 [n, H], found ",
              x.scalar_type(), " ", x.sizes());
  check_cuda_tensor(ids, "ids", dev);
  TORCH_CHECK(ids.dim() == 2 && ids.scalar_type() == at::kLong && ids.size(0) == x.size(0),
              "moespec CUDA op: ids: expected int64 [n, m] with n = ", x.size(0), ", found ", ids.scalar_type(),
              " ", ids.sizes());
  for (const auto& p : {std::make_pair(&wg, "w_gate"), std::make_pair(&wu, "w_up"), std::make_pair(&wd, "w_down")}) {
    check_cuda_tensor(*p.first, p.second, dev);
    TORCH_CHECK(p.first->dim() == 3, "moespec CUDA op: ", p.second, " must be 3-D, found ", p.first->sizes());
  }
  TORCH_CHECK(wg.scalar_type() == wu.scalar_type() && wg.scalar_type() == wd.scalar_type(),
              "moespec CUDA op: w_gate, w_up, w_down must share a dtype; found ", wg.scalar_type(), ", ",
              wu.scalar_type(), ", ", wd.scalar_type());
  const int fmt = weight_format(wg.scalar_type());
  const int64_t N = wg.size(0), I = wg.size(1), H = wg.size(2), n = x.size(0), m = ids.size(1);
  TORCH_CHECK(wu.sizes() == wg.sizes(), "moespec CUDA op: w_up: expected ", wg.sizes(), " like w_gate, found ",
              wu.sizes());
  TORCH_CHECK(wd.size(0) == N && wd.size(1) == H && wd.size(2) == I, "moespec CUDA op: w_down: expected [", N, ", ",
              H, ", ", I, "], found ", wd.sizes());
  TORCH_CHECK(x.size(1) == H, "moespec CUDA op: x: hidden size ", x.size(1), " does not match the weights' H = ", H);
  TORCH_CHECK(m >= 1 && m <= N, "moespec CUDA op: ids: m = ", m, " must be in [1, N = ", N, "]");
  TORCH_CHECK(N < INT_MAX && H < INT_MAX && I < INT_MAX && n * m < INT_MAX / 2,
              "moespec CUDA op: sizes too large for 32-bit indexing: N = ", N, ", H = ", H, ", I = ", I,
              ", n*m = ", n * m);
  if (gates.has_value()) {
    check_cuda_tensor(*gates, "gates", dev);
    TORCH_CHECK(gates->scalar_type() == at::kFloat && gates->sizes() == ids.sizes(),
                "moespec CUDA op: gates: expected float32 shaped like ids ", ids.sizes(), ", found ",
                gates->scalar_type(), " ", gates->sizes());
  }
  if (fmt == MOESPEC_W_I8B32) {
    TORCH_CHECK(H % 32 == 0 && I % 32 == 0, "moespec CUDA op: int8 weights need H and I multiples of 32; found H = ",
                H, ", I = ", I);
    check_scale(sg, "s_gate", {N, I, H / 32}, dev);
    check_scale(su, "s_up", {N, I, H / 32}, dev);
    check_scale(sd, "s_down", {N, H, I / 32}, dev);
  } else {
    TORCH_CHECK(!sg.has_value() && !su.has_value() && !sd.has_value(),
                "moespec CUDA op: scales are only taken with int8 weights");
  }

  const c10::cuda::CUDAGuard guard(dev);
  at::Tensor y = at::empty({n, H}, x.options());
  if (n == 0) return y;

  moespec_expert_args a{};
  a.n = (int)n; a.m = (int)m; a.N = (int)N; a.H = (int)H; a.I = (int)I;
  a.x = x.data_ptr<float>();
  a.ids = ids.data_ptr<int64_t>();
  a.gates = gates.has_value() ? gates->data_ptr<float>() : nullptr;
  a.w_fmt = fmt;
  a.w_gate = wg.data_ptr();
  a.w_up = wu.data_ptr();
  a.w_down = wd.data_ptr();
  if (fmt == MOESPEC_W_I8B32) {
    a.s_gate = sg->data_ptr<float>();
    a.s_up = su->data_ptr<float>();
    a.s_down = sd->data_ptr<float>();
  }
  a.y = y.data_ptr<float>();
  size_t bytes = 0;
  int st = moespec_cuda_workspace_bytes(&a, kernel, &bytes);
  TORCH_CHECK(st == MOESPEC_OK, "moespec CUDA op: ", moespec_cuda_status_string(st));
  at::Tensor work = at::empty({(int64_t)bytes}, x.options().dtype(at::kByte));
  a.workspace = work.data_ptr();
  a.workspace_bytes = bytes;
  st = moespec_cuda_expert_forward(&a, kernel, c10::cuda::getCurrentCUDAStream(dev.index()).stream());
  TORCH_CHECK(st == MOESPEC_OK, "moespec CUDA op (", kernel == MOESPEC_DEDUP ? "expert_dedup" : "expert_slot",
              "): ", moespec_cuda_status_string(st));
  return y;
}

at::Tensor expert_slot_cuda(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                            const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                            const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                            const c10::optional<at::Tensor>& sd) {
  return expert_cuda(x, ids, gates, wg, wu, wd, sg, su, sd, MOESPEC_SLOT);
}

at::Tensor expert_dedup_cuda(const at::Tensor& x, const at::Tensor& ids, const c10::optional<at::Tensor>& gates,
                             const at::Tensor& wg, const at::Tensor& wu, const at::Tensor& wd,
                             const c10::optional<at::Tensor>& sg, const c10::optional<at::Tensor>& su,
                             const c10::optional<at::Tensor>& sd) {
  return expert_cuda(x, ids, gates, wg, wu, wd, sg, su, sd, MOESPEC_DEDUP);
}

}  // namespace

TORCH_LIBRARY_IMPL(moespec, CUDA, m) {
  m.impl("expert_slot", &expert_slot_cuda);
  m.impl("expert_dedup", &expert_dedup_cuda);
}
