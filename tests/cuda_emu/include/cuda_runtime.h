// A CPU emulation of the small part of CUDA that moespec's kernels use, for running the real
// kernel source on a machine without a GPU (tests/test_cuda_emulated.py).
//
// Every CUDA thread is a cooperative fiber (started with makecontext, switched with
// _setjmp/_longjmp, which skip the signal-mask system call of swapcontext; compile with
// -U_FORTIFY_SOURCE, whose longjmp check rejects a jump to another stack); a block's threads are
// interleaved by a scheduler that advances each fiber to its next synchronization point:
// __syncthreads() waits for every live thread of the block, warp primitives (shuffles, ballot)
// for the 32 lanes of the warp. A synchronization that cannot complete (e.g. __syncthreads in a
// divergent branch, a shuffle some lanes never reach) aborts with "deadlock", which on a GPU
// would be undefined behaviour. Shared memory: dynamic shared memory is per block and filled with
// 0xCD before each block, so that reads of unwritten bytes show up as wrong results; `__shared__`
// variables are `static` (shared by all blocks: correct only while one block runs at a time, so
// kernels launched with programmatic dependent launch keep all shared state in dynamic shared
// memory). Global memory is host memory. Launches check the dynamic shared-memory limit (48 KiB
// unless raised with cudaFuncSetAttribute, at most the opt-in limit of an sm_90 GPU) as the CUDA
// runtime does.
//
// What a GPU would do later is done later here, so that code relying on it too early fails:
// * cp.async (moespec_cuda::cp_async16 / cp_async4 / cp_async_commit / cp_async_wait): a copy
//   happens only when its thread waits for its group (cp.async.wait_group), never before; reading
//   the destination earlier sees the old bytes. Addresses must be aligned to the copy size.
// * Launches are deferred by one: a kernel runs when the next one is launched or at a
//   synchronizing call (cudaDeviceSynchronize, cudaMemcpy, cudaFree, moespec_emu_synchronize).
//   A kernel launched with programmatic stream serialization (cudaLaunchKernelEx, the PDL
//   attribute) runs *before* the kernel it depends on, each of its threads up to
//   griddepcontrol.wait (moespec_cuda::pdl_wait), where it parks; then the earlier kernel runs
//   to completion; then the parked threads continue. So a read of the earlier kernel's results
//   before pdl_wait sees stale memory, as it could on a GPU.
#ifndef MOESPEC_CUDA_EMU_RUNTIME_H
#define MOESPEC_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>

#ifdef __cplusplus
#include <functional>
#include <map>
#include <memory>
#include <vector>

#ifndef __CUDACC__
#define __CUDACC__ 1  // compile the device sections of the kernel headers
#endif
#define MOESPEC_CUDA_EMULATION 1  // async_copy.cuh takes its primitives from here
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
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };

typedef int cudaError_t;
typedef void* cudaStream_t;
namespace emu { struct Graph; struct Event; }
typedef emu::Graph* cudaGraph_t;
typedef emu::Graph* cudaGraphExec_t;
typedef emu::Event* cudaEvent_t;
enum { cudaStreamNonBlocking = 1 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1 };
enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNoDevice = 100, cudaErrorLaunchFailure = 719,
       cudaErrorStreamCaptureInvalidated = 901 };
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
struct cudaDeviceProp { char name[256]; int major, minor, multiProcessorCount, l2CacheSize; };
enum cudaLaunchAttributeID { cudaLaunchAttributeProgrammaticStreamSerialization = 5 };
union cudaLaunchAttributeValue { int programmaticStreamSerializationAllowed; char pad[64]; };
struct cudaLaunchAttribute { cudaLaunchAttributeID id; cudaLaunchAttributeValue val; };
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};

// The built-in variables: set by the scheduler whenever it switches to a thread.
inline uint3 threadIdx;
inline dim3 blockIdx, blockDim, gridDim;

namespace emu {
constexpr int kOptinSmem = 232448;   // sm_90: 227 KiB per block with opt-in
constexpr int kSmemPerSm = 233472;   // sm_90: 228 KiB per SM
constexpr size_t kStack = 128 * 1024;

struct Copy {
  void* dst;
  const void* src;
  size_t n;
};

struct Fiber {
  ucontext_t ctx;  // only to start the fiber on its stack
  jmp_buf jb;
  char* stack = nullptr;
  int wait = 0;  // -1 not started, 0 runnable, 1 at a warp sync, 2 at __syncthreads, 3 parked at pdl_wait
  bool done = false;
  std::vector<Copy> copies;   // cp.async issued and not yet completed, in issue order
  std::vector<size_t> groups; // end index (into copies) of each committed, uncompleted group
};

struct Block {
  dim3 idx;
  std::vector<Fiber> fibers;
  std::vector<uint32_t> xch;  // one exchange word per thread (shuffles, ballot)
  std::vector<unsigned char> dyn;
};

struct Launch {
  std::function<void()> body;
  dim3 grid, block;
  size_t smem = 0;
  bool pdl = false;
};

// A captured sequence of launches (stream capture), replayed by cudaGraphLaunch.
struct Graph {
  std::vector<Launch> launches;
};
struct Event {
  double ms = 0;
};

struct State {
  Graph* capturing = nullptr;  // between cudaStreamBeginCapture and cudaStreamEndCapture
  Block* blk = nullptr;
  int cur = 0;
  const Launch* launch = nullptr;
  bool pdl_released = true;  // pdl_wait returns at once (no earlier kernel still to run)
  ucontext_t sched;
  jmp_buf sched_jb;
  int last_error = cudaSuccess;
  std::map<const void*, int> max_dyn;  // per kernel: raised dynamic shared-memory limit
  std::unique_ptr<Launch> pending;     // launched, not yet run
  std::vector<char*> stacks;           // free fiber stacks
  int cc_major = 9, cc_minor = 0, sms = 2;  // few SMs, so that small test grids exercise every launch choice
};

inline State& st() {
  static State s;
  return s;
}

inline Fiber& fiber() { return st().blk->fibers[st().cur]; }

inline char* take_stack() {
  State& s = st();
  if (!s.stacks.empty()) {
    char* p = s.stacks.back();
    s.stacks.pop_back();
    return p;
  }
  void* p = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "cuda emulation: cannot map a fiber stack\n");
    abort();
  }
  return static_cast<char*>(p);
}

inline void yield_wait(int kind) {
  State& s = st();
  fiber().wait = kind;
  if (!_setjmp(fiber().jb)) _longjmp(s.sched_jb, 1);
}

inline void fiber_entry() {
  State& s = st();
  s.launch->body();
  fiber().done = true;
  _longjmp(s.sched_jb, 1);  // never returns: the scheduler continues
}

// Run fiber i of block b until its next sync point or its end.
inline void resume(Block& b, int i) {
  State& s = st();
  s.blk = &b;
  s.cur = i;
  threadIdx = uint3{(unsigned)i % s.launch->block.x, 0, 0};
  blockIdx = b.idx;
  blockDim = s.launch->block;
  gridDim = s.launch->grid;
  if (_setjmp(s.sched_jb)) return;
  Fiber& f = b.fibers[i];
  if (f.wait == -1) {  // not started: enter on its own stack
    f.wait = 0;
    swapcontext(&s.sched, &f.ctx);
  } else {
    _longjmp(f.jb, 1);
  }
}

inline void start_block(Block& b, const Launch& L, dim3 idx) {
  const int nthreads = (int)(L.block.x * L.block.y * L.block.z);
  b.idx = idx;
  b.fibers.resize(nthreads);
  b.xch.assign(nthreads, 0);
  b.dyn.assign(L.smem + 16, 0xCD);
  for (Fiber& f : b.fibers) {
    f.wait = -1;  // not started
    f.done = false;
    f.stack = take_stack();
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = f.stack;
    f.ctx.uc_stack.ss_size = kStack;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
  }
}

inline void end_block(Block& b) {
  for (Fiber& f : b.fibers) {
    st().stacks.push_back(f.stack);
    f.stack = nullptr;
    f.copies.clear();
    f.groups.clear();
  }
}

// Advance block b. Returns true when every thread has finished, false when the block is
// suspended: its live threads parked at pdl_wait (or at a barrier behind a parked one) while
// the kernel it depends on has not run yet.
inline bool run_block(Block& b) {
  State& s = st();
  const int nthreads = (int)b.fibers.size(), nwarps = (nthreads + 31) / 32;
  for (;;) {
    bool progress = false;
    for (int i = 0; i < nthreads; ++i) {
      if (b.fibers[i].done || b.fibers[i].wait > 0) continue;
      resume(b, i);
      progress = true;
    }
    for (int w = 0; w < nwarps; ++w) {
      bool warp_ready = true, any = false;
      for (int i = 32 * w; i < 32 * w + 32 && i < nthreads; ++i) {
        const Fiber& f = b.fibers[i];
        if (!f.done && f.wait != 1) warp_ready = false;
        if (!f.done && f.wait == 1) any = true;
      }
      if (warp_ready && any) {
        for (int i = 32 * w; i < 32 * w + 32 && i < nthreads; ++i) b.fibers[i].wait = 0;
        progress = true;
      }
    }
    bool all_done = true, block_ready = true, any_block_wait = false, any_parked = false;
    for (const Fiber& f : b.fibers) {
      if (!f.done) all_done = false;
      if (!f.done && f.wait != 2) block_ready = false;
      if (!f.done && f.wait == 2) any_block_wait = true;
      if (!f.done && f.wait == 3) any_parked = true;
    }
    if (all_done) return true;
    if (block_ready && any_block_wait) {
      for (Fiber& f : b.fibers) f.wait = 0;
      progress = true;
    }
    if (!progress) {
      if (any_parked && !s.pdl_released) return false;
      fprintf(stderr, "cuda emulation: deadlock in block (%u,%u): threads wait at different sync points\n",
              b.idx.x, b.idx.y);
      abort();
    }
  }
}

inline void run_launch(const Launch& L) {
  State& s = st();
  s.launch = &L;
  Block b;
  for (unsigned z = 0; z < L.grid.z; ++z)
    for (unsigned y = 0; y < L.grid.y; ++y)
      for (unsigned x = 0; x < L.grid.x; ++x) {
        start_block(b, L, dim3(x, y, z));
        if (!run_block(b)) abort();  // cannot happen: pdl_wait does not park while released
        end_block(b);
      }
}

inline void flush() {
  State& s = st();
  if (!s.pending) return;
  std::unique_ptr<Launch> L = std::move(s.pending);
  run_launch(*L);
}

// A dependent (PDL) launch: its threads run up to pdl_wait first, then the pending kernel,
// then the rest of it.
inline void run_dependent(const Launch& L) {
  State& s = st();
  std::unique_ptr<Launch> primary = std::move(s.pending);
  std::vector<std::unique_ptr<Block>> blocks;
  s.pdl_released = false;
  s.launch = &L;
  for (unsigned z = 0; z < L.grid.z; ++z)
    for (unsigned y = 0; y < L.grid.y; ++y)
      for (unsigned x = 0; x < L.grid.x; ++x) {
        std::unique_ptr<Block> b(new Block);
        start_block(*b, L, dim3(x, y, z));
        if (run_block(*b)) end_block(*b);
        else blocks.push_back(std::move(b));
      }
  s.pdl_released = true;
  run_launch(*primary);
  s.launch = &L;
  for (auto& b : blocks) {
    for (Fiber& f : b->fibers)
      if (f.wait == 3) f.wait = 0;
    run_block(*b);
    end_block(*b);
  }
}

inline void enqueue(std::unique_ptr<Launch> L) {
  State& s = st();
  if (s.capturing) {  // stream capture: recorded, not run
    s.capturing->launches.push_back(*L);
    return;
  }
  if (L->pdl && s.pending) {
    run_dependent(*L);
    return;
  }
  flush();
  s.pending = std::move(L);
}

inline bool check_launch(const void* kern, dim3 grid, dim3 block, size_t smem) {
  State& s = st();
  const int nthreads = (int)(block.x * block.y * block.z);
  auto it = s.max_dyn.find(kern);
  const size_t limit = it == s.max_dyn.end() ? 48 * 1024 : (size_t)it->second;
  if (smem > limit || nthreads < 1 || nthreads > 1024 || grid.x < 1 || grid.y > 65535 || grid.z > 65535) {
    s.last_error = cudaErrorInvalidValue;  // what the runtime reports for such a launch
    return false;
  }
  return true;
}

template <class Kern, class... Args>
void launch(Kern kern, dim3 grid, dim3 block, size_t smem, cudaStream_t, Args... args) {
  if (!check_launch((const void*)kern, grid, block, smem)) return;
  std::unique_ptr<Launch> L(new Launch);
  L->body = [=] { kern(args...); };
  L->grid = grid;
  L->block = block;
  L->smem = smem;
  enqueue(std::move(L));
}

inline unsigned lane() { return (unsigned)st().cur & 31u; }
inline int warp_base() { return st().cur & ~31; }
inline void* dyn_smem() { return st().blk->dyn.data(); }

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
  s.blk->xch[s.cur] = to_word(v);
  yield_wait(1);
  const uint32_t r = s.blk->xch[warp_base() + (src_lane & 31)];
  yield_wait(1);
  return from_word<T>(r);
}

// ---- asynchronous copies (cp.async) and programmatic dependent launch ------------------------
inline void cp_async(void* dst, const void* src, size_t n) {
  if (((uintptr_t)dst | (uintptr_t)src) % n) {
    fprintf(stderr, "cuda emulation: cp.async of %zu bytes from a misaligned address (%p -> %p)\n", n, src, dst);
    abort();
  }
  fiber().copies.push_back(Copy{dst, src, n});
}
inline void cp_async_commit() { fiber().groups.push_back(fiber().copies.size()); }
// Complete every committed group except the newest `newest` ones.
inline void cp_async_wait(int newest) {
  Fiber& f = fiber();
  const int G = (int)f.groups.size();
  if (G <= newest) return;
  const size_t upto = f.groups[G - newest - 1];
  for (size_t i = 0; i < upto; ++i) memcpy(f.copies[i].dst, f.copies[i].src, f.copies[i].n);
  f.copies.erase(f.copies.begin(), f.copies.begin() + upto);
  f.groups.erase(f.groups.begin(), f.groups.begin() + (G - newest));
  for (size_t& g : f.groups) g -= upto;
}
inline void pdl_wait() {
  if (!st().pdl_released) yield_wait(3);
}
}  // namespace emu


inline void __syncthreads() { emu::yield_wait(2); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::yield_wait(1); }
template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
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
  s.blk->xch[s.cur] = pred ? 1u : 0u;
  emu::yield_wait(1);
  unsigned mask = 0;
  const int base = emu::warp_base();
  for (int l = 0; l < 32 && base + l < (int)s.blk->fibers.size(); ++l)
    if (!s.blk->fibers[base + l].done && s.blk->xch[base + l]) mask |= 1u << l;
  emu::yield_wait(1);
  return mask;
}

// ---- host API ------------------------------------------------------------------------------
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaGetDeviceCount(int* c) { *c = 1; return cudaSuccess; }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int) {
  snprintf(p->name, sizeof(p->name), "CPU emulation (sm_%d%d limits)", emu::st().cc_major, emu::st().cc_minor);
  p->major = emu::st().cc_major;
  p->minor = emu::st().cc_minor;
  p->multiProcessorCount = emu::st().sms;
  p->l2CacheSize = 1 << 20;
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr a, int) {
  switch (a) {
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = emu::kOptinSmem; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *v = emu::kSmemPerSm; break;
    case cudaDevAttrMultiProcessorCount: *v = emu::st().sms; break;
    case cudaDevAttrComputeCapabilityMajor: *v = emu::st().cc_major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = emu::st().cc_minor; break;
    default: return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}
template <class Kern>
inline cudaError_t cudaFuncSetAttribute(Kern kern, cudaFuncAttribute a, int v) {
  if (a != cudaFuncAttributeMaxDynamicSharedMemorySize || v > emu::kOptinSmem) return cudaErrorInvalidValue;
  emu::st().max_dyn[(const void*)kern] = v;
  return cudaSuccess;
}
template <class... Exp, class... Act>
inline cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* cfg, void (*kern)(Exp...), Act&&... args) {
  if (!emu::check_launch((const void*)kern, cfg->gridDim, cfg->blockDim, cfg->dynamicSmemBytes)) {
    const int e = emu::st().last_error;
    emu::st().last_error = cudaSuccess;
    return e;
  }
  std::unique_ptr<emu::Launch> L(new emu::Launch);
  L->body = [=] { kern(args...); };
  L->grid = cfg->gridDim;
  L->block = cfg->blockDim;
  L->smem = cfg->dynamicSmemBytes;
  for (unsigned i = 0; i < cfg->numAttrs; ++i)
    if (cfg->attrs[i].id == cudaLaunchAttributeProgrammaticStreamSerialization &&
        cfg->attrs[i].val.programmaticStreamSerializationAllowed)
      L->pdl = true;
  emu::enqueue(std::move(L));
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
  const size_t bytes = (n + 255) / 256 * 256;
  *(void**)p = aligned_alloc(256, bytes);
  if (*(void**)p) memset(*(void**)p, 0xCD, bytes);  // like a GPU allocation: no zeros to rely on
  return *(void**)p ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaFree(void* p) { emu::flush(); free(p); return cudaSuccess; }
inline cudaError_t cudaMemcpy(void* d, const void* s, size_t n, cudaMemcpyKind) {
  emu::flush();
  memcpy(d, s, n);
  return cudaSuccess;
}
inline cudaError_t cudaMemset(void* d, int v, size_t n) {
  emu::flush();
  memset(d, v, n);
  return cudaSuccess;
}
inline cudaError_t cudaDeviceSynchronize() { emu::flush(); return cudaSuccess; }

// Streams: one in-order queue (every stream is the same one here).
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned) { *s = (void*)1; return cudaSuccess; }
inline cudaError_t cudaStreamDestroy(cudaStream_t) { emu::flush(); return cudaSuccess; }
inline cudaError_t cudaStreamSynchronize(cudaStream_t) { emu::flush(); return cudaSuccess; }

// Events: the host's wall clock when the stream reaches them (the emulation has no GPU time).
inline cudaError_t cudaEventCreate(cudaEvent_t* e) { *e = new emu::Event; return cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t e) { delete e; return cudaSuccess; }
inline cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t = nullptr) {
  if (emu::st().capturing) return cudaErrorStreamCaptureInvalidated;
  emu::flush();
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  e->ms = ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
  return cudaSuccess;
}
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { emu::flush(); return cudaSuccess; }
inline cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  *ms = (float)(b->ms - a->ms);
  return cudaSuccess;
}

// Stream capture and graphs: captured launches are replayed in order, with their attributes
// (a programmatic dependent launch stays one).
inline cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  emu::flush();
  if (emu::st().capturing) return cudaErrorInvalidValue;
  emu::st().capturing = new emu::Graph;
  return cudaSuccess;
}
inline cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* g) {
  *g = emu::st().capturing;
  emu::st().capturing = nullptr;
  return *g ? cudaSuccess : cudaErrorInvalidValue;
}
inline cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t g, unsigned long long = 0) {
  *exec = new emu::Graph(*g);
  return cudaSuccess;
}
inline cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }
inline cudaError_t cudaGraphExecDestroy(cudaGraphExec_t g) { delete g; return cudaSuccess; }
inline cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t) {
  for (const emu::Launch& L : g->launches) emu::enqueue(std::unique_ptr<emu::Launch>(new emu::Launch(L)));
  return cudaSuccess;
}

// clock64: a counter that runs fast, so that spin kernels end at once.
inline long long clock64() {
  static long long c = 0;
  return c += 1 << 20;
}
#endif  // __cplusplus

#endif  // MOESPEC_CUDA_EMU_RUNTIME_H
