// Activation staging: x and h = silu(g) * u converted into the layout of the weights' format
// before the dot kernels read them (f32 as is; bf16 rounded to nearest even; int8 quantized per
// block of 32 into the interleaved layout with scales and offset corrections), in 64-byte aligned
// buffers that only grow.
#pragma once

#include <new>
#include <vector>

#include "common.h"

namespace moespec {

// Scratch vectors on 64-byte (cache-line) boundaries: the micro-kernels load activations in whole
// vectors, and with malloc's 16-byte alignment a 64-byte load straddles two cache lines
// (docs/kernels.md, "Cache-line alignment").
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64))); }
  void deallocate(T* p, size_t) { ::operator delete(p, std::align_val_t(64)); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
  template <class U>
  bool operator!=(const CacheLineAllocator<U>&) const { return false; }
};
template <class T>
using AlignedVector = std::vector<T, CacheLineAllocator<T>>;

// v with room for at least size elements (scratch buffers only grow); its data.
template <class V>
static auto* grown(V& v, int64_t size) {
  if ((int64_t)v.size() < size) v.resize(size);
  return v.data();
}

// Activations of R rows of length K in the format's layout.
struct Acts {
  int fmt = F32;
  int64_t K = 0, qstride = 0, sstride = 0;
  AlignedVector<float> f;     // f32 values (f32: the values; bf16: the bf16-rounded values)
  AlignedVector<uint16_t> b;  // bf16 bits
  AlignedVector<int8_t> q;    // int8 interleaved (+64 bytes slack for full-vector loads)
  AlignedVector<float> s;     // int8 block scales, zero padded to a multiple of 16
  AlignedVector<int32_t> c;   // int8 offset corrections, zero padded
  std::vector<ActRef> refs;

  bool vec = false;            // the AVX-512 conversions (when the kernels run the AVX-512 path)

  // Room for R rows of length K. The buffers only grow (they live in a per-thread Workspace):
  // set_row writes every value a kernel reads, so nothing needs clearing here.
  void init(int fmt_, int64_t R, int64_t K_, bool vec_);
  // Convert one row of float values (the precision rules of docs/kernels.md).
  void set_row(int64_t r, const float* v);
};

// g[r] = silu(g[r]) * u[r] = g / (1 + e^-g) * u for r < K (phase 2 of the driver), on the AVX-512
// path when avx512.
void silu_mul(float* g, const float* u, int64_t K, bool avx512);

}  // namespace moespec
