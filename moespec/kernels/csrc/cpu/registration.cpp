// Registration: the op schemas (TORCH_LIBRARY(moespec, m): this library owns them; the CUDA
// library adds its implementations with TORCH_LIBRARY_IMPL(moespec, CUDA, m)), the CPU
// implementations, and the extension module's direct entry points (pybind11).
#include <torch/extension.h>

#include "ops.h"
#include "stage_clock.h"

// Direct Python entry points to the same CPU implementations (moespec.kernels.build.load_cpu returns
// this module; expert_forward's cpp backend calls them). A torch.ops call goes through the boxed
// dispatcher, which matches the 9 arguments against the schema and costs more than pybind11's call
// (docs/kernels.md, "Entry from Python").
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("expert_slot", &moespec::expert_cpu<false>, "per-slot kernel on CPU (same as torch.ops.moespec.expert_slot)");
  m.def("expert_dedup", &moespec::expert_cpu<true>, "dedup kernel on CPU (same as torch.ops.moespec.expert_dedup)");
  m.def("dense", &moespec::dense_cpu, "dense linear y = x W^T on CPU (same as torch.ops.moespec.dense)");
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
  m.def("dense(Tensor x, Tensor w, Tensor? s) -> Tensor");
  m.def("pack_int8_cpu(Tensor q) -> Tensor");
  m.def("cpu_isa(str fmt) -> str", &moespec::cpu_isa);
  m.def("quantize_acts_int8_cpu(Tensor x) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(moespec, CPU, m) {
  m.impl("expert_slot", &moespec::expert_cpu<false>);
  m.impl("expert_dedup", &moespec::expert_cpu<true>);
  m.impl("dense", &moespec::dense_cpu);
  m.impl("pack_int8_cpu", &moespec::pack_int8_cpu);
  m.impl("quantize_acts_int8_cpu", &moespec::quantize_acts_int8_cpu);
}
