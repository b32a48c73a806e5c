// A CPU emulation of the small part of CUDA that moespec's kernels use, for running the real
// kernel source on a machine without a GPU (tests/test_cuda_emulated.py).
//
// Every CUDA thread is a cooperative fiber (started with makecontext, switched with
// _setjmp/_longjmp, which skip the signal-mask system call of swapcontext; compile with
// -U_FORTIFY_SOURCE, whose longjmp check rejects a jump to another stack); one block runs at a time, its threads
// interleaved by a scheduler that advances each fiber to its next synchronization point:
// __syncthreads() waits for every live thread of the block, warp primitives (shuffles, ballot)
// for the 32 lanes of the warp. A synchronization that cannot complete (e.g. __syncthreads in a
// divergent branch, a shuffle some lanes never reach) aborts with "deadlock", which on a GPU
// would be undefined behaviour. Shared memory (`__shared__` variables, dynamic shared memory)
// is per block; dynamic shared memory is filled with 0xCD before each block so that reads of
// unwritten bytes show up as wrong results. Global memory is host memory. Launches check the
// dynamic shared-memory limit (48 KiB unless raised with cudaFuncSetAttribute, at most the
// opt-in limit of an sm_90 GPU) as the CUDA runtime does.
#ifndef MOESPEC_CUDA_EMU_RUNTIME_H
#define MOESPEC_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <string.h>
#include <ucontext.h>

#ifdef __cplusplus
#include <functional>
#include <map>
#include <vector>

#ifndef __CUDACC__
#define __CUDACC__ 1  // compile the device sections of the kernel headers
#endif
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __restrict__ __restrict

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 { unsigned x, y, z; };
struct int4 { int x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct float4 { float x, y, z, w; };

typedef int cudaError_t;
typedef void* cudaStream_t;
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNoDevice = 100, cudaErrorLaunchFailure = 719 };
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16, cudaDevAttrMaxSharedMemoryPerBlockOptin = 97 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
struct cudaDeviceProp { char name[256]; int major, minor; };

namespace emu {
constexpr int kOptinSmem = 232448;  // sm_90: 227 KiB per block with opt-in
constexpr int kSms = 2;             // few SMs, so that small test grids exercise every launch choice
constexpr size_t kStack = 256 * 1024;

struct Fiber {
  ucontext_t ctx;  // only to start the fiber on its stack
  jmp_buf jb;
  std::vector<char> stack;
  int wait = 0;  // 0 runnable, 1 at a warp sync, 2 at __syncthreads
  bool done = false;
};

struct State {
  std::vector<Fiber> fibers;
  std::vector<uint32_t> xch;  // one exchange word per thread (shuffles, ballot)
  std::vector<unsigned char> dyn;
  ucontext_t sched;
  jmp_buf sched_jb;
  int cur = 0;
  dim3 block_idx, block_dim, grid_dim;
  std::function<void()> body;
  int last_error = cudaSuccess;
  std::map<const void*, int> max_dyn;  // per kernel: raised dynamic shared-memory limit
};

inline State& st() {
  static State s;
  return s;
}

inline void yield_wait(int kind) {
  State& s = st();
  s.fibers[s.cur].wait = kind;
  if (!_setjmp(s.fibers[s.cur].jb)) _longjmp(s.sched_jb, 1);
}

inline void fiber_entry() {
  State& s = st();
  s.body();
  s.fibers[s.cur].done = true;
  _longjmp(s.sched_jb, 1);  // never returns: the scheduler continues
}

// Run fiber i until its next sync point or its end.
inline void resume(int i) {
  State& s = st();
  s.cur = i;
  if (_setjmp(s.sched_jb)) return;
  Fiber& f = s.fibers[i];
  if (f.wait == -1) {  // not started: enter on its own stack
    f.wait = 0;
    swapcontext(&s.sched, &f.ctx);
  } else {
    _longjmp(f.jb, 1);
  }
}

inline void run_block(int nthreads) {
  State& s = st();
  s.fibers.resize(nthreads);
  s.xch.assign(nthreads, 0);
  for (int i = 0; i < nthreads; ++i) {
    Fiber& f = s.fibers[i];
    f.wait = -1;  // not started
    f.done = false;
    if (f.stack.empty()) f.stack.resize(kStack);
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack.data();
    f.ctx.uc_stack.ss_size = f.stack.size();
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
  }
  const int nwarps = (nthreads + 31) / 32;
  for (;;) {
    bool progress = false;
    for (int i = 0; i < nthreads; ++i) {
      if (s.fibers[i].done || s.fibers[i].wait > 0) continue;
      resume(i);
      progress = true;
    }
    bool all_done = true, block_ready = true, any_block_wait = false;
    for (int w = 0; w < nwarps; ++w) {
      bool warp_ready = true, any = false;
      for (int i = 32 * w; i < 32 * w + 32 && i < nthreads; ++i) {
        const Fiber& f = s.fibers[i];
        if (!f.done && f.wait != 1) warp_ready = false;
        if (!f.done && f.wait == 1) any = true;
      }
      if (warp_ready && any) {
        for (int i = 32 * w; i < 32 * w + 32 && i < nthreads; ++i) s.fibers[i].wait = 0;
        progress = true;
      }
    }
    for (const Fiber& f : s.fibers) {
      if (!f.done) all_done = false;
      if (!f.done && f.wait != 2) block_ready = false;
      if (!f.done && f.wait == 2) any_block_wait = true;
    }
    if (all_done) return;
    if (block_ready && any_block_wait) {
      for (Fiber& f : s.fibers) f.wait = 0;
      progress = true;
    }
    if (!progress) {
      fprintf(stderr, "cuda emulation: deadlock in block (%u,%u): threads wait at different sync points\n",
              s.block_idx.x, s.block_idx.y);
      abort();
    }
  }
}

template <class Kern, class... Args>
void launch(Kern kern, dim3 grid, dim3 block, size_t smem, cudaStream_t, Args... args) {
  State& s = st();
  const int nthreads = (int)(block.x * block.y * block.z);
  auto it = s.max_dyn.find((const void*)kern);
  const size_t limit = it == s.max_dyn.end() ? 48 * 1024 : (size_t)it->second;
  if (smem > limit || nthreads < 1 || nthreads > 1024 || grid.y > 65535 || grid.z > 65535) {
    s.last_error = cudaErrorInvalidValue;  // what the runtime reports for such a launch
    return;
  }
  s.grid_dim = grid;
  s.block_dim = block;
  s.body = [&] { kern(args...); };
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        s.block_idx = dim3(x, y, z);
        s.dyn.assign(smem + 16, 0xCD);
        run_block(nthreads);
      }
}

inline uint3 thread_idx() {
  const State& s = st();
  return uint3{(unsigned)s.cur % s.block_dim.x, 0, 0};
}
inline unsigned lane() { return (unsigned)st().cur & 31u; }
inline int warp_base() { return st().cur & ~31; }
inline void* dyn_smem() { return st().dyn.data(); }

template <class T>
inline uint32_t to_word(T v) {
  static_assert(sizeof(T) == 4, "32-bit shuffles only");
  uint32_t u;
  memcpy(&u, &v, 4);
  return u;
}
template <class T>
inline T from_word(uint32_t u) {
  T v;
  memcpy(&v, &u, 4);
  return v;
}
template <class T>
inline T shfl_from(T v, int src_lane) {
  State& s = st();
  s.xch[s.cur] = to_word(v);
  yield_wait(1);
  const uint32_t r = s.xch[warp_base() + (src_lane & 31)];
  yield_wait(1);
  return from_word<T>(r);
}
}  // namespace emu

#define threadIdx (emu::thread_idx())
#define blockIdx (emu::st().block_idx)
#define blockDim (emu::st().block_dim)
#define gridDim (emu::st().grid_dim)

inline void __syncthreads() { emu::yield_wait(2); }
template <class T>
inline T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned u) { return emu::from_word<float>(u); }
inline unsigned __float_as_uint(float f) { return emu::to_word(f); }
inline float __int_as_float(int i) { return emu::from_word<float>((uint32_t)i); }
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline int __dp4a(int a, int b, int c) {
  for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
  return c;
}
inline int atomicAdd(int* p, int v) { const int old = *p; *p = old + v; return old; }  // fibers never preempt
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int off) { return emu::shfl_from(v, (int)emu::lane() ^ off); }
template <class T>
inline T __shfl_sync(unsigned, T v, int src) { return emu::shfl_from(v, src); }
template <class T>
inline T __shfl_up_sync(unsigned, T v, int off) {
  const int l = (int)emu::lane();
  const T r = emu::shfl_from(v, l >= off ? l - off : l);  // lanes below off keep their own value
  return r;
}
inline unsigned __ballot_sync(unsigned, bool pred) {
  emu::State& s = emu::st();
  s.xch[s.cur] = pred ? 1u : 0u;
  emu::yield_wait(1);
  unsigned mask = 0;
  const int base = emu::warp_base();
  for (int l = 0; l < 32 && base + l < (int)s.fibers.size(); ++l)
    if (!s.fibers[base + l].done && s.xch[base + l]) mask |= 1u << l;
  emu::yield_wait(1);
  return mask;
}

// ---- host API ------------------------------------------------------------------------------
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int* c) { *c = 1; return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  snprintf(p->name, sizeof(p->name), "CPU emulation (sm_90 limits)");
  p->major = 9;
  p->minor = 0;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  if (a == cudaDevAttrMaxSharedMemoryPerBlockOptin) *v = emu::kOptinSmem;
  else if (a == cudaDevAttrMultiProcessorCount) *v = emu::kSms;
  else return cudaErrorInvalidValue;
  return cudaSuccess;
}
template <class Kern>
inline cudaError_t cudaFuncSetAttribute(Kern kern, cudaFuncAttribute a, int v) {
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v > emu::kOptinSmem) return cudaErrorInvalidValue;
  emu::st().max_dyn[(const void*)kern] = v;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() {
  const int e = emu::st().last_error;
  emu::st().last_error = cudaSuccess;
  return e;
}
inline const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : (e == cudaErrorInvalidValue ? "invalid argument" : "emulated CUDA error");
}
inline cudaError_t cudaMalloc(void* p, size_t n) {
  *(void**)p = aligned_alloc(256, (n + 255) / 256 * 256);
  return *(void**)p ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaFree(void* p) { free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) { memcpy(d, s, n); return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
#endif  // __cplusplus

#endif  // MOESPEC_CUDA_EMU_RUNTIME_H
