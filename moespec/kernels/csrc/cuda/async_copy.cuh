// async_copy.cuh: the few PTX instructions of the fused path, behind small functions.
//
//   cp_async16 / cp_async4   cp.async (sm_80+): copy 16 (4) bytes global -> shared without
//                            holding registers; 16-byte copies bypass L1 (.cg), 4-byte ones
//                            cannot (.ca). Both addresses aligned to the size.
//   cp_async_commit          close the copies issued so far into a group;
//   cp_async_wait(newest)    wait until every committed group but the `newest` latest is complete
//                            (the issuing thread's own copies only: a thread that reads bytes
//                            another thread copied needs a barrier after both waited);
//   pdl_launch_dependents    programmatic dependent launch (sm_90+): the next kernel on the stream,
//                            if launched with programmatic stream serialization, may start once
//                            every block of this one has called this or exited;
//   pdl_wait                 in that dependent kernel: wait until the kernel before it has
//                            completed and its memory writes are visible (no-op without PDL).
//
// Under the CPU emulation (tests/cuda_emu, MOESPEC_CUDA_EMULATION) the emulator supplies these,
// deferring each copy to its wait and running a dependent kernel's threads up to pdl_wait before
// the kernel it depends on, so that a missing wait shows up as wrong results there. The PTX below
// is checked by nvcc only (tests/test_cuda_compile.py) and on a GPU.
#ifndef MOESPEC_ASYNC_COPY_CUH
#define MOESPEC_ASYNC_COPY_CUH

#include <cuda_runtime.h>

namespace moespec_cuda {

#if defined(MOESPEC_CUDA_EMULATION)
inline void cp_async16(void* smem, const void* gmem) { emu::cp_async(smem, gmem, 16); }
inline void cp_async4(void* smem, const void* gmem) { emu::cp_async(smem, gmem, 4); }
inline void cp_async_commit() { emu::cp_async_commit(); }
inline void cp_async_wait(int newest) { emu::cp_async_wait(newest); }
inline void pdl_launch_dependents() {}
inline void pdl_wait() { emu::pdl_wait(); }
#elif defined(__CUDACC__)
__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
#else
  *static_cast<int4*>(smem) = __ldg(static_cast<const int4*>(gmem));
#endif
}

__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_u32(smem)), "l"(gmem) : "memory");
#else
  *static_cast<float*>(smem) = __ldg(static_cast<const float*>(gmem));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait_n() {
#if __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// wait_group takes an immediate: the ring depths used at run time are 2..8 stages (newest 1..7).
__device__ __forceinline__ void cp_async_wait(int newest) {
  switch (newest) {
    case 0: cp_async_wait_n<0>(); break;
    case 1: cp_async_wait_n<1>(); break;
    case 2: cp_async_wait_n<2>(); break;
    case 3: cp_async_wait_n<3>(); break;
    case 4: cp_async_wait_n<4>(); break;
    case 5: cp_async_wait_n<5>(); break;
    case 6: cp_async_wait_n<6>(); break;
    default: cp_async_wait_n<7>(); break;
  }
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
#endif

}  // namespace moespec_cuda

#endif  // MOESPEC_ASYNC_COPY_CUH
